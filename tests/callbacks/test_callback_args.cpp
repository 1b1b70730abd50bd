// HF's callback keyword arguments (model, optimizer, lr_scheduler, data loaders, metrics,
// logs) and the run-time callback list: add_callback / pop_callback / remove_callback, the
// printer switched off and replaced, a stateful run-time callback checkpointed.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <memory>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace callbacks_test_callback_args {

namespace {

using loom_test::Batch;
using loom_test::quiet_args;

// A compiled callback that takes the keyword arguments.
struct Spy {
  std::vector<std::string> seen;
  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&,
                      const loom::CallbackArgs& kw) {
    seen.push_back(std::string("train_begin:") + (kw.model ? "model" : "-") + (kw.optimizer ? ",optimizer" : ",-") +
                   (kw.lr_scheduler ? ",scheduler" : ",-") +
                   (kw.train_dataloader ? ",train:" + std::to_string(kw.train_dataloader->batches) : ",-"));
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&,
                   const loom::CallbackArgs& kw) {
    // The optimizer and the scheduler as the Trainer steps them.
    seen.push_back("step:" + std::to_string(s.global_step) + ",steps=" + std::to_string(kw.optimizer->steps()) +
                   ",scheduler_steps=" + std::to_string(kw.lr_scheduler->step_count()));
  }
  void on_log(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&, const loom::CallbackArgs& kw) {
    REQUIRE(kw.logs != nullptr);
    CHECK(kw.metrics == nullptr);
    if (kw.logs->contains("loss")) seen.push_back("log:loss");
  }
  void on_evaluate(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&,
                   const loom::CallbackArgs& kw) {
    REQUIRE(kw.metrics != nullptr);
    REQUIRE(kw.eval_dataloader != nullptr);
    seen.push_back("evaluate:" + std::to_string(kw.metrics->contains("eval_loss")) + ",eval_batches=" +
                   std::to_string(kw.eval_dataloader->batches) + ",examples=" +
                   std::to_string(kw.eval_dataloader->examples));
  }
};

// A run-time callback that counts events and stops training at a step; stateful.
struct Counter : loom::TrainerCallback {
  int steps = 0, logs = 0, evaluations = 0;
  int64_t stop_at = -1;
  void on_step_end(const Args&, loom::TrainerState& s, loom::TrainerControl& c, const loom::CallbackArgs& kw) override {
    ++steps;
    CHECK(kw.model != nullptr);
    if (s.global_step == stop_at) c.should_training_stop = true;
  }
  void on_log(const Args&, loom::TrainerState&, loom::TrainerControl&, const loom::CallbackArgs& kw) override {
    if (kw.logs) ++logs;
  }
  void on_evaluate(const Args&, loom::TrainerState&, loom::TrainerControl&, const loom::CallbackArgs&) override {
    ++evaluations;
  }
  [[nodiscard]] std::string state_name() const override { return "Counter"; }
  [[nodiscard]] nlohmann::json state() const override { return {{"steps", steps}}; }
  void load_state(const nlohmann::json& j) override { steps = j.at("steps").get<int>(); }
};

// A replacement printer: one line per log.
struct MyPrinter : loom::TrainerCallback {
  std::vector<std::string> lines;
  void on_log(const Args&, loom::TrainerState& s, loom::TrainerControl&, const loom::CallbackArgs& kw) override {
    lines.push_back("step " + std::to_string(s.global_step) + ": " + std::to_string(kw.logs->size()) + " values");
  }
};

struct T : loom::Trainer<T, torch::nn::Linear, loom::Callbacks<Spy>> {
  using Trainer::Trainer;
  loom::ModelOutput compute_loss(torch::nn::Linear& m, Batch& b) { return loom_test::cross_entropy(m, b); }
};

}  // namespace

TEST_CASE("callbacks receive HF's keyword arguments") {
  auto args = quiet_args("callbacks/kwargs");
  args.max_steps = 2;
  args.per_device_train_batch_size = 8;
  args.per_device_eval_batch_size = 5;
  args.logging_steps = 2;
  args.eval_strategy = "steps";
  args.eval_steps = 2;
  args.lr_scheduler_type = "constant";
  T t(args, loom_test::fresh_model(), loom_test::linear_data(32, 1), loom_test::linear_data(12, 2));
  CHECK(t.callback_args().model != nullptr);
  CHECK(t.callback_args().optimizer == nullptr);  // created by train()
  t.train();
  const auto& seen = t.callback<Spy>().seen;
  REQUIRE(seen.size() == 5);
  CHECK(seen[0] == "train_begin:model,optimizer,scheduler,train:4");
  CHECK(seen[1] == "step:1,steps=1,scheduler_steps=1");
  CHECK(seen[2] == "step:2,steps=2,scheduler_steps=2");
  CHECK(seen[3] == "log:loss");
  CHECK(seen[4] == "evaluate:1,eval_batches=3,examples=12");
}

TEST_CASE("run-time callbacks: add, pop, remove; the printer switched off and replaced; state checkpointed") {
  auto args = quiet_args("callbacks/runtime");
  args.max_steps = 6;
  args.per_device_train_batch_size = 8;
  args.logging_steps = 1;
  args.save_strategy = "steps";
  args.save_steps = 2;
  T t(args, loom_test::fresh_model(), loom_test::linear_data(32, 1));
  auto counter = std::make_shared<Counter>();
  counter->stop_at = 4;
  t.add_callback(counter);
  t.add_callback<MyPrinter>();
  t.remove_callback<loom::ProgressCallback>();  // HF's remove_callback(PrinterCallback)
  CHECK(t.runtime_callbacks().size() == 2);
  t.train();
  CHECK(t.state().global_step == 4);  // the run-time callback stopped training
  CHECK(counter->steps == 4);
  CHECK(counter->logs == 5);  // 4 step logs + the train summary
  // The printer was replaced: the compiled one is off, the run-time one printed every log.
  auto printer = t.pop_callback<MyPrinter>();
  REQUIRE(printer != nullptr);
  CHECK(printer->lines.size() == 5);
  CHECK(printer->lines[0] == "step 1: 4 values");  // loss, grad_norm, learning_rate, epoch
  CHECK(t.pop_callback<MyPrinter>() == nullptr);
  CHECK(t.runtime_callbacks().size() == 1);
  // The stateful run-time callback is in trainer_state.json.
  const auto state = nlohmann::json::parse(loom_test::read_bytes(std::filesystem::path(args.output_dir) /
                                                                 "checkpoint-4" / "trainer_state.json"));
  CHECK(state.at("stateful_callbacks").at("Counter").at("steps") == 4);
  // ... and restored on resume with --restore_callback_states_from_checkpoint.
  auto resume = args;
  resume.resume_from_checkpoint = (std::filesystem::path(args.output_dir) / "checkpoint-2").string();
  resume.restore_callback_states_from_checkpoint = true;
  resume.output_dir = loom_test::tmp_dir("callbacks/runtime_resume").string();
  T r(resume, loom_test::fresh_model(), loom_test::linear_data(32, 1));
  auto restored = std::make_shared<Counter>();
  r.add_callback(restored);
  r.train();
  CHECK(restored->steps == 2 + 4);  // 2 from checkpoint-2, then steps 3..6
  // remove_callback by pointer; add_callback<Compiled> switches it back on.
  r.remove_callback(restored);
  CHECK(r.runtime_callbacks().empty());
  r.remove_callback<Spy>();
  r.add_callback<Spy>();
}

}  // namespace callbacks_test_callback_args
