// --gradient_checkpointing through the Trainer: GPT-2 trained with its blocks recomputed logs
// the losses and ends at the weights of the plain run; a model without wrappers is refused.
#include <doctest/doctest.h>

#include <loom/models/gpt2.hpp>

#include "../trainer_support.hpp"

#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_gradient_checkpointing {

namespace {

struct GptTrainer : loom::Trainer<GptTrainer, loom::models::GPT2LMHeadModel> {
  using Trainer::Trainer;
};

struct GptRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> weights;
};

// A tiny GPT-2 (dropout 0.1 on, as HF's default), from seed 21.
loom::models::GPT2LMHeadModel tiny_gpt2() {
  loom::models::GPT2Config c;
  c.vocab_size = 48;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = 2;
  c.n_head = 4;
  torch::manual_seed(21);
  return loom::models::GPT2LMHeadModel(c);
}

// Four optimizer steps (two micro-batches each) on fixed random tokens.
GptRun train_gpt2(const std::string& name, bool recompute) {
  auto model = tiny_gpt2();
  const auto c = model->config();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto ids = torch::randint(c.vocab_size, {32, 12}, gen);
  loom::data::TensorDataset<loom::data::CausalLMBatch> data({ids, ids});
  auto args = loom_test::accumulation_args(name, 4, 2, 1e-3);
  args.max_steps = 4;
  args.gradient_checkpointing = recompute;
  GptTrainer trainer(args, model, data);
  trainer.train();
  GptRun run;
  for (const auto& e : trainer.state().log_history)
    if (e.contains("loss")) run.losses.push_back(e.at("loss").get<double>());
  run.weights = loom_test::weights(trainer.model());
  return run;
}

}  // namespace

TEST_CASE("--gradient_checkpointing: GPT-2 trains to the same losses and weights as without") {
  const auto plain = train_gpt2("gc_plain", false);
  const auto recomputed = train_gpt2("gc_recomputed", true);
  REQUIRE(plain.losses.size() == 4);
  REQUIRE(recomputed.losses.size() == plain.losses.size());
  for (std::size_t i = 0; i < plain.losses.size(); ++i) CHECK(std::abs(plain.losses[i] - recomputed.losses[i]) <= 1e-6);
  REQUIRE(plain.weights.size() == recomputed.weights.size());
  double worst = 0;
  for (std::size_t i = 0; i < plain.weights.size(); ++i)
    worst = std::max(worst, (plain.weights[i] - recomputed.weights[i]).abs().max().item<double>());
  CHECK(worst <= 1e-6);
  // Training moved the weights (so the equality is not that of two untouched models).
  auto initial = tiny_gpt2();
  CHECK((loom_test::weights(initial)[0] - plain.weights[0]).abs().max().item<double>() > 1e-4);
}

TEST_CASE("--gradient_checkpointing on a model without FullShardUnit or Checkpointed blocks is a loom: error") {
  auto args = loom_test::quiet_args("gc_no_units");
  args.gradient_checkpointing = true;
  CHECK(loom_test::error_of([&] { loom_test::Classifier<> t(args, loom_test::fresh_model(), loom_test::linear_data(16, 1)); }) ==
        "loom: --gradient_checkpointing needs blocks wrapped in loom::FullShardUnit or loom::Checkpointed");
}

TEST_CASE("--gradient_checkpointing_kwargs takes a JSON object with use_reentrant only") {
  auto with = [](const std::string& kwargs) {
    auto args = loom_test::quiet_args("gc_kwargs");
    args.gradient_checkpointing_kwargs = kwargs;
    return loom_test::error_of([&] { loom::validate(args); });
  };
  CHECK(with(R"({"use_reentrant": false})") == "<no loom::Error>");
  CHECK(with(R"({"use_reentrant": true})") == "<no loom::Error>");
  CHECK(with(R"({"preserve_rng_state": false})") ==
        "loom: --gradient_checkpointing_kwargs: 'preserve_rng_state' is not supported (loom takes use_reentrant only)");
  CHECK(with(R"({"use_reentrant": 1})") == "loom: --gradient_checkpointing_kwargs: use_reentrant must be true or false, got 1");
  CHECK(with("use_reentrant").find("must be a JSON object") != std::string::npos);
}

}  // namespace trainer_test_gradient_checkpointing
