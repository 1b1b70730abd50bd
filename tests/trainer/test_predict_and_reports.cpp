// predict() with test_ metrics, memory and FLOP reports, the token-count normalization of
// gradient accumulation with padded sequences, and more event orders.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <filesystem>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_predict_and_reports {

namespace fs = std::filesystem;

namespace {

using loom_test::Batch;
using loom_test::quiet_args;

// 4 features; the label is the argmax of the first three.
loom::data::TensorDataset<Batch> make_data(int64_t n, uint64_t seed) { return loom_test::argmax_data(n, seed, 4); }

struct Events {
  std::vector<std::string>* out = nullptr;
  void on_predict(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&, const loom::Metrics& m) {
    out->push_back("predict:" + std::to_string(m.size()));
  }
  void on_prediction_step(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    out->push_back("prediction_step");
  }
  void on_log(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("log"); }
  void on_save(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&) {
    out->push_back("save:" + std::to_string(s.global_step));
  }
  void on_evaluate(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("evaluate"); }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&) {
    out->push_back("step:" + std::to_string(s.global_step));
  }
  void on_epoch_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("epoch_end"); }
};

struct Classifier : loom::Trainer<Classifier, torch::nn::Linear, loom::Callbacks<Events>> {
  using Trainer::Trainer;
  loom::ModelOutput compute_loss(torch::nn::Linear& model, Batch& b) { return loom_test::cross_entropy(model, b); }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return loom_test::accuracy(p); }
  double floating_point_ops(const Batch& b) { return 6.0 * 15 * static_cast<double>(b.x.size(0)); }  // 6 * params * rows
};

// Token model: each position predicts its label from its own embedding.
struct Tokens {
  torch::Tensor ids, labels;
};
struct TokenModelImpl : torch::nn::Module {
  TokenModelImpl()
      : emb(register_module("emb", torch::nn::Embedding(11, 8))), head(register_module("head", torch::nn::Linear(8, 11))) {}
  torch::Tensor forward(const torch::Tensor& ids) { return head->forward(torch::tanh(emb->forward(ids))); }
  torch::nn::Embedding emb;
  torch::nn::Linear head;
};
TORCH_MODULE(TokenModel);

struct TokenTrainer : loom::Trainer<TokenTrainer, TokenModel> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(TokenModel& m, Tokens& b) {
    auto logits = m->forward(b.ids);  // [B, T, V]
    return torch::nn::functional::cross_entropy(logits.flatten(0, 1), b.labels.flatten(),
                                                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  }
  int64_t num_items(const Tokens& b) { return b.labels.ne(-100).sum().item<int64_t>(); }
};

loom::data::TensorDataset<Tokens> padded_tokens(int64_t n, int64_t t) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  auto ids = torch::randint(1, 11, {n, t}, gen);
  auto labels = (ids * 3 + 1) % 11;
  // Sequence i keeps 1 + (i * 7 % t) real tokens; the rest is padding (-100): micro-batches
  // of the same accumulation group hold very different numbers of real tokens.
  auto pos = torch::arange(t).unsqueeze(0).expand({n, t});
  auto len = (torch::arange(n) * 7 % t + 1).unsqueeze(1);
  labels = torch::where(pos < len, labels, torch::full_like(labels, -100));
  return loom::data::TensorDataset<Tokens>({ids, labels});
}

}  // namespace

TEST_CASE("predict returns predictions, label ids and test_ metrics, and fires on_predict") {
  std::vector<std::string> events;
  auto args = quiet_args("predict");
  args.per_device_eval_batch_size = 16;  // 40 rows: 16, 16, 8
  Classifier t(args, torch::nn::Linear(4, 3), make_data(32, 1));
  t.callback<Events>().out = &events;
  auto test = make_data(40, 2);
  auto r = t.predict(test);
  CHECK(r.predictions.sizes() == torch::IntArrayRef{40, 3});
  CHECK(torch::equal(r.label_ids, test.tensors().labels));
  torch::NoGradGuard g;
  auto logits = t.model()->forward(test.tensors().x);
  CHECK(torch::allclose(r.predictions, logits));
  CHECK(r.metrics.get("test_loss").value() ==
        doctest::Approx(torch::cross_entropy_loss(logits, test.tensors().labels).item<double>()).epsilon(1e-6));
  CHECK(r.metrics.contains("test_accuracy"));
  CHECK(r.metrics.contains("test_runtime"));
  CHECK(r.metrics.contains("test_samples_per_second"));
  CHECK(events == std::vector<std::string>{"prediction_step", "prediction_step", "prediction_step",
                                           "predict:" + std::to_string(r.metrics.size())});
  CHECK(t.state().log_history.empty());  // predict does not log

  // prediction_loss_only: loss, no predictions or metrics from compute_metrics.
  args.prediction_loss_only = true;
  Classifier lo(args, torch::nn::Linear(4, 3), make_data(32, 1));
  lo.callback<Events>().out = &events;
  auto r2 = lo.predict(make_data(40, 2));
  CHECK_FALSE(r2.predictions.defined());
  CHECK(r2.metrics.contains("test_loss"));
  CHECK_FALSE(r2.metrics.contains("test_accuracy"));

  // eval_accumulation_steps moves predictions to the host in chunks: same result.
  args.prediction_loss_only = false;
  args.eval_accumulation_steps = 1;
  Classifier chunked(args, torch::nn::Linear(4, 3), make_data(32, 1));
  chunked.callback<Events>().out = &events;
  {
    torch::NoGradGuard ng;
    chunked.model()->weight.copy_(t.model()->weight);
    chunked.model()->bias.copy_(t.model()->bias);
  }
  auto r3 = chunked.predict(make_data(40, 2));
  CHECK(torch::equal(r3.predictions, r.predictions));
}

TEST_CASE("memory metrics (skip_memory_metrics false) and total_flos from the hook") {
  std::vector<std::string> events;
  auto args = quiet_args("memory");
  args.skip_memory_metrics = false;
  args.max_steps = 5;
  args.per_device_train_batch_size = 8;
  args.logging_steps = 5;
  Classifier t(args, torch::nn::Linear(4, 3), make_data(64, 3));
  t.callback<Events>().out = &events;
  auto out = t.train();
  CHECK(out.metrics.contains("train_mem_cpu_alloc_delta"));
  CHECK(out.metrics.contains("train_mem_cpu_peaked_delta"));
  CHECK(out.metrics.get("train_mem_cpu_peaked_delta").value() >= 0);
  // 5 steps of 8 rows: 6 * 15 parameters * 40 rows.
  CHECK(out.metrics.get("total_flos").value() == doctest::Approx(6.0 * 15 * 40));
  CHECK(t.state().total_flos == doctest::Approx(6.0 * 15 * 40));
  auto r = t.predict(make_data(16, 4));
  CHECK(r.metrics.contains("test_mem_cpu_alloc_delta"));
  // A big allocation inside a tracked stage shows up in the CPU numbers.
  loom::MemoryTracker m("probe", true, torch::Device(torch::kCPU));
  {
    auto big = torch::ones({64, 1024, 1024});  // 256 MiB, touched, then freed
    CHECK(big.sum().item<double>() > 0);
  }
  loom::Metrics probe;
  m.stop(probe);
  CHECK(probe.get("probe_mem_cpu_peaked_delta").value() > 200.0 * 1024 * 1024);
}

TEST_CASE("gradient accumulation with a padded token loss equals one large batch") {
  auto run = [](int64_t batch, int64_t accumulation, const std::string& name) {
    torch::manual_seed(4);
    TokenTrainer t(loom_test::accumulation_args(name, batch, accumulation, 0.05), TokenModel{}, padded_tokens(96, 12));
    t.train();
    const auto w = loom_test::weights(t.model());
    std::vector<double> losses;
    for (const auto& e : t.state().log_history)
      if (e.contains("loss")) losses.push_back(e["loss"].get<double>());
    return std::pair{w, losses};
  };
  {
    auto args = quiet_args("tok_rate");
    args.per_device_train_batch_size = 32;
    args.max_steps = 3;
    args.include_tokens_per_second = true;
    TokenTrainer t(args, TokenModel{}, padded_tokens(96, 12));
    auto out = t.train();
    const double tokens = padded_tokens(96, 12).tensors().labels.ne(-100).sum().item<double>();  // 3 steps = all 96 rows
    REQUIRE(out.metrics.contains("train_tokens_per_second"));
    CHECK(out.metrics.get("train_tokens_per_second").value() ==
          doctest::Approx(tokens / out.metrics.get("train_runtime").value()).epsilon(0.05));
  }
  auto [big, big_losses] = run(32, 1, "tok_big");
  auto [small, small_losses] = run(8, 4, "tok_small");
  for (std::size_t i = 0; i < big.size(); ++i) CHECK(torch::allclose(big[i], small[i], 1e-6, 1e-7));
  REQUIRE(big_losses.size() == small_losses.size());
  for (std::size_t i = 0; i < big_losses.size(); ++i) CHECK(big_losses[i] == doctest::Approx(small_losses[i]).epsilon(1e-6));
  // Counting micro-batches instead of tokens would not match: check the data makes it matter.
  auto d = padded_tokens(32, 12).tensors().labels.ne(-100).sum(1).view({4, 8}).sum(1);
  CHECK(d.max().item<int64_t>() != d.min().item<int64_t>());
}

TEST_CASE("event order: epochs with logging_first_step, epoch evaluation and saving") {
  std::vector<std::string> events;
  auto args = quiet_args("events_epoch");
  args.num_train_epochs = 2;
  args.per_device_train_batch_size = 8;  // 16 rows: 2 steps per epoch
  args.logging_first_step = true;
  args.logging_strategy = "epoch";
  args.eval_strategy = "epoch";
  args.save_strategy = "epoch";
  Classifier t(args, torch::nn::Linear(4, 3), make_data(16, 5), make_data(8, 6));
  t.callback<Events>().out = &events;
  t.train();
  const std::vector<std::string> expected{
      "step:1", "log",                                                  // logging_first_step
      "step:2", "epoch_end", "log", "prediction_step", "log", "evaluate", "save:2",  // log, eval, save
      "step:3", "step:4", "epoch_end", "log", "prediction_step", "log", "evaluate", "save:4",
      "log"};                                                           // train metrics
  CHECK(events == expected);
  CHECK(fs::exists(fs::path(args.output_dir) / "checkpoint-2"));
  CHECK(fs::exists(fs::path(args.output_dir) / "checkpoint-4"));
}

}  // namespace trainer_test_predict_and_reports
