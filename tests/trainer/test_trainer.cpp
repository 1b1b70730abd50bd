// The training loop end to end on small synthetic problems: falling loss, HF's log keys
// and values, evaluation metrics, step/epoch accounting, output files, event order,
// gradient accumulation equal to one large batch, start-up errors.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <filesystem>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_trainer {

namespace {

using loom_test::Batch;
using loom_test::Classifier;
using loom_test::fresh_model;
using loom_test::linear_data;
using loom_test::quiet_args;
using loom_test::tmp_dir;

struct EventLog {
  std::vector<std::string>* out = nullptr;
  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("train_begin"); }
  void on_epoch_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("epoch_begin"); }
  void on_step_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("step_begin"); }
  void on_substep_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("substep_end"); }
  void on_pre_optimizer_step(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("pre_opt"); }
  void on_optimizer_step(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("opt"); }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&) {
    out->push_back("step_end:" + std::to_string(s.global_step));
  }
  void on_epoch_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("epoch_end"); }
  void on_log(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&, const loom::Metrics& m) {
    out->push_back(m.contains("loss") ? "log:loss" : m.contains("eval_loss") ? "log:eval" : "log:train");
  }
  void on_evaluate(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("evaluate"); }
  void on_train_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { out->push_back("train_end"); }
};

}  // namespace

TEST_CASE("training lowers the loss and logs HF's keys with the right values") {
  auto args = quiet_args("falls");
  args.learning_rate = 0.05;
  args.max_steps = 60;
  args.logging_steps = 10;
  args.per_device_train_batch_size = 16;
  args.warmup_steps = 5;
  Classifier<> t(args, fresh_model(), linear_data(512, 1));
  auto out = t.train();
  const auto& h = t.state().log_history;
  REQUIRE(h.size() == 7);  // 6 logging steps + the final train metrics
  for (int i = 0; i < 6; ++i) {
    const auto& e = h[i];
    std::vector<std::string> keys;
    for (auto it = e.begin(); it != e.end(); ++it) keys.push_back(it.key());
    CHECK(keys == std::vector<std::string>{"loss", "grad_norm", "learning_rate", "epoch", "step"});
    CHECK(e["step"].get<int64_t>() == 10 * (i + 1));
    // learning_rate is the one the logged step used: linear schedule at step - 1.
    const double step_used = static_cast<double>(10 * (i + 1) - 1);
    CHECK(e["learning_rate"].get<double>() == doctest::Approx(0.05 * (60 - step_used) / 55.0));
    CHECK(e["grad_norm"].get<double>() > 0);
  }
  CHECK(h[5]["loss"].get<double>() < 0.6 * h[0]["loss"].get<double>());
  CHECK(out.global_step == 60);
  // epoch is fractional: 512 / 16 = 32 batches per epoch.
  CHECK(h[0]["epoch"].get<double>() == doctest::Approx(10.0 / 32));
  // train_loss is the mean of every step's loss = mean of the six logged window means.
  double mean = 0;
  for (int i = 0; i < 6; ++i) mean += h[i]["loss"].get<double>() / 6;
  CHECK(out.training_loss == doctest::Approx(mean).epsilon(1e-5));
  for (const char* k : {"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "epoch"})
    CHECK(out.metrics.contains(k));
  CHECK(out.metrics.get("train_samples_per_second").value() > 0);
}

TEST_CASE("evaluation: eval_loss is weighted by batch size; metrics get the eval_ prefix") {
  auto args = quiet_args("eval");
  args.per_device_eval_batch_size = 64;  // 200 rows: 64, 64, 64, 8
  auto train = linear_data(64, 2);
  auto eval = linear_data(200, 3);
  auto eval_copy = eval;
  Classifier<> t(args, fresh_model(), train, eval);
  auto m = t.evaluate();
  auto& model = t.model();
  torch::NoGradGuard g;
  auto logits = model->forward(eval_copy.tensors().x);
  const double loss = torch::cross_entropy_loss(logits, eval_copy.tensors().labels).item<double>();
  const double acc = logits.argmax(1).eq(eval_copy.tensors().labels).to(torch::kDouble).mean().item<double>();
  CHECK(m.get("eval_loss").value() == doctest::Approx(loss).epsilon(1e-5));
  CHECK(m.get("eval_accuracy").value() == doctest::Approx(acc));
  std::vector<std::string> keys;
  for (const auto& [k, v] : m) keys.push_back(k);
  // ... and, as HF's log() adds it to the caller's dict, the epoch (issue 14).
  CHECK(keys == std::vector<std::string>{"eval_accuracy", "eval_loss", "eval_runtime", "eval_samples_per_second",
                                         "eval_steps_per_second", "epoch"});
  // evaluate() logs, with the epoch.
  REQUIRE(t.state().log_history.size() == 1);
  CHECK(t.state().log_history[0].contains("epoch"));
}

TEST_CASE("epochs, steps and the output files follow HF") {
  auto args = quiet_args("epochs");
  args.num_train_epochs = 2;
  args.per_device_train_batch_size = 10;  // 95 rows -> 10 batches per epoch (last has 5)
  args.logging_steps = 5;
  args.eval_strategy = "epoch";
  Classifier<> t(args, fresh_model(), linear_data(95, 4), linear_data(30, 5));
  auto out = t.train();
  CHECK(out.global_step == 20);
  CHECK(t.state().max_steps == 20);
  CHECK(t.state().epoch == doctest::Approx(2.0));
  const std::filesystem::path dir(args.output_dir);
  auto state = loom::TrainerState::load(dir / "trainer_state.json");
  CHECK(state.global_step == 20);
  CHECK(state.log_history.size() == t.state().log_history.size());
  // 4 loss logs + 2 evaluations + train metrics
  CHECK(state.log_history.size() == 7);
  CHECK(state.log_history[2].contains("eval_accuracy"));
  CHECK(std::filesystem::exists(dir / "all_results.json"));
  CHECK(std::filesystem::exists(dir / "train_results.json"));
  // drop_last drops the 5-row batch: 9 steps per epoch.
  args.dataloader_drop_last = true;
  args.output_dir = tmp_dir("epochs_drop").string();
  args.eval_strategy = "no";
  Classifier<> t2(args, fresh_model(), linear_data(95, 4));
  CHECK(t2.train().global_step == 18);
}

TEST_CASE("events fire in HF's order, including accumulation sub-steps") {
  std::vector<std::string> events;
  auto args = quiet_args("events");
  args.per_device_train_batch_size = 4;
  args.gradient_accumulation_steps = 2;
  args.max_steps = 2;
  args.logging_steps = 2;
  args.eval_strategy = "steps";
  args.eval_steps = 2;
  Classifier<loom::Callbacks<EventLog>> t(args, fresh_model(), linear_data(32, 6), linear_data(8, 7));
  t.callback<EventLog>().out = &events;
  t.train();
  const std::vector<std::string> expected{
      "train_begin", "epoch_begin",
      "step_begin", "substep_end", "pre_opt", "opt", "step_end:1",
      "step_begin", "substep_end", "pre_opt", "opt", "step_end:2",
      "log:loss", "log:eval", "evaluate",
      "epoch_end", "log:train", "train_end"};
  CHECK(events == expected);
}

TEST_CASE("gradient accumulation: 4 x 8 equals one batch of 32 (fp32)") {
  auto run = [](int64_t batch, int64_t accumulation, const std::string& name) {
    Classifier<> t(loom_test::accumulation_args(name, batch, accumulation, 0.01), fresh_model(), linear_data(96, 8));
    t.train();
    return loom_test::weights(t.model());  // weight, bias
  };
  auto big = run(32, 1, "ga_big");
  auto small = run(8, 4, "ga_small");
  for (std::size_t i = 0; i < big.size(); ++i) CHECK(torch::allclose(big[i], small[i], 1e-6, 1e-7));
}

TEST_CASE("a model whose forward takes the batch needs no subclass") {
  struct LossModelImpl : torch::nn::Module {
    LossModelImpl() : fc(register_module("fc", torch::nn::Linear(4, 3))) {}
    torch::Tensor forward(Batch b) { return torch::cross_entropy_loss(fc->forward(b.x), b.labels); }
    torch::nn::Linear fc;
  };
  TORCH_MODULE(LossModel);
  auto args = quiet_args("default_trainer");
  args.max_steps = 20;
  args.learning_rate = 0.05;
  args.logging_steps = 5;
  torch::manual_seed(1);
  loom::DefaultTrainer<LossModel> t(args, LossModel{}, linear_data(128, 9));
  t.train();
  const auto& h = t.state().log_history;
  CHECK(h[3]["loss"].get<double>() < h[0]["loss"].get<double>());
}

TEST_CASE("bad arguments and data stop at start-up with one loom: line") {
  auto args = quiet_args("bad");
  args.per_device_train_batch_size = 0;
  CHECK_THROWS_WITH_AS(Classifier<>(args, fresh_model(), linear_data(8, 1)),
                       doctest::Contains("loom: --per_device_train_batch_size"), loom::Error);
  args = quiet_args("bad_sharding");
  args.sharding = "ddp";
  CHECK_THROWS_WITH_AS(Classifier<>(args, fresh_model(), linear_data(8, 1)),
                       doctest::Contains("loom: --sharding ddp is not available in this build; the Trainer's sharding "
                                         "policy is \"no\""),
                       loom::Error);
  args = quiet_args("bad2");
  args.per_device_train_batch_size = 16;
  args.dataloader_drop_last = true;
  Classifier<> t(args, fresh_model(), linear_data(8, 1));
  CHECK_THROWS_WITH_AS(t.train(), doctest::Contains("loom: the training set yields no batch"), loom::Error);
  args = quiet_args("bad3");
  Classifier<> no_eval(args, fresh_model(), linear_data(8, 1));
  CHECK_THROWS_WITH_AS(no_eval.evaluate(), doctest::Contains("loom: evaluate() needs an evaluation dataset"),
                       loom::Error);
}

}  // namespace trainer_test_trainer
