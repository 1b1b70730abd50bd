#pragma once
// HF "cosine_with_min_lr": cosine as HF "cosine", lifted to end at min_lr (or at
// min_lr_rate x the peak): factor * (1 - min_lr_rate) + min_lr_rate. One of the two is required.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>
#include <numbers>

namespace loom::schedule {

/// min_lr_rate from lr_scheduler_kwargs' min_lr or min_lr_rate (exactly one), as HF.
LOOM_INLINE double resolve_min_lr_rate(const Kwargs& k, const ScheduleParams& p, std::string_view schedule);

template <>
struct ScheduleImpl<CosineWithMinLR> {
  struct Config {
    double num_cycles = 0.5, min_lr_rate = 0.0;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const double f = 0.5 * (1.0 + std::cos(std::numbers::pi * c.num_cycles * 2.0 * decay_progress(step, p)));
    return std::max(0.0, f * (1.0 - c.min_lr_rate) + c.min_lr_rate);
  }
};

}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/cosine_with_min_lr.ipp>
#endif
