// The Trainer's user-facing methods beyond train(): save_model, evaluate on a given dataset
// and on several named sets, predict without labels, a Trainer without a training dataset,
// log_metrics / metrics_format (checked against transformers' own), and the compiled
// policies written back into the arguments.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_api {

namespace fs = std::filesystem;

namespace {

using loom_test::Batch;
using loom_test::error_of;
using loom_test::quiet_args;

loom::data::TensorDataset<Batch> make_data(int64_t n, uint64_t seed) { return loom_test::argmax_data(n, seed, 4); }

// compute_loss that also serves batches without labels (predict on a test set): the loss is
// then left out of the ModelOutput.
template <class... Policies>
struct Classifier : loom::Trainer<Classifier<Policies...>, torch::nn::Linear, Policies...> {
  using Base = loom::Trainer<Classifier<Policies...>, torch::nn::Linear, Policies...>;
  using Base::Base;
  loom::ModelOutput compute_loss(torch::nn::Linear& model, Batch& b) {
    auto logits = model->forward(b.x);
    if (!b.labels.defined()) return {{}, logits};
    return {torch::cross_entropy_loss(logits, b.labels), logits};
  }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return loom_test::accuracy(p); }
};

double mean_loss(torch::nn::Linear& model, const loom::data::TensorDataset<Batch>& data) {
  torch::NoGradGuard g;
  return torch::cross_entropy_loss(model->forward(data.tensors().x), data.tensors().labels).item<double>();
}

// A module holder whose module has a reflectable config, written to config.json by save_model.
struct TinyConfig {
  int64_t in_features = 4;
  int64_t num_labels = 3;
  std::string model_type = "tiny";
};
struct TinyImpl : torch::nn::Module {
  explicit TinyImpl(TinyConfig c = {}) : config(c), head(register_module("head", torch::nn::Linear(c.in_features, c.num_labels))) {}
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(x); }
  TinyConfig config;
  torch::nn::Linear head;
};
TORCH_MODULE(Tiny);

struct TinyTrainer : loom::Trainer<TinyTrainer, Tiny> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(Tiny& m, Batch& b) { return torch::cross_entropy_loss(m->forward(b.x), b.labels); }
};

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace

TEST_CASE("save_model writes the trained weights, training_args.json and the model's config.json") {
  auto args = quiet_args("api/save_model");
  args.max_steps = 4;
  args.per_device_train_batch_size = 8;
  Classifier<> t(args, loom_test::fresh_model(), make_data(64, 1));
  t.train();
  CHECK_FALSE(fs::exists(fs::path(args.output_dir) / "model.safetensors"));  // save_strategy no: train() saves none
  t.save_model();
  const fs::path out(args.output_dir);
  REQUIRE(fs::exists(out / "model.safetensors"));
  torch::nn::Linear loaded(4, 3);
  loom::checkpoint::load_module(*loaded, out / "model.safetensors");
  CHECK(torch::equal(loaded->weight, t.model()->weight));
  CHECK(torch::equal(loaded->bias, t.model()->bias));
  const auto saved_args = read_json(out / "training_args.json");
  CHECK(saved_args.at("max_steps") == 4);
  CHECK(saved_args.at("output_dir") == args.output_dir);
  CHECK_FALSE(fs::exists(out / "config.json"));  // Linear has no config

  // Another folder, and a model with a config.
  const auto other = loom_test::tmp_dir("api/save_model_tiny");
  TinyTrainer tiny(quiet_args("api/save_model_tiny_run"), Tiny(TinyConfig{4, 3, "tiny"}), make_data(16, 1));
  tiny.save_model(other.string());
  const auto config = read_json(other / "config.json");
  CHECK(config.at("num_labels") == 3);
  CHECK(config.at("model_type") == "tiny");
  Tiny back(TinyConfig{});
  loom::checkpoint::load_module(*back, other / "model.safetensors");
  CHECK(torch::equal(back->head->weight, tiny.model()->head->weight));
}

TEST_CASE("evaluate(dataset, prefix) evaluates another set under another prefix") {
  auto args = quiet_args("api/evaluate_dataset");
  args.per_device_eval_batch_size = 7;
  Classifier<> t(args, loom_test::fresh_model(), make_data(32, 1), make_data(20, 2));
  const auto test = make_data(30, 3);
  const auto m = t.evaluate(test, "holdout");
  CHECK(m.get("holdout_loss").value() == doctest::Approx(mean_loss(t.model(), test)).epsilon(1e-6));
  CHECK(m.contains("holdout_accuracy"));
  CHECK(m.contains("holdout_runtime"));
  CHECK_FALSE(m.contains("eval_loss"));
  // The Trainer's own set, under a chosen prefix.
  const auto own = t.evaluate("dev");
  CHECK(own.get("dev_loss").value() == doctest::Approx(mean_loss(t.model(), make_data(20, 2))).epsilon(1e-6));
  // Each evaluation is logged.
  const auto& history = t.state().log_history;
  REQUIRE(history.size() == 2);
  CHECK(history[0].contains("holdout_loss"));
  CHECK(history[1].contains("dev_loss"));
}

TEST_CASE("several named evaluation sets: eval_<name>_<metric>, best model and plateau on one of them") {
  auto args = quiet_args("api/eval_sets");
  args.max_steps = 6;
  args.per_device_train_batch_size = 8;
  args.eval_strategy = "steps";
  args.eval_steps = 3;
  args.metric_for_best_model = "hard_loss";
  args.lr_scheduler_type = "reduce_lr_on_plateau";
  const auto easy = make_data(24, 2), hard = make_data(16, 3);
  Classifier<> t(args, loom_test::fresh_model(), make_data(64, 1),
                 loom::EvalDatasets<loom::data::TensorDataset<Batch>>{{"easy", easy}, {"hard", hard}});
  t.train();
  std::vector<std::string> evals;
  for (const auto& entry : t.state().log_history) {
    if (entry.contains("eval_easy_loss")) evals.push_back("easy");
    if (entry.contains("eval_hard_loss")) evals.push_back("hard");
    CHECK_FALSE(entry.contains("eval_loss"));
  }
  CHECK(evals == std::vector<std::string>{"easy", "hard", "easy", "hard"});
  REQUIRE(t.state().best_metric.has_value());
  // The best metric is the lower of the two hard-set losses seen.
  double best = 1e9;
  for (const auto& entry : t.state().log_history)
    if (entry.contains("eval_hard_loss")) best = std::min(best, entry["eval_hard_loss"].get<double>());
  CHECK(*t.state().best_metric == best);
  // evaluate() afterwards returns both sets' metrics.
  const auto m = t.evaluate();
  CHECK(m.get("eval_easy_loss").value() == doctest::Approx(mean_loss(t.model(), easy)).epsilon(1e-6));
  CHECK(m.get("eval_hard_loss").value() == doctest::Approx(mean_loss(t.model(), hard)).epsilon(1e-6));
  // evaluate(EvalDatasets, prefix)
  const auto m2 = t.evaluate(loom::EvalDatasets<loom::data::TensorDataset<Batch>>{{"a", easy}, {"b", hard}}, "x");
  CHECK(m2.get("x_a_loss").value() == doctest::Approx(*m.get("eval_easy_loss")).epsilon(1e-12));
  CHECK(m2.get("x_b_loss").value() == doctest::Approx(*m.get("eval_hard_loss")).epsilon(1e-12));

  // With several sets, a metric that names none of them is an error that says what to do.
  args.metric_for_best_model = "loss";
  args.output_dir = loom_test::tmp_dir("api/eval_sets_bad").string();
  Classifier<> bad(args, loom_test::fresh_model(), make_data(64, 1),
                   loom::EvalDatasets<loom::data::TensorDataset<Batch>>{{"easy", easy}, {"hard", hard}});
  const auto e = error_of([&] { bad.train(); });
  CHECK(e.rfind("loom: ", 0) == 0);
  CHECK(e.find("eval_<set>_loss") != std::string::npos);

  CHECK(error_of([&] {
          Classifier<> twice(quiet_args("api/eval_sets_twice"), loom_test::fresh_model(), make_data(8, 1),
                             loom::EvalDatasets<loom::data::TensorDataset<Batch>>{{"a", easy}, {"a", hard}});
        }).find("two evaluation datasets are named \"a\"") != std::string::npos);
}

TEST_CASE("predict on a dataset without labels gives predictions only") {
  auto args = quiet_args("api/predict_unlabeled");
  args.per_device_eval_batch_size = 16;
  Classifier<> t(args, loom_test::fresh_model(), make_data(32, 1));
  const auto labelled = make_data(40, 2);
  const loom::data::TensorDataset<Batch> unlabelled(Batch{labelled.tensors().x, {}});
  const auto r = t.predict(unlabelled);
  REQUIRE(r.predictions.defined());
  CHECK(r.predictions.sizes() == torch::IntArrayRef{40, 3});
  CHECK_FALSE(r.label_ids.defined());
  CHECK_FALSE(r.metrics.contains("test_loss"));
  CHECK_FALSE(r.metrics.contains("test_accuracy"));
  CHECK(r.metrics.contains("test_runtime"));
  // The same predictions as with labels.
  const auto with = t.predict(labelled);
  CHECK(torch::equal(r.predictions, with.predictions));
  // A custom prefix.
  CHECK(t.predict(unlabelled, "infer").metrics.contains("infer_runtime"));
  // A column set in some examples only cannot be batched.
  struct Example {
    torch::Tensor x, labels;
  };
  std::vector<Example> mixed{{torch::zeros({4}), torch::tensor(1)}, {torch::zeros({4}), {}}};
  CHECK(error_of([&] { (void)loom::data::collate(mixed); }).find("field 'labels' is undefined in 1 of 2") !=
        std::string::npos);
}

TEST_CASE("a Trainer without a training dataset evaluates and predicts; train() says why it cannot") {
  auto args = quiet_args("api/no_train");
  Classifier<> none(args, loom_test::fresh_model());
  const auto test = make_data(20, 2);
  CHECK(none.evaluate(test).get("eval_loss").value() ==
        doctest::Approx(mean_loss(none.model(), test)).epsilon(1e-6));
  CHECK(none.predict(test).predictions.size(0) == 20);
  const auto e = error_of([&] { none.train(); });
  CHECK(e.rfind("loom: ", 0) == 0);
  CHECK(e.find("training needs a training dataset") != std::string::npos);
  CHECK(error_of([&] { none.evaluate(); }).find("evaluate() needs an evaluation dataset") != std::string::npos);

  Classifier<> eval_only(args, loom_test::fresh_model(), loom::no_train_dataset, test);
  CHECK(eval_only.evaluate().get("eval_loss").value() ==
        doctest::Approx(mean_loss(eval_only.model(), test)).epsilon(1e-6));
  CHECK(eval_only.is_world_process_zero());
  CHECK(eval_only.is_local_process_zero());
  CHECK(eval_only.num_examples(eval_only.get_eval_dataloader(loom::data::AnyDataset<Batch>(test))) == 20);
}

TEST_CASE("metrics_format and log_metrics print what transformers prints") {
  loom::Metrics m{{"train_runtime", 3725.4567},
                  {"train_samples_per_second", 1234.56789},
                  {"train_mem_cpu_alloc_delta", 5.0 * (1 << 20) + 3},
                  {"train_mem_gpu_peaked_delta", 0.0},
                  {"total_flos", 3.0 * (1LL << 30) + 17},
                  {"epoch", 3.0},
                  {"eval_accuracy", 0.871234567},
                  {"tiny", 1.234e-05},
                  {"eval_runtime", 0.5}};
  const auto rows = loom::metrics_format(m);
  REQUIRE(rows.size() == m.size());
  CHECK(rows[0] == std::pair<std::string, std::string>{"train_runtime", "1:02:05.45"});
  CHECK(rows[2].second == "5MB");
  CHECK(rows[4].second == "3GF");
  CHECK(rows[5].second == "3.0");
  CHECK(rows[6].second == "0.8712");
  const std::string ours = loom::format_metrics_report("train", m);
  // transformers' own log_metrics, on the same values (memory as the ints HF measures).
  const char* py = loom_test::python("the comparison with transformers.trainer_pt_utils.log_metrics");
  if (py == nullptr) return;
  const auto script = loom_test::fresh_dir("api/metrics_format") / "log_metrics.py";
  std::ofstream(script) << R"(
from transformers.trainer_pt_utils import log_metrics
class T:
    def is_world_process_zero(self): return True
log_metrics(T(), "train", {"train_runtime": 3725.4567, "train_samples_per_second": 1234.56789,
    "train_mem_cpu_alloc_delta": 5 * 2**20 + 3, "train_mem_gpu_peaked_delta": 0,
    "total_flos": 3.0 * 2**30 + 17, "epoch": 3.0, "eval_accuracy": 0.871234567, "tiny": 1.234e-05,
    "eval_runtime": 0.5})
)";
  const auto theirs = loom_test::run_capture(std::string(py) + " " + script.string() + " 2>/dev/null");
  CHECK(ours == theirs);
}

TEST_CASE("the compiled policies are written back into the arguments; a flag that disagrees is an error") {
  // A compiled schedule takes the place of the default --lr_scheduler_type.
  Classifier<loom::schedule::Cosine> cosine(quiet_args("api/policies"), loom_test::fresh_model(), make_data(8, 1));
  CHECK(cosine.args().lr_scheduler_type == "cosine");
  auto args = quiet_args("api/policies");
  args.lr_scheduler_type = "polynomial";
  const auto e = error_of([&] { Classifier<loom::schedule::Cosine> t(args, loom_test::fresh_model(), make_data(8, 1)); });
  CHECK(e.rfind("loom: --lr_scheduler_type polynomial disagrees with the Trainer's compiled schedule \"cosine\"", 0) == 0);
  args.lr_scheduler_type = "cosine";  // the same name is fine
  Classifier<loom::schedule::Cosine> same(args, loom_test::fresh_model(), make_data(8, 1));
  CHECK(same.args().lr_scheduler_type == "cosine");
  // The run-time choice (the default FromArgs) keeps the flag.
  args.lr_scheduler_type = "polynomial";
  Classifier<> from_args(args, loom_test::fresh_model(), make_data(8, 1));
  CHECK(from_args.args().lr_scheduler_type == "polynomial");
  // A compiled precision (already so before) and the sharding name reach training_args.json.
  auto bf = quiet_args("api/policies_bf16");
  bf.max_steps = 1;
  bf.save_strategy = "steps";
  bf.save_steps = 1;
  Classifier<loom::precision::BF16, loom::schedule::Constant> t(bf, loom_test::fresh_model(), make_data(8, 1));
  t.train();
  const auto saved = read_json(fs::path(bf.output_dir) / "checkpoint-1" / "training_args.json");
  CHECK(saved.at("bf16") == true);
  CHECK(saved.at("lr_scheduler_type") == "constant");
  CHECK(saved.at("sharding") == "no");
  // A sharding flag for another Trainer type.
  auto ddp = quiet_args("api/policies_ddp");
  ddp.sharding = "zero2";
  CHECK(error_of([&] { Classifier<> c(ddp, loom_test::fresh_model(), make_data(8, 1)); })
            .rfind("loom: --sharding zero2 is not available in this build; the Trainer's sharding policy is \"no\"", 0) == 0);
}

TEST_CASE("a flag given on the command line disagrees with a compiled policy even at its default value") {
  // The parser records the flags it was given (TrainingArguments::given), so an explicit
  // `--lr_scheduler_type linear` (HF's default) is told from a flag left out.
  auto with_flags = [](const std::string& name, std::vector<std::string> flags) {
    const auto parsed = loom::try_parse_args(std::span<const std::string>(flags),
                                             std::tuple<loom::TrainingArguments>{quiet_args(name)});
    return std::get<0>(parsed.values);
  };
  const auto linear = with_flags("api/given_linear", {"--lr_scheduler_type", "linear"});
  CHECK(error_of([&] { Classifier<loom::schedule::Cosine> t(linear, loom_test::fresh_model(), make_data(8, 1)); })
            .rfind("loom: --lr_scheduler_type linear disagrees with the Trainer's compiled schedule \"cosine\"", 0) == 0);
  // Left out, the compiled schedule is taken; under FromArgs the explicit default is simply used.
  Classifier<loom::schedule::Cosine> cosine(with_flags("api/given_none", {}), loom_test::fresh_model(), make_data(8, 1));
  CHECK(cosine.args().lr_scheduler_type == "cosine");
  Classifier<> from_args(linear, loom_test::fresh_model(), make_data(8, 1));
  CHECK(from_args.args().lr_scheduler_type == "linear");
  // `--bf16 false` for a Trainer compiled with BF16; the same flag agrees with an FP32 one.
  const auto no_bf16 = with_flags("api/given_bf16", {"--bf16", "false"});
  CHECK(error_of([&] { Classifier<loom::precision::BF16> t(no_bf16, loom_test::fresh_model(), make_data(8, 1)); })
            .rfind("loom: --bf16 false disagrees with this Trainer's compiled precision::BF16", 0) == 0);
  Classifier<> fp32(no_bf16, loom_test::fresh_model(), make_data(8, 1));
  CHECK_FALSE(fp32.args().bf16);
  // An explicit --sharding of another policy was already refused; `auto` leaves the choice.
  Classifier<> automatic(with_flags("api/given_auto", {"--sharding", "auto"}), loom_test::fresh_model(), make_data(8, 1));
  CHECK(automatic.args().sharding == "no");
}

}  // namespace trainer_test_api
