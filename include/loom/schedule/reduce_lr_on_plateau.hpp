#pragma once
// HF "reduce_lr_on_plateau": torch.optim.lr_scheduler.ReduceLROnPlateau, stepped with the
// evaluation metric (metric_for_best_model) after each evaluation, not per optimizer step.
// kwargs and defaults as torch: mode "min", factor 0.1, patience 10, threshold 1e-4,
// threshold_mode "rel", cooldown 0, min_lr 0, eps 1e-8. Warmup does not apply (as in HF).
#include <loom/schedule/schedule_decl.hpp>

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
  static PlateauState configure(const ScheduleParams& p) {
    Kwargs k(p.kwargs, ReduceLROnPlateau::name,
             {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"});
    PlateauState s;
    s.maximize = k.choice("mode", "min", {"min", "max"}) == "max";
    s.factor = k.number("factor", 0.1);
    s.patience = static_cast<int64_t>(k.number("patience", 10));
    s.threshold = k.number("threshold", 1e-4);
    s.relative = k.choice("threshold_mode", "rel", {"rel", "abs"}) == "rel";
    s.cooldown = static_cast<int64_t>(k.number("cooldown", 0));
    s.min_lr = k.number("min_lr", 0.0);
    s.eps = k.number("eps", 1e-8);
    check(s.factor < 1.0 && s.factor >= 0.0, "reduce_lr_on_plateau: factor must be in [0, 1), got {}", s.factor);
    s.lr = p.base_lr;
    s.best = s.maximize ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
    return s;
  }
  [[nodiscard]] bool is_better(double a) const {
    if (!maximize) return relative ? a < best * (1.0 - threshold) : a < best - threshold;
    return relative ? a > best * (1.0 + threshold) : a > best + threshold;
  }
  /// One evaluation's metric.
  void step(double metric) {
    ++last_epoch;
    if (is_better(metric)) {
      best = metric;
      num_bad_epochs = 0;
    } else {
      ++num_bad_epochs;
    }
    if (cooldown_counter > 0) {
      --cooldown_counter;
      num_bad_epochs = 0;
    }
    if (num_bad_epochs > patience) {
      const double reduced = std::max(lr * factor, min_lr);
      if (lr - reduced > eps) lr = reduced;
      cooldown_counter = cooldown;
      num_bad_epochs = 0;
    }
  }
  [[nodiscard]] nlohmann::json to_json() const {
    return {{"best", best}, {"num_bad_epochs", num_bad_epochs}, {"cooldown_counter", cooldown_counter},
            {"last_epoch", last_epoch}, {"_last_lr", {lr}}};
  }
  void from_json(const nlohmann::json& j) {
    best = j.at("best").get<double>();
    num_bad_epochs = j.at("num_bad_epochs").get<int64_t>();
    cooldown_counter = j.at("cooldown_counter").get<int64_t>();
    last_epoch = j.at("last_epoch").get<int64_t>();
    lr = j.at("_last_lr").at(0).get<double>();
  }
};

/// ReduceLROnPlateau as a compile-time schedule policy.
template <>
class LRScheduler<ReduceLROnPlateau> : public LRSchedulerBase {
 public:
  explicit LRScheduler(ScheduleParams params)
      : LRSchedulerBase(std::move(params)), plateau_(PlateauState::configure(this->params())) {}
  /// The current rate (changes only in step_metric).
  [[nodiscard]] double current_lr() const { return plateau_.lr; }
  /// Feeds one evaluation's metric_for_best_model value.
  void step_metric(double metric) { plateau_.step(metric); }
  /// True: stepped with metric_for_best_model after each evaluation.
  [[nodiscard]] bool wants_metric() const { return true; }
  [[nodiscard]] nlohmann::json state_dict() const {
    auto j = LRSchedulerBase::state_dict();
    j["plateau"] = plateau_.to_json();
    return j;
  }
  void load_state_dict(const nlohmann::json& j) {
    LRSchedulerBase::load_state_dict(j);
    plateau_.from_json(j.at("plateau"));
  }

 private:
  PlateauState plateau_;
};

}  // namespace loom::schedule
