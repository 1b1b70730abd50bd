#pragma once
// Best-model tracking (HF's _determine_best_metric and the best_model_checkpoint bookkeeping
// of _save_checkpoint). The values live in TrainerState, so they are checkpointed with it.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

namespace loom {

class BestModel {
 public:
  explicit BestModel(const TrainingArguments& args) : args_(&args) {}
  /// After an evaluation: records best_metric / best_global_step when `metrics` improve on
  /// them (metric_for_best_model, greater_is_better). True when improved.
  LOOM_INLINE bool update(const Metrics& metrics, TrainerState& state) const;
  /// Before a save: points best_model_checkpoint at the best step's folder once it exists.
  LOOM_INLINE void before_save(TrainerState& state) const;

 private:
  const TrainingArguments* args_;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/best_model.ipp>
#endif
