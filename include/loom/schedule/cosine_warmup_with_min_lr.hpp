#pragma once
// HF "cosine_warmup_with_min_lr": like cosine_with_min_lr, but warmup starts above 0:
// (step + 1) / W, or from warmup_lr_rate linearly to 1 over W - 1 steps; the decay's
// progress is (step - W + 1) / max(1, T - W).
#include <loom/schedule/cosine_with_min_lr.hpp>

#include <cmath>
#include <numbers>

namespace loom::schedule {
template <>
struct ScheduleImpl<CosineWarmupWithMinLR> {
  struct Config {
    double num_cycles = 0.5, min_lr_rate = 0.0;
    std::optional<double> warmup_lr_rate;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step_i, const ScheduleParams& p, const Config& c) {
    const double step = static_cast<double>(step_i);
    const double w = static_cast<double>(p.num_warmup_steps);
    const double t = static_cast<double>(p.num_training_steps);
    if (step < w) {
      if (!c.warmup_lr_rate) return (step + 1.0) / std::max(1.0, w);
      return *c.warmup_lr_rate + (1.0 - *c.warmup_lr_rate) * step / std::max(1.0, w - 1.0);
    }
    const double progress = (step - w + 1.0) / std::max(1.0, t - w);
    const double f = 0.5 * (1.0 + std::cos(std::numbers::pi * c.num_cycles * 2.0 * progress));
    return std::max(0.0, f * (1.0 - c.min_lr_rate) + c.min_lr_rate);
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/cosine_warmup_with_min_lr.ipp>
#endif
