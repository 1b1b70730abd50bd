// NEFTune (--neftune_noise_alpha), --auto_find_batch_size and --run_name (issue 11).

#include <loom/loom.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"
#include "token_support.hpp"

#include <c10/util/Exception.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_neftune_batch_size {

namespace fs = std::filesystem;

namespace {

using loom_test::quiet_args;
using loom_test::TokenBatch;

// The recipes' token tagger with NEFTune on its embeddings: what a user's model adds to take part.
struct NoisyTaggerImpl : torch::nn::Module {
  NoisyTaggerImpl()
      : emb(register_module("emb", torch::nn::Embedding(11, 16))), head(register_module("head", torch::nn::Linear(16, 11))) {}
  loom::NEFTune& neftune() { return noise; }
  loom::ModelOutput forward(const TokenBatch& b) {
    const auto hidden = torch::tanh(noise(emb->forward(b.input_ids), is_training()));
    const auto logits = head->forward(hidden);
    const auto loss = torch::nn::functional::cross_entropy(
        logits.flatten(0, 1), b.labels.flatten(), torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    return {loss, logits};
  }
  torch::nn::Embedding emb;
  torch::nn::Linear head;
  loom::NEFTune noise;
};
TORCH_MODULE(NoisyTagger);

NoisyTagger fresh_noisy() {
  torch::manual_seed(5);
  return NoisyTagger();
}

loom::TrainingArguments neftune_args(const std::string& name, std::optional<double> alpha) {
  auto a = quiet_args(name);
  a.per_device_train_batch_size = 4;
  a.max_steps = 6;
  a.logging_steps = 1;
  a.learning_rate = 1e-2;
  a.neftune_noise_alpha = alpha;
  return a;
}

std::vector<double> losses_of(const loom::TrainerState& state, const char* key = "loss") {
  std::vector<double> out;
  for (const auto& entry : state.log_history)
    if (entry.contains(key)) out.push_back(entry.at(key).get<double>());
  return out;
}

}  // namespace

TEST_CASE("NEFTune adds HF's uniform noise, alpha / sqrt(seq x dim) at most, in training mode only") {
  const loom::NEFTune off;
  const auto embeds = torch::randn({64, 32, 16});
  CHECK(off(embeds, true).is_same(embeds));
  const loom::NEFTune on{.noise_alpha = 5.0};
  CHECK(on(embeds, false).is_same(embeds));
  const auto noise = on(embeds, true) - embeds;
  const double bound = 5.0 / std::sqrt(32.0 * 16.0);
  const double largest = noise.abs().max().item<double>();
  CHECK(largest <= bound * (1 + 1e-6));
  CHECK(largest > bound * 0.99);                                        // 32768 draws reach the edge
  CHECK(std::abs(noise.mean().item<double>()) < bound * 0.02);          // centred
  CHECK(noise.abs().mean().item<double>() == doctest::Approx(bound / 2).epsilon(0.02));  // uniform
  CHECK_FALSE(torch::equal(on(embeds, true), on(embeds, true)));        // fresh noise each call
  // Gradients flow to the embeddings as without the noise.
  auto leaf = torch::ones({2, 3, 4}, torch::requires_grad());
  on(leaf, true).sum().backward();
  CHECK(torch::equal(leaf.grad(), torch::ones({2, 3, 4})));
  CHECK_THROWS_WITH_AS(on(torch::ones({3, 4}), true),
                       doctest::Contains("loom: NEFTune adds noise to embeddings of shape [batch, seq, dim]"), loom::Error);
}

TEST_CASE("GPT-2 and BERT expose NEFTune on their word embeddings; noise changes training forwards only") {
  static_assert(loom::ExposesNEFTune<loom::models::GPT2LMHeadModel>);
  static_assert(loom::ExposesNEFTune<loom::models::BertForSequenceClassification>);
  static_assert(!loom::ExposesNEFTune<torch::nn::Linear>);
  torch::manual_seed(1);
  loom::models::GPT2Config gc;
  gc.vocab_size = 32;
  gc.n_positions = 16;
  gc.n_embd = 8;
  gc.n_layer = 1;
  gc.n_head = 2;
  gc.resid_pdrop = gc.embd_pdrop = gc.attn_pdrop = 0;
  loom::models::GPT2LMHeadModel gpt(gc);
  loom::models::BertConfig bc;
  bc.vocab_size = 32;
  bc.hidden_size = 8;
  bc.num_hidden_layers = 1;
  bc.num_attention_heads = 2;
  bc.intermediate_size = 16;
  bc.hidden_dropout_prob = 0;
  bc.attention_probs_dropout_prob = 0;
  bc.max_position_embeddings = 16;
  loom::models::BertForSequenceClassification bert(bc);
  const auto ids = torch::randint(32, {2, 10});
  auto forwards = [&] { return std::vector<torch::Tensor>{gpt->logits(ids), bert->logits(ids)}; };
  gpt->train();
  bert->train();
  const auto clean = forwards();
  gpt->neftune().noise_alpha = 5;
  bert->neftune().noise_alpha = 5;
  const auto noisy = forwards();
  gpt->eval();
  bert->eval();
  const auto evaluated = forwards();
  for (std::size_t i = 0; i < clean.size(); ++i) {
    CAPTURE(i);
    CHECK_FALSE(torch::allclose(noisy[i], clean[i]));
    CHECK(torch::equal(evaluated[i], clean[i]));
  }
}

TEST_CASE("neftune_noise_alpha: noise while train() runs, none in evaluation or afterwards; a model without it is an error") {
  using T = loom::Trainer<void, NoisyTagger>;
  const loom_test::RaggedTokens data(48, 3), eval(16, 4);
  T plain(neftune_args("neftune/plain", std::nullopt), fresh_noisy(), data, eval);
  plain.train();
  T noisy(neftune_args("neftune/noisy", 5.0), fresh_noisy(), data, eval);
  noisy.train();
  T again(neftune_args("neftune/again", 5.0), fresh_noisy(), data, eval);
  again.train();
  CHECK(losses_of(noisy.state()) != losses_of(plain.state()));  // the noise changed training
  CHECK(losses_of(again.state()) == losses_of(noisy.state()));  // the seeded generator: the same noise
  CHECK(noisy.model()->noise.noise_alpha == 0);                  // deactivated when train() returned
  // evaluate() sees the trained model without noise: the loss of a plain forward in eval mode.
  const double eval_loss = noisy.evaluate().get("eval_loss").value();
  noisy.model()->eval();
  torch::NoGradGuard no_grad;
  std::vector<int64_t> rows(16);
  for (int64_t i = 0; i < 16; ++i) rows[static_cast<std::size_t>(i)] = i;
  double sum = 0;
  for (std::size_t at = 0; at < rows.size(); at += 8)  // the evaluation batches, 8 rows each
    sum += noisy.model()->forward(eval.get_batch(std::span<const int64_t>(rows).subspan(at, 8))).loss.item<double>() * 8;
  CHECK(eval_loss == doctest::Approx(sum / 16).epsilon(1e-6));  // HF: the batches' losses, weighted by rows

  using L = loom_test::Classifier<>;
  auto args = quiet_args("neftune/no_embeddings");
  args.neftune_noise_alpha = 5.0;
  CHECK_THROWS_WITH_AS(L(args, loom_test::fresh_model(), loom_test::linear_data(8, 1)),
                       doctest::Contains("loom: --neftune_noise_alpha needs a model that exposes"), loom::Error);
  args.neftune_noise_alpha = -1.0;
  CHECK_THROWS_WITH_AS(L(args, loom_test::fresh_model(), loom_test::linear_data(8, 1)),
                       doctest::Contains("loom: --neftune_noise_alpha must be a positive number"), loom::Error);
}

namespace {

// A classifier whose compute_loss runs out of memory (c10::OutOfMemoryError, as the CUDA
// allocator throws it) on batches of more than `limit` rows, from optimizer step `from_step` on.
struct MemoryBound : loom::Trainer<MemoryBound, torch::nn::Linear> {
  using Trainer::Trainer;
  int64_t limit = 1 << 20, from_step = 0, out_of_memory = 0;
  bool other_error = false;
  loom::ModelOutput compute_loss(torch::nn::Linear& model, loom_test::Batch& b) {
    loom::check(!other_error, "a bug in compute_loss");
    if (b.x.size(0) > limit && state().global_step >= from_step) {
      ++out_of_memory;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. Tried to allocate 2.00 GiB (a test)");
    }
    return loom_test::cross_entropy(model, b);
  }
};

loom::TrainingArguments batch_args(const std::string& name, int64_t batch, bool auto_find) {
  auto a = quiet_args(name);
  a.per_device_train_batch_size = batch;
  a.auto_find_batch_size = auto_find;
  a.max_steps = 6;
  a.logging_steps = 1;
  a.learning_rate = 0.1;
  return a;
}

}  // namespace

TEST_CASE("is_out_of_memory and reduced_batch_size follow accelerate's should_reduce_batch_size and x 0.9") {
  auto as_ptr = [](auto e) { return std::make_exception_ptr(e); };
  CHECK(loom::is_out_of_memory(as_ptr(std::runtime_error("CUDA out of memory. Tried to allocate 20 MiB"))));
  CHECK(loom::is_out_of_memory(as_ptr(std::runtime_error("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"))));
  CHECK(loom::is_out_of_memory(as_ptr(std::runtime_error("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED."))));
  CHECK_FALSE(loom::is_out_of_memory(as_ptr(std::runtime_error("shape mismatch"))));
  CHECK_FALSE(loom::is_out_of_memory(as_ptr(42)));
  CHECK_FALSE(loom::is_out_of_memory(nullptr));
  CHECK(loom::reduced_batch_size(8) == 7);
  CHECK(loom::reduced_batch_size(64) == 57);
  CHECK(loom::reduced_batch_size(2) == 1);
  CHECK(loom::reduced_batch_size(1) == 0);
}

TEST_CASE("auto_find_batch_size: retries at x 0.9 from the start, the same run as one started at the size that fits") {
  const auto data = loom_test::argmax_data(64, 7, 4);
  // The reference: per_device_train_batch_size 5 from the start.
  MemoryBound reference(batch_args("auto_batch/reference", 5, false), loom_test::fresh_model(), data);
  reference.train();

  // 8 -> 7 -> 6 -> 5, each failing at step 2 (after two optimizer steps changed the weights).
  MemoryBound found(batch_args("auto_batch/found", 8, true), loom_test::fresh_model(), data);
  found.limit = 5;
  found.from_step = 2;
  found.train();
  CHECK(found.out_of_memory == 3);
  CHECK(found.state().train_batch_size == 5);
  CHECK(found.args().per_device_train_batch_size == 8);  // the flag itself is left as given
  CHECK(losses_of(found.state()) == losses_of(reference.state()));
  const auto w = loom_test::weights(found.model()), r = loom_test::weights(reference.model());
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(torch::equal(w[i], r[i]));
  const auto saved = nlohmann::json::parse(std::ifstream(fs::path(found.args().output_dir) / "trainer_state.json"));
  CHECK(saved.at("train_batch_size") == 5);

  // Without the flag the error reaches the caller; another error is never retried.
  MemoryBound plain(batch_args("auto_batch/plain", 8, false), loom_test::fresh_model(), data);
  plain.limit = 5;
  CHECK_THROWS_AS(plain.train(), c10::OutOfMemoryError);
  MemoryBound buggy(batch_args("auto_batch/buggy", 8, true), loom_test::fresh_model(), data);
  buggy.other_error = true;
  CHECK_THROWS_WITH_AS(buggy.train(), "loom: a bug in compute_loss", loom::Error);
  CHECK(buggy.out_of_memory == 0);

  // Nothing fits: 2 -> 1 -> 0 stops with a loom: error.
  MemoryBound hopeless(batch_args("auto_batch/hopeless", 2, true), loom_test::fresh_model(), data);
  hopeless.limit = 0;
  CHECK_THROWS_WITH_AS(hopeless.train(), doctest::Contains("loom: --auto_find_batch_size found no batch size that fits"),
                       loom::Error);
  CHECK(hopeless.out_of_memory == 2);
}

TEST_CASE("auto_find_batch_size resumes at the checkpoint's train_batch_size, as HF") {
  const auto data = loom_test::argmax_data(64, 7, 4);
  auto args = batch_args("auto_batch/resume", 8, true);
  args.save_strategy = "steps";
  args.save_steps = 3;
  MemoryBound first(args, loom_test::fresh_model(), data);
  first.limit = 6;
  first.train();  // 8 -> 7 -> 6
  CHECK(first.out_of_memory == 2);
  args.resume_from_checkpoint = (fs::path(args.output_dir) / "checkpoint-3").string();
  MemoryBound resumed(args, loom_test::fresh_model(), data);
  resumed.limit = 6;
  resumed.train();
  CHECK(resumed.out_of_memory == 0);  // started at 6, the checkpoint's size
  CHECK(resumed.state().train_batch_size == 6);
  const auto w = loom_test::weights(resumed.model()), r = loom_test::weights(first.model());
  for (std::size_t i = 0; i < w.size(); ++i) CHECK(torch::equal(w[i], r[i]));
}

TEST_CASE("run_name names the TensorBoard run folder and tags the JSONL lines; it must be one folder name") {
  auto args = quiet_args("run_name/named");
  args.report_to = "all";
  args.run_name = "baseline-lr3";
  args.max_steps = 2;
  args.logging_steps = 1;
  loom_test::Classifier<> trainer(args, loom_test::fresh_model(), loom_test::linear_data(16, 2));
  trainer.train();
  const fs::path out(args.output_dir);
  REQUIRE(fs::is_directory(out / "runs" / "baseline-lr3"));
  CHECK_FALSE(fs::is_empty(out / "runs" / "baseline-lr3"));
  std::ifstream in(out / "log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) CHECK(nlohmann::json::parse(line).at("run_name") == "baseline-lr3");
  CHECK(lines == 3);
  for (const char* bad : {"a/b", "..", ""}) {
    CAPTURE(bad);
    args.run_name = bad;
    CHECK_THROWS_WITH_AS(loom_test::Classifier<>(args, loom_test::fresh_model(), loom_test::linear_data(16, 2)),
                         doctest::Contains("loom: --run_name names the run's TensorBoard folder"), loom::Error);
  }
}

}  // namespace trainer_test_neftune_batch_size
