#pragma once
// HF "polynomial": warmup, then (lr - lr_end) * (1 - progress)^power + lr_end, and lr_end
// after training; lr_end 1e-7 and power 1 by default; lr_end must be below the peak rate.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>

namespace loom::schedule {
template <>
struct ScheduleImpl<Polynomial> {
  struct Config {
    double lr_end = 1e-7, power = 1.0;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    if (step > p.num_training_steps) return c.lr_end / p.base_lr;
    const double range = p.base_lr - c.lr_end;
    const double decay_steps = static_cast<double>(p.num_training_steps - p.num_warmup_steps);
    const double remaining = 1.0 - static_cast<double>(step - p.num_warmup_steps) / decay_steps;
    return (range * std::pow(remaining, c.power) + c.lr_end) / p.base_lr;
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/polynomial.ipp>
#endif
