#pragma once
// HF "polynomial": warmup, then (lr - lr_end) * (1 - progress)^power + lr_end, and lr_end
// after training; lr_end 1e-7 and power 1 by default; lr_end must be below the peak rate.
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<Polynomial> {
  struct Config {
    double lr_end = 1e-7, power = 1.0;
  };
  static Config configure(const ScheduleParams& p) {
    Kwargs k(p.kwargs, Polynomial::name, {"lr_end", "power"});
    Config c{k.number("lr_end", 1e-7), k.number("power", 1.0)};
    check(p.base_lr > c.lr_end, "polynomial schedule: lr_end ({}) must be smaller than the learning rate ({})",
          c.lr_end, p.base_lr);
    return c;
  }
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
