#pragma once
// HF "cosine_with_restarts": warmup, then num_cycles (default 1) cosine decays from 1 to 0,
// each restarting at 1; 0 once training is over.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>
#include <numbers>

namespace loom::schedule {
template <>
struct ScheduleImpl<CosineWithRestarts> {
  struct Config {
    double num_cycles = 1;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const double progress = decay_progress(step, p);
    if (progress >= 1.0) return 0.0;
    return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * std::fmod(c.num_cycles * progress, 1.0))));
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/cosine_with_restarts.ipp>
#endif
