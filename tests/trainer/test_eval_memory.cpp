// Evaluation memory (HF's preprocess_logits_for_metrics, batch_eval_metrics and
// eval_accumulation_steps): token-level logits reduced per batch before they are kept,
// compute_metrics per batch with nothing kept, and predictions moved to the host in chunks.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"
#include "token_support.hpp"

#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_eval_memory {

namespace {

using loom_test::quiet_args;
using loom_test::RaggedTokens;
using loom_test::TokenBatch;
using loom_test::TokenTagger;

// Token accuracy over the labelled tokens (labels not -100) of token ids [N, L].
struct TokenCounts {
  double correct = 0, total = 0;
  void add(const torch::Tensor& ids, const torch::Tensor& labels) {
    const auto mask = labels.ne(-100);
    correct += ids.eq(labels).logical_and(mask).sum().item<double>();
    total += mask.sum().item<double>();
  }
};

// compute_metrics on the whole set from full logits [N, L, vocab]: the reference.
struct FullLogits : loom::Trainer<FullLogits, TokenTagger> {
  using Trainer::Trainer;
  loom::EvalPrediction seen;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    seen = p;
    TokenCounts c;  // token ids when a preprocess_logits_for_metrics function kept them
    c.add(p.predictions.dim() == 3 ? p.predictions.argmax(-1) : p.predictions, p.label_ids);
    return {{"accuracy", c.correct / c.total}};
  }
};

// The same metric from token ids that preprocess_logits_for_metrics kept instead of the logits.
struct Argmaxed : loom::Trainer<Argmaxed, TokenTagger> {
  using Trainer::Trainer;
  loom::EvalPrediction seen;
  int64_t preprocess_calls = 0;
  std::vector<bool> labels_match;  // per call: the labels given have the logits' rows
  torch::Tensor preprocess_logits_for_metrics(const torch::Tensor& logits, const torch::Tensor& labels) {
    ++preprocess_calls;
    labels_match.push_back(labels.defined() && labels.sizes() == logits.sizes().slice(0, 2));
    return logits.argmax(-1);
  }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    seen = p;
    TokenCounts c;
    c.add(p.predictions, p.label_ids);
    return {{"accuracy", c.correct / c.total}};
  }
};

// HF's batched form: compute_metrics(eval_pred, compute_result) keeps its own counts and
// returns the metric on the last call. Records each call.
struct Batched : loom::Trainer<Batched, TokenTagger> {
  using Trainer::Trainer;
  std::vector<bool> compute_result;  // per call
  std::vector<int64_t> rows;         // per call: the predictions' dim 0
  TokenCounts counts;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p, bool last) {
    compute_result.push_back(last);
    rows.push_back(p.predictions.size(0));
    CHECK(p.label_ids.size(0) == p.predictions.size(0));
    counts.add(p.predictions.dim() == 3 ? p.predictions.argmax(-1) : p.predictions, p.label_ids);
    if (!last) return {};
    loom::Metrics m{{"accuracy", counts.correct / counts.total}};
    counts = {};
    return m;
  }
};

// Only the whole-set form: --batch_eval_metrics cannot call it.
struct WholeOnly : loom::Trainer<WholeOnly, TokenTagger> {
  using Trainer::Trainer;
  loom::Metrics compute_metrics(const loom::EvalPrediction&) { return {{"calls", 1.0}}; }
};

// 21 sequences in batches of 4: 6 batches, the last of 1, each as wide as its longest.
loom::TrainingArguments eval_args(const std::string& name) {
  auto args = quiet_args(name);
  args.per_device_eval_batch_size = 4;
  return args;
}

}  // namespace

TEST_CASE("preprocess_logits_for_metrics: compute_metrics gets the kept tensor, with the full logits' metrics") {
  const RaggedTokens data(21, 3);
  FullLogits full(eval_args("evalmem/full"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  Argmaxed arg(eval_args("evalmem/argmax"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto want = full.evaluate();
  const auto got = arg.evaluate();
  CHECK(full.seen.predictions.dim() == 3);
  // Per batch, before the concatenation: token ids [21, widest], padded with -100 where a
  // batch is narrower, as the logits are.
  CHECK(arg.preprocess_calls == 6);
  CHECK(arg.labels_match == std::vector<bool>(6, true));
  REQUIRE(arg.seen.predictions.sizes() == full.seen.predictions.sizes().slice(0, 2));
  CHECK((arg.seen.predictions.scalar_type() == torch::kLong));
  const auto labelled = full.seen.label_ids.ne(-100);
  CHECK(torch::equal(arg.seen.predictions.masked_select(labelled),
                     full.seen.predictions.argmax(-1).masked_select(labelled)));
  CHECK(torch::equal(arg.seen.label_ids, full.seen.label_ids));
  REQUIRE(want.get("eval_accuracy").has_value());
  CHECK(got.get("eval_accuracy") == want.get("eval_accuracy"));
  CHECK(got.get("eval_loss") == want.get("eval_loss"));
  // predict() returns what was kept.
  const auto r = arg.predict(data);
  CHECK(torch::equal(r.predictions, arg.seen.predictions));
  CHECK(r.metrics.get("test_accuracy") == want.get("eval_accuracy"));

  // prediction_loss_only: no logits are kept, so none are preprocessed (HF's logits None).
  auto lo = eval_args("evalmem/loss_only");
  lo.prediction_loss_only = true;
  Argmaxed loss_only(lo, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto m = loss_only.evaluate();
  CHECK(loss_only.preprocess_calls == 0);
  CHECK(m.get("eval_loss") == want.get("eval_loss"));
  CHECK_FALSE(m.contains("eval_accuracy"));
}

TEST_CASE("preprocess_logits_for_metrics given at run time, and switched off again") {
  const RaggedTokens data(21, 3);
  FullLogits t(eval_args("evalmem/runtime"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto plain = t.predict(data);
  REQUIRE(plain.predictions.dim() == 3);
  int64_t calls = 0;
  t.set_preprocess_logits_for_metrics([&](const torch::Tensor& logits, const torch::Tensor& labels) {
    ++calls;
    CHECK(labels.size(0) == logits.size(0));
    return logits.argmax(-1);
  });
  const auto kept = t.predict(data);
  CHECK(calls == 6);
  CHECK((kept.predictions.scalar_type() == torch::kLong));
  const auto labelled = plain.label_ids.ne(-100);
  CHECK(torch::equal(kept.predictions.masked_select(labelled), plain.predictions.argmax(-1).masked_select(labelled)));
  t.set_preprocess_logits_for_metrics({});
  CHECK(torch::equal(t.predict(data).predictions, plain.predictions));
  CHECK(calls == 6);
}

TEST_CASE("a preprocessed output whose dim 0 is not the batch's rows is a loom: error") {
  const RaggedTokens data(21, 3);
  FullLogits t(eval_args("evalmem/bad_rows"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  t.set_preprocess_logits_for_metrics([](const torch::Tensor& logits, const torch::Tensor&) {
    return logits.argmax(-1).reshape({-1});  // flattened: [B * L]
  });
  const auto first = data.get_batch(std::vector<int64_t>{0, 1, 2, 3});
  const auto flat = first.input_ids.numel();
  CHECK(loom_test::error_of([&] { (void)t.evaluate(); }) ==
        "loom: preprocess_logits_for_metrics returned a tensor of shape [" + std::to_string(flat) +
            "] for a batch of 4 rows; its dim 0 must be the batch's rows, as the batches' outputs are concatenated "
            "along it (e.g. logits.argmax(-1))");
  t.set_preprocess_logits_for_metrics([](const torch::Tensor& logits, const torch::Tensor&) {
    return logits.sum();  // 0-d
  });
  CHECK(loom_test::error_of([&] { (void)t.evaluate(); }).starts_with(
      "loom: preprocess_logits_for_metrics returned a tensor of shape [] for a batch of 4 rows"));
}

TEST_CASE("batch_eval_metrics: compute_metrics once per batch, compute_result on the last, as the whole set") {
  const RaggedTokens data(21, 3);
  FullLogits full(eval_args("evalmem/batched_ref"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto want = full.evaluate();
  for (const bool preprocess : {false, true}) {
    CAPTURE(preprocess);
    auto args = eval_args("evalmem/batched");
    args.batch_eval_metrics = true;
    Batched t(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
    if (preprocess)
      t.set_preprocess_logits_for_metrics([](const torch::Tensor& logits, const torch::Tensor&) {
        return logits.argmax(-1);
      });
    const auto got = t.evaluate();
    CHECK(t.compute_result == std::vector<bool>{false, false, false, false, false, true});
    CHECK(t.rows == std::vector<int64_t>{4, 4, 4, 4, 4, 1});
    REQUIRE(got.get("eval_accuracy").has_value());
    CHECK(*got.get("eval_accuracy") == doctest::Approx(*want.get("eval_accuracy")).epsilon(1e-12));
    CHECK(got.get("eval_loss") == want.get("eval_loss"));
    // predict() still returns every batch's outputs (HF's Prediction loop keeps them).
    t.compute_result.clear();
    const auto r = t.predict(data);
    CHECK(t.compute_result.size() == 6);
    CHECK(r.predictions.size(0) == 21);
    CHECK(r.metrics.get("test_accuracy") == got.get("eval_accuracy"));
  }
  // Only the batched form declared: the whole-set evaluation calls it once, compute_result true.
  Batched once(eval_args("evalmem/batched_once"), loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto m = once.evaluate();
  CHECK(once.compute_result == std::vector<bool>{true});
  CHECK(once.rows == std::vector<int64_t>{21});
  CHECK(m.get("eval_accuracy") == want.get("eval_accuracy"));
}

TEST_CASE("batch_eval_metrics with a compute_metrics that takes no compute_result is a loom: error") {
  auto args = eval_args("evalmem/batched_whole_only");
  args.batch_eval_metrics = true;
  const RaggedTokens data(8, 3);
  CHECK(loom_test::error_of([&] { WholeOnly t(args, loom_test::fresh_tagger(), loom::no_train_dataset, data); }) ==
        "loom: --batch_eval_metrics calls compute_metrics(const loom::EvalPrediction&, bool compute_result) once per "
        "batch, and this Trainer's compute_metrics has no compute_result parameter; declare that form (HF's "
        "compute_metrics(eval_pred, compute_result)) or drop the flag");
  // A Trainer without compute_metrics has both forms (none, per batch): no metrics, no error.
  loom::DefaultTrainer<TokenTagger> plain(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto m = plain.evaluate();
  CHECK(m.contains("eval_loss"));
  CHECK_FALSE(m.contains("eval_accuracy"));
}

TEST_CASE("eval_accumulation_steps moves the kept outputs to the host every N rounds; batch_eval_metrics keeps none") {
  // The accumulator of a one-process evaluation of 5 batches: outputs wait on the device
  // until end_round moves them (to the CPU: .cpu() on a CUDA device, a no-op here).
  auto args = eval_args("evalmem/accumulate");
  args.eval_accumulation_steps = 2;
  args.include_for_metrics = "inputs,loss";
  const RaggedTokens data(8, 3);
  loom::DefaultTrainer<TokenTagger> t(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  const auto batch = [](int64_t k) {
    loom::PredictionOutput p;
    p.loss = torch::tensor(0.5f + static_cast<float>(k));
    p.logits = torch::full({2, 3, 5}, static_cast<float>(k));
    p.labels = torch::full({2, 3}, k, torch::kLong);
    return p;
  };
  const auto inputs = torch::zeros({2, 3}, torch::kLong);
  loom::EvalAccumulator acc(t.args(), t.world(), t.sharding(), torch::kCPU, 5);
  std::vector<int64_t> pending;  // batches on the device after each round
  for (int64_t k = 0; k < 5; ++k) {
    acc.add(batch(k), 2, inputs);
    acc.end_round(k);
    pending.push_back(acc.batches_on_device());
  }
  // 4 kinds of output (predictions, labels, inputs, losses): moved after rounds 2 and 4.
  CHECK(pending == std::vector<int64_t>{4, 0, 4, 0, 4});
  const auto r = acc.finish();
  CHECK(acc.batches_on_device() == 0);
  REQUIRE(r.predictions.sizes() == torch::IntArrayRef{10, 3, 5});
  CHECK(r.predictions.device().is_cpu());
  for (int64_t k = 0; k < 5; ++k) CHECK(r.predictions[2 * k].eq(static_cast<float>(k)).all().item<bool>());
  CHECK(r.losses.sizes() == torch::IntArrayRef{10});

  // Not accumulating (evaluate() under --batch_eval_metrics): nothing is kept, the loss is summed.
  loom::EvalAccumulator none(t.args(), t.world(), t.sharding(), torch::kCPU, 5, /*accumulate=*/false);
  for (int64_t k = 0; k < 5; ++k) {
    none.add(batch(k), 2, inputs);
    CHECK(none.batches_on_device() == 0);
    const auto p = batch(k);
    const auto round = none.round_prediction(k, &p, 2, inputs, 1);
    REQUIRE(round.has_value());
    CHECK(round->predictions.sizes() == torch::IntArrayRef{2, 3, 5});
    CHECK(round->losses.sizes() == torch::IntArrayRef{2});
  }
  const auto nr = none.finish();
  CHECK_FALSE(nr.predictions.defined());
  const auto m = none.metrics({}, "eval", std::chrono::steady_clock::now());
  CHECK(*m.get("eval_loss") == doctest::Approx(2.5));
}

}  // namespace trainer_test_eval_memory
