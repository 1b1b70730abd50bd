#pragma once
// HF "reduce_lr_on_plateau": torch.optim.lr_scheduler.ReduceLROnPlateau, stepped with the
// evaluation metric (metric_for_best_model) after each evaluation, not per optimizer step.
// kwargs and defaults as torch: mode "min", factor 0.1, patience 10, threshold 1e-4,
// threshold_mode "rel", cooldown 0, min_lr 0, eps 1e-8. Warmup does not apply (as in HF).
#include <loom/config/inline.hpp>
#include <loom/schedule/schedule_decl.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>

namespace loom::schedule {

/// The plateau rule, with its state.
struct PlateauState {
  bool maximize = false;
  double factor = 0.1, threshold = 1e-4, min_lr = 0.0, eps = 1e-8;
  bool relative = true;
  int64_t patience = 10, cooldown = 0;
  // state
  double lr = 0.0, best = std::numeric_limits<double>::infinity();
  int64_t num_bad_epochs = 0, cooldown_counter = 0, last_epoch = 0;

  /// Reads the kwargs; `lr` starts at the peak rate.
  static PlateauState configure(const ScheduleParams& p);
  [[nodiscard]] bool is_better(double a) const;
  /// One evaluation's metric.
  void step(double metric);
  [[nodiscard]] nlohmann::json to_json() const;
  void from_json(const nlohmann::json& j);
};

/// ReduceLROnPlateau as a compile-time schedule policy.
template <>
class LRScheduler<ReduceLROnPlateau> : public LRSchedulerBase {
 public:
  explicit LRScheduler(ScheduleParams params);
  /// The current rate (changes only in step_metric).
  [[nodiscard]] double current_lr() const { return plateau_.lr; }
  /// Feeds one evaluation's metric_for_best_model value.
  void step_metric(double metric) { plateau_.step(metric); }
  /// True: stepped with metric_for_best_model after each evaluation.
  [[nodiscard]] bool wants_metric() const { return true; }
  [[nodiscard]] nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& j);

 private:
  PlateauState plateau_;
};

}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/reduce_lr_on_plateau.ipp>
#endif
