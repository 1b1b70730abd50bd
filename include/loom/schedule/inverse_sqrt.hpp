#pragma once
// HF "inverse_sqrt": warmup, then 1 / sqrt((step + timescale - W) / timescale); timescale
// defaults to the warmup length, or 10000 without warmup.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>

namespace loom::schedule {
template <>
struct ScheduleImpl<InverseSqrt> {
  struct Config {
    double timescale = 10000;
  };
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const double shift = c.timescale - static_cast<double>(p.num_warmup_steps);
    return 1.0 / std::sqrt((static_cast<double>(step) + shift) / c.timescale);
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/inverse_sqrt.ipp>
#endif
