#pragma once
// What a callback receives besides (args, state, control), and the run-time callback.
//
// CallbackArgs is HF's callback keyword arguments (model, optimizer, lr_scheduler, the data
// loaders, metrics / logs). A compile-time callback (the Callbacks<...> pack) receives it by
// taking it as its event's fourth parameter; a run-time callback (TrainerCallback, added with
// Trainer::add_callback) always does. Run-time callbacks are a list of virtual objects: the
// way to add, remove or replace a callback while the program runs, at the price of one
// virtual call per event and callback.

#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace torch::nn {
class Module;
}

namespace loom {

namespace optim {
class Optimizer;
}
namespace schedule {
class LRSchedulerBase;
}

/// A data loader as a callback sees it (HF passes the DataLoader itself).
struct LoaderInfo {
  int64_t batches = 0;     ///< batches per epoch on this rank (len(dataloader))
  int64_t examples = 0;    ///< examples in its dataset
  int64_t batch_size = 0;  ///< rows per full batch
};

/// HF's callback keyword arguments. A pointer is null where HF's value would be None: the
/// optimizer and scheduler before train() creates them, the training loader outside
/// train(), the evaluation loader outside an evaluation, metrics except on on_evaluate /
/// on_predict, logs except on on_log.
struct CallbackArgs {
  torch::nn::Module* model = nullptr;                 ///< the model's module
  optim::Optimizer* optimizer = nullptr;              ///< the optimizer (this rank's, when sharded)
  schedule::LRSchedulerBase* lr_scheduler = nullptr;  ///< the learning-rate scheduler
  const LoaderInfo* train_dataloader = nullptr;       ///< the training loader
  const LoaderInfo* eval_dataloader = nullptr;        ///< the loader of the running evaluation
  const Metrics* metrics = nullptr;                   ///< on_evaluate, on_predict
  const Metrics* logs = nullptr;                      ///< on_log
};

/// A callback added at run time (HF's TrainerCallback): override the events you need. With a
/// non-empty state_name() it is stateful: state() is saved in trainer_state.json's
/// stateful_callbacks under that name and load_state() gets it back on resume (with
/// --restore_callback_states_from_checkpoint).
class TrainerCallback {
 public:
  using Args = TrainingArguments;
  virtual ~TrainerCallback() = default;

  virtual void on_init_end(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_train_begin(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_epoch_begin(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_step_begin(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_substep_end(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_pre_optimizer_step(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_optimizer_step(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_step_end(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_epoch_end(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_train_end(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_evaluate(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_predict(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_prediction_step(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_save(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}
  virtual void on_log(const Args&, TrainerState&, TrainerControl&, const CallbackArgs&) {}

  /// The key of this callback's state in stateful_callbacks; empty: not stateful.
  [[nodiscard]] virtual std::string state_name() const { return {}; }
  /// The state to checkpoint (called when state_name() is not empty).
  [[nodiscard]] virtual nlohmann::json state() const { return nlohmann::json::object(); }
  /// Restores what state() returned.
  virtual void load_state(const nlohmann::json&) {}
};

}  // namespace loom
