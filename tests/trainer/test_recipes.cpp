// Training recipes of issue 11: ragged evaluation outputs (HF's nested_concat padding),
// label_names and include_for_metrics, label_smoothing_factor against transformers'
// LabelSmoother, include_num_input_tokens_seen, and the HF command-line names.
#include <loom/loom.hpp>
#include <loom/models/gpt2.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"
#include "token_support.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <filesystem>
#include <span>
#include <string>
#include <thread>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_recipes {

namespace fs = std::filesystem;

namespace {

using loom_test::quiet_args;
using loom_test::RaggedTokens;
using loom_test::TokenBatch;
using loom_test::TokenTagger;

// A Trainer with the default compute_loss (the tagger's forward) that keeps what
// compute_metrics receives.
struct Recorder : loom::Trainer<Recorder, TokenTagger> {
  using Trainer::Trainer;
  loom::EvalPrediction seen;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    seen = p;
    return {{"rows", static_cast<double>(p.predictions.size(0))}};
  }
};

// What evaluation must return, built batch by batch by hand: every batch's tensor placed in
// a [N, widest, ...] tensor filled with -100.
struct Expected {
  torch::Tensor predictions, labels, mask, inputs, losses;
};
Expected expected_eval(TokenTagger& model, const RaggedTokens& data, int64_t batch) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = data.size();
  int64_t widest = 0;
  for (auto len : data.lengths()) widest = std::max(widest, len);
  Expected e;
  e.predictions = torch::full({n, widest, data.vocab}, -100.0f);
  e.labels = torch::full({n, widest}, -100, torch::kLong);
  e.mask = e.labels.clone();
  e.inputs = e.labels.clone();
  e.losses = torch::empty({n});
  for (int64_t first = 0; first < n; first += batch) {
    const int64_t rows = std::min(batch, n - first);
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < rows; ++i) idx.push_back(first + i);
    const TokenBatch b = data.get_batch(idx);
    const auto out = model->forward(b);
    const int64_t w = b.input_ids.size(1);
    e.predictions.narrow(0, first, rows).narrow(1, 0, w).copy_(out.logits);
    e.labels.narrow(0, first, rows).narrow(1, 0, w).copy_(b.labels);
    e.mask.narrow(0, first, rows).narrow(1, 0, w).copy_(b.attention_mask);
    e.inputs.narrow(0, first, rows).narrow(1, 0, w).copy_(b.input_ids);
    e.losses.narrow(0, first, rows).fill_(out.loss.item<float>());
  }
  return e;
}

// A batch with each example's length in a field of its own (--length_column_name n_tokens).
struct LengthedBatch {
  torch::Tensor x, labels, n_tokens;
};
struct LengthColumnTrainer : loom::Trainer<LengthColumnTrainer, torch::nn::Linear> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(torch::nn::Linear& m, LengthedBatch& b) {
    return torch::cross_entropy_loss(m->forward(b.x), b.labels);
  }
};

}  // namespace

TEST_CASE("evaluation concatenates ragged token-level outputs padded with -100, in batch order") {
  const RaggedTokens data(21, 3);  // 6 batches of 4 (the last of 1), each as wide as its longest
  for (const std::optional<int64_t> accumulate : {std::optional<int64_t>{}, std::optional<int64_t>{2}}) {
    CAPTURE(accumulate.value_or(0));
    auto args = quiet_args("recipes/ragged");
    args.per_device_eval_batch_size = 4;
    args.eval_accumulation_steps = accumulate;
    args.include_for_metrics = "inputs, loss";
    Recorder trainer(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
    const auto metrics = trainer.evaluate();
    CHECK(metrics.get("eval_rows") == 21.0);
    const auto want = expected_eval(trainer.model(), data, 4);
    const auto& p = trainer.seen;
    REQUIRE(p.predictions.sizes() == want.predictions.sizes());
    CHECK(torch::equal(p.predictions, want.predictions));
    CHECK(torch::equal(p.label_ids, want.labels));
    REQUIRE(p.all_label_ids.size() == 1);
    CHECK(torch::equal(p.all_label_ids[0], want.labels));
    // include_for_metrics: the main input (input_ids) and each row's batch loss.
    CHECK(torch::equal(p.inputs, want.inputs));
    CHECK(torch::allclose(p.losses, want.losses, 1e-6, 0));
    // predict() returns the same padded tensors.
    const auto r = trainer.predict(data);
    CHECK(torch::equal(r.predictions, want.predictions));
    CHECK(torch::equal(r.label_ids, want.labels));
  }
  // Without include_for_metrics, no inputs nor losses are kept.
  auto args = quiet_args("recipes/ragged_plain");
  args.per_device_eval_batch_size = 4;
  Recorder plain(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  (void)plain.evaluate();
  CHECK_FALSE(plain.seen.inputs.defined());
  CHECK_FALSE(plain.seen.losses.defined());
}

TEST_CASE("pad_and_concatenate follows HF's torch_pad_and_concatenate") {
  const auto a = torch::arange(6).reshape({2, 3}), b = torch::arange(4).reshape({1, 4});
  const auto c = loom::pad_and_concatenate({a, b});
  CHECK(c.sizes() == std::vector<int64_t>{3, 4});
  CHECK(torch::equal(c, torch::tensor({{0, 1, 2, -100}, {3, 4, 5, -100}, {0, 1, 2, 3}})));
  // 1-d parts and 0-d ones are concatenated as they are.
  CHECK(torch::equal(loom::pad_and_concatenate({torch::tensor({1, 2}), torch::tensor(3)}), torch::tensor({1, 2, 3})));
  // Dims past 1 must agree.
  CHECK(loom_test::error_of([] {
          (void)loom::pad_and_concatenate({torch::zeros({2, 3, 4}), torch::zeros({2, 3, 5})}, -100, "predictions");
        }) == "loom: evaluation predictions of shapes [2, 3, 4] and [2, 3, 5] cannot be concatenated: batches may "
              "differ in dim 0, and in dim 1 (padded with -100, as HF's nested_concat), but not in the number of "
              "dimensions nor in later ones");
}

TEST_CASE("label_names: the label fields compute_metrics gets, several as all_label_ids; a typo is a loom: error") {
  const RaggedTokens data(10, 4);
  auto args = quiet_args("recipes/label_names");
  args.per_device_eval_batch_size = 4;
  args.label_names = "labels,attention_mask";
  Recorder two(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  CHECK(two.label_names() == std::vector<std::string>{"labels", "attention_mask"});
  (void)two.evaluate();
  const auto want = expected_eval(two.model(), data, 4);
  REQUIRE(two.seen.all_label_ids.size() == 2);
  CHECK(torch::equal(two.seen.label_ids, want.labels));
  CHECK(torch::equal(two.seen.all_label_ids[1], want.mask));

  args.label_names = "attention_mask";
  Recorder mask(args, loom_test::fresh_tagger(), loom::no_train_dataset, data);
  (void)mask.evaluate();
  CHECK(torch::equal(mask.seen.label_ids, want.mask));
  CHECK(mask.seen.all_label_ids.size() == 1);

  args.label_names = "lables";
  CHECK(loom_test::error_of([&] { Recorder bad(args, loom_test::fresh_tagger(), loom::no_train_dataset, data); }) ==
        "loom: --label_names names 'lables', which is no field of the batch (its fields: input_ids, "
        "attention_mask, labels)");
  auto bad = quiet_args("recipes/bad_metrics");
  bad.include_for_metrics = "input";
  CHECK(loom_test::error_of([&] { loom::validate(bad); }) ==
        "loom: --include_for_metrics must be one of inputs|loss, got 'input'; did you mean 'inputs'?");
  bad.include_for_metrics = "loss,loss";
  CHECK(loom_test::error_of([&] { loom::validate(bad); }) == "loom: --include_for_metrics names 'loss' twice");
  bad = quiet_args("recipes/bad_labels");
  bad.label_names = "a, a";
  CHECK(loom_test::error_of([&] { loom::validate(bad); }) == "loom: --label_names names 'a' twice");
}

namespace {

// The loss transformers' LabelSmoother computes from `logits` and `labels` (the real class,
// run by $LOOM_PYTHON on the tensors written to a safetensors file).
double hf_label_smoother(const torch::Tensor& logits, const torch::Tensor& labels, double epsilon, bool shift,
                         const char* py, const fs::path& dir) {
  fs::create_directories(dir);
  loom::checkpoint::save_safetensors({{"logits", logits.contiguous()}, {"labels", labels.contiguous()}},
                                     dir / "in.safetensors");
  const auto script = dir / "smooth.py";
  std::ofstream(script) << "import sys\n"
                           "from safetensors.torch import load_file\n"
                           "from transformers.trainer_pt_utils import LabelSmoother\n"
                           "t = load_file(sys.argv[1])\n"
                           "loss = LabelSmoother(epsilon=float(sys.argv[2]))({'logits': t['logits']}, t['labels'], "
                           "shift_labels=sys.argv[3] == '1')\n"
                           "print(repr(loss.item()))\n";
  const auto out = loom_test::run_capture(std::string(py) + " " + script.string() + " " +
                                          (dir / "in.safetensors").string() + " " + std::to_string(epsilon) + " " +
                                          (shift ? "1" : "0"));
  REQUIRE_FALSE(out.empty());
  return std::stod(out);
}

// A model whose forward returns its loss only: label smoothing has no logits to work on.
struct LossOnlyImpl : torch::nn::Module {
  LossOnlyImpl() : emb(register_module("emb", torch::nn::Embedding(11, 4))) {}
  torch::Tensor forward(const TokenBatch& b) { return emb->forward(b.input_ids).sum(); }
  torch::nn::Embedding emb;
};
TORCH_MODULE(LossOnly);

}  // namespace

TEST_CASE("label_smoothing_factor: transformers' LabelSmoother on the logits, labels popped, shifted for a causal LM") {
  const RaggedTokens data(8, 6);
  const TokenBatch batch = data.get_batch(std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  const char* py = loom_test::python("the LabelSmoother comparison");
  for (const double eps : {0.1, 0.25}) {
    CAPTURE(eps);
    auto args = quiet_args("recipes/smoothing");
    args.label_smoothing_factor = eps;
    {
      loom::DefaultTrainer<TokenTagger> trainer(args, loom_test::fresh_tagger(), loom::no_train_dataset);
      TokenBatch b = batch;
      const auto out = trainer.compute_loss(trainer.model(), b);
      // The labels were popped: the loss is the smoother's, not the model's cross-entropy.
      const auto own = trainer.model()->forward(batch).loss;
      CHECK(std::abs(out.loss.item<double>() - own.item<double>()) > 1e-4);
      CHECK(torch::equal(out.loss, loom::label_smoothed_loss(out.logits, batch.labels, eps)));
      if (py) {
        const double want = hf_label_smoother(out.logits, batch.labels, eps, false, py, quiet_args("recipes/smooth_py").output_dir);
        MESSAGE("label smoothing " << eps << ": loom " << out.loss.item<double>() << ", transformers " << want);
        CHECK(std::abs(out.loss.item<double>() - want) <= 1e-6 * std::abs(want));
      }
    }
    {
      torch::manual_seed(5);
      loom::DefaultTrainer<loom_test::CausalTagger> causal(args, loom_test::CausalTagger(11, 16), loom::no_train_dataset);
      TokenBatch b = batch;
      const auto out = causal.compute_loss(causal.model(), b);
      CHECK(torch::equal(out.loss, loom::label_smoothed_loss(out.logits, batch.labels, eps, /*shift_labels=*/true)));
      if (py) {
        const double want = hf_label_smoother(out.logits, batch.labels, eps, true, py, quiet_args("recipes/smooth_py").output_dir);
        CHECK(std::abs(out.loss.item<double>() - want) <= 1e-6 * std::abs(want));
      }
    }
  }
  // Off (the default): the model's own loss, labels given to it.
  {
    loom::DefaultTrainer<TokenTagger> trainer(quiet_args("recipes/smoothing_off"), loom_test::fresh_tagger(),
                                              loom::no_train_dataset);
    TokenBatch b = batch;
    CHECK(torch::equal(trainer.compute_loss(trainer.model(), b).loss, trainer.model()->forward(batch).loss));
  }
  // A model without logits cannot be smoothed; a factor outside [0, 1] is refused.
  auto args = quiet_args("recipes/smoothing_bad");
  args.label_smoothing_factor = 0.1;
  loom::DefaultTrainer<LossOnly> loss_only(args, LossOnly(), loom::no_train_dataset);
  TokenBatch b = batch;
  CHECK(loom_test::error_of([&] { (void)loss_only.compute_loss(loss_only.model(), b); }) ==
        "loom: --label_smoothing_factor needs the model's forward to return its logits (an aggregate with `loss` and "
        "`logits`, such as loom::ModelOutput), or a compute_loss override that applies it");
  args.label_smoothing_factor = 1.5;
  CHECK(loom_test::error_of([&] { loom::validate(args); }) == "loom: --label_smoothing_factor must be in [0, 1], got 1.5");
}

TEST_CASE("label_smoothing_factor on loom's GPT-2 shifts the labels, as HF does for a causal LM") {
  torch::manual_seed(3);
  loom::models::GPT2Config config;
  config.vocab_size = 32, config.n_positions = 16, config.n_embd = 16, config.n_layer = 1, config.n_head = 2;
  auto args = quiet_args("recipes/smoothing_gpt2");
  args.label_smoothing_factor = 0.1;
  loom::DefaultTrainer<loom::models::GPT2LMHeadModel> t(args, loom::models::GPT2LMHeadModel(config),
                                                        loom::no_train_dataset);
  loom::data::CausalLMBatch b{torch::randint(32, {2, 8}), {}};
  b.labels = b.input_ids.clone();
  const loom::data::CausalLMBatch original = b;
  const auto out = t.compute_loss(t.model(), b);
  CHECK(torch::equal(out.loss, loom::label_smoothed_loss(out.logits, original.labels, 0.1, /*shift_labels=*/true)));
  CHECK_FALSE(torch::equal(out.loss, loom::label_smoothed_loss(out.logits, original.labels, 0.1)));
}

TEST_CASE("include_num_input_tokens_seen counts the attention mask (non_padding) or the main input (all)") {
  const RaggedTokens data(20, 8);
  int64_t tokens = 0;
  for (auto len : data.lengths()) tokens += len;
  auto args = quiet_args("recipes/tokens");
  args.per_device_train_batch_size = 4;
  args.num_train_epochs = 2;
  args.logging_steps = 1;
  args.learning_rate = 1e-3;
  for (const std::string mode : {"non_padding", "all", "true", "no"}) {
    CAPTURE(mode);
    args.include_num_input_tokens_seen = mode;
    loom::DefaultTrainer<TokenTagger> trainer(args, loom_test::fresh_tagger(), data);
    trainer.train();
    int64_t want = 0;
    if (mode == "non_padding") {
      want = 2 * tokens;
    } else if (mode != "no") {
      // every element of input_ids, padding included, of the batches the Trainer read
      auto loader = trainer.get_train_dataloader();
      for (int64_t epoch = 0; epoch < 2; ++epoch) {
        loader.set_epoch(epoch);
        for (int64_t i = 0; i < loader.size(); ++i) want += loader.batch(i).input_ids.numel();
      }
      CHECK(want > 2 * tokens);
    }
    CHECK(trainer.state().num_input_tokens_seen == want);
    // Every log entry carries the count so far; the training ones also tokens per second.
    std::vector<double> seen;
    for (const auto& entry : trainer.state().log_history)
      if (entry.contains("loss") && entry.contains("num_input_tokens_seen")) {
        seen.push_back(entry.at("num_input_tokens_seen").get<double>());
        CHECK(entry.contains("train_tokens_per_second"));
      }
    if (mode == "no") {
      CHECK(seen.empty());
    } else {
      REQUIRE(seen.size() == 10);  // 5 steps an epoch
      CHECK(std::is_sorted(seen.begin(), seen.end()));
      CHECK(seen.back() == static_cast<double>(want));
    }
  }
  args.include_num_input_tokens_seen = "some";
  CHECK(loom_test::error_of([&] { loom::validate(args); }) ==
        "loom: --include_num_input_tokens_seen must be one of no|all|non_padding, got 'some'");
}

TEST_CASE("group_by_length: HF's length-grouped order from the seeded permutation, lengths() or a length field") {
  const RaggedTokens data(230, 9);  // mult = min(230 / (4 * 8), 50) = 7: megabatches of 56
  auto args = quiet_args("recipes/group_by_length");
  args.per_device_train_batch_size = 4;
  args.gradient_accumulation_steps = 2;
  args.group_by_length = true;  // HF 4's name
  args.seed = 17;
  loom::DefaultTrainer<TokenTagger> trainer(args, loom_test::fresh_tagger(), data);
  CHECK(trainer.args().train_sampling_strategy == "group_by_length");
  auto loader = trainer.get_train_dataloader();
  const auto lengths = data.lengths();
  for (int64_t epoch : {0, 1}) {
    loader.set_epoch(epoch);
    const auto order = loader.order();
    // The same rule from its parts: megabatches of 56 of the epoch's permutation, longest first.
    const auto want = loom::data::length_grouped_order(lengths, 8, loom::data::seeded_permutation(230, 17, epoch));
    CHECK(torch::equal(order, want));
    // The first index is a longest sequence; within each megabatch lengths do not increase.
    const auto* o = order.data_ptr<int64_t>();
    CHECK(lengths[static_cast<std::size_t>(o[0])] == *std::max_element(lengths.begin(), lengths.end()));
    for (int64_t i = 1; i < 230; ++i)
      if (i % 56 != 0 && i != 1)
        CHECK(lengths[static_cast<std::size_t>(o[i])] <= lengths[static_cast<std::size_t>(o[i - 1])]);
    if (const char* py = loom_test::python("the LengthGroupedSampler comparison")) {
      // transformers' get_length_grouped_indices on a generator seeded seed + epoch.
      std::string list;
      for (auto len : lengths) list += std::to_string(len) + ",";
      const auto out = loom_test::run_capture(
          std::string(py) + " -c 'import torch; from transformers.trainer_pt_utils import get_length_grouped_indices as g; "
          "print(\",\".join(map(str, g([" + list + "], 8, generator=torch.Generator().manual_seed(" +
          std::to_string(17 + epoch) + ")))))'");
      std::string mine;
      for (int64_t i = 0; i < 230; ++i) mine += (i ? "," : "") + std::to_string(o[i]);
      CHECK(out == mine + "\n");
    }
  }
  // Without lengths(): the --length_column_name field of the examples.
  {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    auto x = torch::randn({40, 4}, gen);
    auto sizes = torch::randint(1, 30, {40}, gen);
    auto column = quiet_args("recipes/group_by_length_column");
    column.train_sampling_strategy = "group_by_length";
    column.length_column_name = "n_tokens";
    column.per_device_train_batch_size = 2;
    LengthColumnTrainer t(column, loom_test::fresh_model(),
                          loom::data::TensorDataset<LengthedBatch>({x, x.narrow(1, 0, 3).argmax(1), sizes}));
    auto l = t.get_train_dataloader();
    l.set_epoch(0);
    std::vector<int64_t> from_field(sizes.data_ptr<int64_t>(), sizes.data_ptr<int64_t>() + 40);
    CHECK(torch::equal(l.order(), loom::data::length_grouped_order(from_field, 2, loom::data::seeded_permutation(40, 42, 0))));
    CHECK_FALSE(torch::equal(l.order(), loom::data::seeded_permutation(40, 42, 0)));
  }
  // A dataset with neither is a loom: error at construction.
  auto plain = quiet_args("recipes/group_by_length_plain");
  plain.train_sampling_strategy = "group_by_length";
  CHECK(loom_test::error_of([&] {
          loom_test::Classifier<> c(plain, loom_test::fresh_model(), loom_test::linear_data(16, 1));
        }) == "loom: --train_sampling_strategy group_by_length needs each example's length: a lengths() member of "
              "the training dataset, or a field named length (--length_column_name)");
  plain.train_sampling_strategy = "batch_rebalance";
  CHECK(loom_test::error_of([&] { loom::validate(plain); }) ==
        "loom: --train_sampling_strategy batch_rebalance is not supported; use random, sequential or group_by_length");
  plain.train_sampling_strategy = "sequential";
  loom_test::Classifier<> seq(plain, loom_test::fresh_model(), loom_test::linear_data(16, 1));
  auto seq_loader = seq.get_train_dataloader();
  seq_loader.set_epoch(3);
  CHECK(torch::equal(seq_loader.order(), torch::arange(16)));
}

TEST_CASE("report_to adds the built-in loggers at run time: jsonl, tensorboard, all, none") {
  const auto data = loom_test::linear_data(16, 2);
  struct Case {
    std::string report_to;
    bool jsonl, tensorboard;
  };
  for (const auto& [report_to, jsonl, tensorboard] :
       {Case{"none", false, false}, Case{"jsonl", true, false}, Case{"tensorboard", false, true},
        Case{"all", true, true}, Case{"tensorboard,jsonl", true, true}}) {
    CAPTURE(report_to);
    auto args = quiet_args("recipes/report_to");
    args.report_to = report_to;
    args.max_steps = 2;
    args.logging_steps = 1;
    loom_test::Classifier<> trainer(args, loom_test::fresh_model(), data);
    CHECK(trainer.runtime_callbacks().size() == static_cast<std::size_t>(jsonl) + static_cast<std::size_t>(tensorboard));
    trainer.train();
    const fs::path out(args.output_dir);
    CHECK(fs::exists(out / "log.jsonl") == jsonl);
    CHECK((fs::exists(out / "runs") && !fs::is_empty(out / "runs")) == tensorboard);
    if (jsonl) {  // the two training logs and the final one, one line each
      std::ifstream in(out / "log.jsonl");
      int lines = 0;
      for (std::string line; std::getline(in, line);) ++lines;
      CHECK(lines == 3);
    }
  }
  // A logger compiled into the Trainer is not added again.
  auto args = quiet_args("recipes/report_to_compiled");
  args.report_to = "all";
  loom_test::Classifier<loom::Callbacks<loom::JsonlLogger>> compiled(args, loom_test::fresh_model(), data);
  CHECK(compiled.runtime_callbacks().size() == 1);  // tensorboard only
}

namespace {

// linear_data's rows, each batch read slowly (a sleep that varies by batch, so worker threads
// finish out of order); a batch holding row `poison` throws.
struct SlowData {
  loom::data::TensorDataset<loom_test::Batch> rows = loom_test::linear_data(64, 3);
  int64_t poison = -1;
  [[nodiscard]] int64_t size() const { return rows.size(); }
  [[nodiscard]] loom_test::Batch get_batch(std::span<const int64_t> idx) const {
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (idx.front() % 5)));
    for (auto i : idx) loom::check(i != poison, "row {} cannot be read", poison);
    return rows.get_batch(idx);
  }
};

loom::TrainingArguments workers_args(const std::string& name, int64_t workers) {
  auto a = loom_test::quiet_args(name);
  a.per_device_train_batch_size = 4;
  a.per_device_eval_batch_size = 8;
  a.max_steps = 12;
  a.logging_steps = 1;
  a.eval_strategy = "steps";
  a.eval_steps = 6;
  a.gradient_accumulation_steps = 2;
  a.dataloader_num_workers = workers;
  if (workers > 0) a.dataloader_prefetch_factor = 3;
  return a;
}

}  // namespace

TEST_CASE("dataloader_num_workers: batches prepared on threads, in the loop's order; the same run as without") {
  using T = loom_test::Classifier<>;
  std::vector<std::vector<double>> losses;
  std::vector<std::vector<torch::Tensor>> final_weights;
  for (int64_t workers : {0, 1, 3}) {
    CAPTURE(workers);
    T trainer(workers_args("workers_" + std::to_string(workers), workers), loom_test::fresh_model(), SlowData{},
              SlowData{});
    trainer.train();
    std::vector<double> l;
    for (const auto& entry : trainer.state().log_history)
      for (const char* key : {"loss", "eval_loss"})
        if (entry.contains(key)) l.push_back(entry.at(key).get<double>());
    REQUIRE(l.size() == 14);  // 12 training logs, 2 evaluations
    losses.push_back(l);
    final_weights.push_back(loom_test::weights(trainer.model()));
  }
  for (std::size_t k = 1; k < losses.size(); ++k) {
    CHECK(losses[k] == losses[0]);  // bit for bit: the same batches in the same order
    for (std::size_t i = 0; i < final_weights[0].size(); ++i) CHECK(torch::equal(final_weights[k][i], final_weights[0][i]));
  }

  // A batch that fails on a worker fails the loop when its turn comes, with its own message.
  SlowData bad;
  bad.poison = 17;
  T failing(workers_args("workers_error", 2), loom_test::fresh_model(), bad, SlowData{});
  CHECK_THROWS_WITH_AS(failing.train(), "loom: row 17 cannot be read", loom::Error);
}

TEST_CASE("BatchPrefetcher hands out the batches asked for, in order, bounded ahead") {
  loom::data::DataLoader<loom_test::Batch> loader(loom::data::AnyDataset<loom_test::Batch>(SlowData{}), 4, false,
                                                  loom::data::SequentialSampler{});
  loom::data::BatchPrefetcher<loom_test::Batch> prefetch(loader, {.num_workers = 3, .prefetch_factor = 2});
  const std::vector<int64_t> wanted{7, 2, 15, 0, 9, 9, 4};
  prefetch.start(0, wanted);
  for (auto i : wanted) CHECK(torch::equal(prefetch.next().x, loader.batch(i).x));
  CHECK_THROWS_WITH_AS(prefetch.next(), "loom: BatchPrefetcher::next past the end of its 7 batches", loom::Error);
  // Started again mid-way (an epoch cut short), then for another range.
  prefetch.start(1, 3, 16);
  (void)prefetch.next();
  prefetch.start(2, 14, 16);
  CHECK(torch::equal(prefetch.next().labels, loader.batch(14).labels));
  CHECK_THROWS_WITH_AS((loom::data::BatchPrefetcher<loom_test::Batch>(loader, {.num_workers = -1})),
                       "loom: --dataloader_num_workers must not be negative, got -1", loom::Error);
}

TEST_CASE("bf16_full_eval / fp16_full_eval: evaluation outside training casts the model, then puts float32 back") {
  for (const bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const auto dtype = bf16 ? torch::kBFloat16 : torch::kHalf;
    auto args = workers_args(bf16 ? "full_eval_bf16" : "full_eval_fp16", 0);
    (bf16 ? args.bf16_full_eval : args.fp16_full_eval) = true;
    loom_test::Classifier<> trainer(args, loom_test::fresh_model(), SlowData{}, SlowData{});
    trainer.train();  // evaluations during training keep float32 weights
    CHECK((trainer.model()->weight.scalar_type() == torch::kFloat));
    // The loss the cast model gives on the evaluation rows.
    auto cast = loom_test::fresh_model();
    {
      torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < cast->parameters().size(); ++i)
        cast->parameters()[i].copy_(trainer.model()->parameters()[i]);
    }
    cast->to(dtype);
    double sum = 0;
    for (int64_t first = 0; first < 64; first += 8) {
      std::vector<int64_t> idx;
      for (int64_t i = first; i < first + 8; ++i) idx.push_back(i);
      auto b = SlowData{}.rows.get_batch(idx);
      torch::NoGradGuard no_grad;
      sum += torch::cross_entropy_loss(cast->forward(b.x.to(dtype)), b.labels).item<double>() * 8;
    }
    const auto before = trainer.model()->weight.clone();
    const auto* storage = trainer.model()->weight.data_ptr();
    const auto metrics = trainer.evaluate();
    CHECK(metrics.get("eval_loss").value() == doctest::Approx(sum / 64).epsilon(1e-6));
    // Unlike HF's, whose model stays cast, the parameters are the float32 ones again: the
    // same storage (the optimizer's), the same values.
    CHECK((trainer.model()->weight.scalar_type() == torch::kFloat));
    CHECK(trainer.model()->weight.data_ptr() == storage);
    CHECK(torch::equal(trainer.model()->weight, before));
    // A train() after it trains the float32 model (HF's would train the cast one).
    trainer.train();
    CHECK((trainer.model()->weight.scalar_type() == torch::kFloat));
  }
}

TEST_CASE("tf32: set for CUDA at start-up; true on a CPU run is a loom: error") {
  auto args = loom_test::quiet_args("tf32");
  args.tf32 = true;
  CHECK_THROWS_WITH_AS(loom_test::Classifier<>(args, loom_test::fresh_model(), SlowData{}),
                       "loom: --tf32 true needs a CUDA GPU (TF32 is a tensor-core format of Ampere and newer); this "
                       "process runs on the CPU",
                       loom::Error);
  at::globalContext().setAllowTF32CuBLAS(true);
  args.tf32 = false;
  loom_test::Classifier<> off(args, loom_test::fresh_model(), SlowData{});
  CHECK_FALSE(at::globalContext().allowTF32CuBLAS());
  CHECK_FALSE(at::globalContext().allowTF32CuDNN());
}

TEST_CASE("log_level / log_level_replica: the Trainer sets the level of loom's messages for its process") {
  const auto before = loom::log_level();
  auto args = loom_test::quiet_args("log_level");
  args.log_level = "error";
  args.log_level_replica = "debug";
  loom_test::Classifier<> main_process(args, loom_test::fresh_model(), SlowData{});  // one process: it logs
  CHECK((loom::log_level() == loom::LogLevel::error));
  CHECK_FALSE(loom::log_enabled(loom::LogLevel::warning));
  CHECK((loom::process_log_level(args, /*logs=*/false) == loom::LogLevel::debug));
  args.log_on_each_node = false;
  args.log_level = "passive";  // leaves the level where it is
  loom_test::Classifier<> passive(args, loom_test::fresh_model(), SlowData{});
  CHECK((loom::log_level() == loom::LogLevel::error));
  loom::set_log_level(before);
}

}  // namespace trainer_test_recipes
