#pragma once
// Definitions of callbacks/default_flow.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/default_flow.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

namespace loom {

LOOM_INLINE void DefaultFlowCallback::on_step_end(const TrainingArguments& args, TrainerState& state,
                                                  TrainerControl& control) const {
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
    // The last step is evaluated under eval_strategy steps even off the interval (HF 5).
    if (args.eval_strategy == "steps" && state.eval_steps > 0 && state.global_step % state.eval_steps != 0 &&
        args.eval_delay <= state.global_step)
      control.should_evaluate = true;
    if (args.save_strategy == "steps") control.should_save = true;
  }
}

LOOM_INLINE void DefaultFlowCallback::on_epoch_end(const TrainingArguments& args, TrainerState& state,
                                                   TrainerControl& control) const {
  if (args.logging_strategy == "epoch") control.should_log = true;
  if (args.eval_strategy == "epoch" && static_cast<double>(args.eval_delay) <= state.epoch)
    control.should_evaluate = true;
  if (args.save_strategy == "epoch") control.should_save = true;
}

}  // namespace loom
