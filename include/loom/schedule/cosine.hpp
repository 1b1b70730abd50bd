#pragma once
// HF "cosine": warmup, then max(0, 0.5 * (1 + cos(pi * 2 * num_cycles * progress))),
// num_cycles 0.5 (half a wave, down to 0) unless lr_scheduler_kwargs says otherwise.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>
#include <numbers>

namespace loom::schedule {
template <>
struct ScheduleImpl<Cosine> {
  struct Config {
    double num_cycles = 0.5;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * c.num_cycles * 2.0 * decay_progress(step, p))));
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/cosine.ipp>
#endif
