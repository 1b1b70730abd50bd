#pragma once
// Definitions of schedule/reduce_lr_on_plateau.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/schedule/reduce_lr_on_plateau.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

namespace loom::schedule {

LOOM_INLINE PlateauState PlateauState::configure(const ScheduleParams& p) {
  Kwargs k(p.kwargs, ReduceLROnPlateau::name,
           {"mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "min_lr", "eps"});
  PlateauState s;
  s.maximize = k.choice("mode", "min", {"min", "max"}) == "max";
  s.factor = k.number("factor", 0.1);
  s.patience = k.count("patience", 10);
  s.threshold = k.number("threshold", 1e-4, kNonNegative);
  s.relative = k.choice("threshold_mode", "rel", {"rel", "abs"}) == "rel";
  s.cooldown = k.count("cooldown", 0);
  s.min_lr = k.number("min_lr", 0.0, kNonNegative);
  s.eps = k.number("eps", 1e-8, kNonNegative);
  check(s.factor < 1.0 && s.factor >= 0.0, "reduce_lr_on_plateau: factor must be in [0, 1), got {}", s.factor);
  s.lr = p.base_lr;
  s.best = s.maximize ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  return s;
}

LOOM_INLINE bool PlateauState::is_better(double a) const {
  if (!maximize) return relative ? a < best * (1.0 - threshold) : a < best - threshold;
  return relative ? a > best * (1.0 + threshold) : a > best + threshold;
}

LOOM_INLINE void PlateauState::step(double metric) {
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

LOOM_INLINE nlohmann::json PlateauState::to_json() const {
  return {{"best", best}, {"num_bad_epochs", num_bad_epochs}, {"cooldown_counter", cooldown_counter},
          {"last_epoch", last_epoch}, {"_last_lr", {lr}}};
}

LOOM_INLINE void PlateauState::from_json(const nlohmann::json& j) {
  const json::Fields f(j, "");
  // Before the first metric `best` is +-inf, which JSON writes as null.
  best = f.optional_number("best").value_or(maximize ? -std::numeric_limits<double>::infinity()
                                                     : std::numeric_limits<double>::infinity());
  num_bad_epochs = f.integer("num_bad_epochs", 0);
  cooldown_counter = f.integer("cooldown_counter", 0);
  last_epoch = f.integer("last_epoch", 0);
  const auto& last_lr = f.array("_last_lr");
  if (last_lr.size() != 1 || !last_lr[0].is_number() || !(last_lr[0].get<double>() >= 0))
    f.fail("_last_lr", "must be [a learning rate >= 0], got " + last_lr.dump());
  lr = last_lr[0].get<double>();
}

LOOM_INLINE LRScheduler<ReduceLROnPlateau>::LRScheduler(ScheduleParams params)
    : LRSchedulerBase(std::move(params)), plateau_(PlateauState::configure(this->params())) {}

LOOM_INLINE nlohmann::json LRScheduler<ReduceLROnPlateau>::state_dict() const {
  auto j = LRSchedulerBase::state_dict();
  j["plateau"] = plateau_.to_json();
  return j;
}

LOOM_INLINE void LRScheduler<ReduceLROnPlateau>::load_state_dict(const nlohmann::json& j) {
  LRSchedulerBase::load_state_dict(j);
  plateau_.from_json(json::Fields(j, "").object("plateau"));
}

}  // namespace loom::schedule
