#pragma once
// DefaultFlowCallback: turns the logging/eval/save strategies into TrainerControl flags,
// with the exact conditions of transformers.DefaultFlowCallback.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

namespace loom {

/// Sets should_log / should_evaluate / should_save / should_training_stop as HF does.
struct DefaultFlowCallback {
  /// After every optimizer step.
  void on_step_end(const TrainingArguments& args, TrainerState& state, TrainerControl& control) const;
  /// After every epoch.
  void on_epoch_end(const TrainingArguments& args, TrainerState& state, TrainerControl& control) const;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/default_flow.ipp>
#endif
