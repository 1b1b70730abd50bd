#pragma once
#include <loom/checkpoint/folders.hpp>
#include <loom/core/error.hpp>
#include <loom/trainer/best_model.hpp>

namespace loom {

LOOM_INLINE bool BestModel::update(const Metrics& metrics, TrainerState& state) const {
  const auto& args = *args_;
  if (!args.metric_for_best_model) return false;
  std::string key = *args.metric_for_best_model;
  if (key.rfind("eval_", 0) != 0) key = "eval_" + key;
  const auto value = metrics.get(key);
  if (!value) {
    std::string known;
    for (const auto& [k, v] : metrics) known += (known.empty() ? "" : ", ") + k;
    fail("--metric_for_best_model {}: evaluation produced no {} (it produced {})", *args.metric_for_best_model, key,
         known);
  }
  const bool greater = args.greater_is_better.value_or(true);
  if (state.best_metric && !(greater ? *value > *state.best_metric : *value < *state.best_metric)) return false;
  state.best_metric = *value;
  state.best_global_step = state.global_step;
  return true;
}

LOOM_INLINE void BestModel::before_save(TrainerState& state) const {
  if (!args_->metric_for_best_model || !state.best_global_step) return;
  const auto best = checkpoint::checkpoint_dir(args_->output_dir, *state.best_global_step);
  if (*state.best_global_step == state.global_step || std::filesystem::exists(best))
    state.best_model_checkpoint = best.string();
}

}  // namespace loom
