#pragma once
// DefaultFlowCallback: turns the logging/eval/save strategies into TrainerControl flags,
// with the exact conditions of transformers.DefaultFlowCallback.

#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

namespace loom {

/// Sets should_log / should_evaluate / should_save / should_training_stop as HF does.
struct DefaultFlowCallback {
  /// After every optimizer step.
  void on_step_end(const TrainingArguments& args, TrainerState& state, TrainerControl& control) const {
    if (state.global_step == 1 && args.logging_first_step) control.should_log = true;
    if (args.logging_strategy == "steps" && state.logging_steps > 0 &&
        state.global_step % state.logging_steps == 0)
      control.should_log = true;
    if (args.eval_strategy == "steps" && state.eval_steps > 0 && state.global_step % state.eval_steps == 0 &&
        args.eval_delay <= state.global_step)
      control.should_evaluate = true;
    if (args.save_strategy == "steps" && state.save_steps > 0 && state.global_step % state.save_steps == 0)
      control.should_save = true;
    if (state.global_step >= state.max_steps) {
      control.should_training_stop = true;
      if (args.save_strategy == "steps") control.should_save = true;
    }
  }
  /// After every epoch.
  void on_epoch_end(const TrainingArguments& args, TrainerState& state, TrainerControl& control) const {
    if (args.logging_strategy == "epoch") control.should_log = true;
    if (args.eval_strategy == "epoch" && static_cast<double>(args.eval_delay) <= state.epoch)
      control.should_evaluate = true;
    if (args.save_strategy == "epoch") control.should_save = true;
  }
};

}  // namespace loom
