#pragma once
// HF "inverse_sqrt": warmup, then 1 / sqrt((step + timescale - W) / timescale); timescale
// defaults to the warmup length, or 10000 without warmup.
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<InverseSqrt> {
  struct Config {
    double timescale = 10000;
  };
  static Config configure(const ScheduleParams& p) {
    Kwargs k(p.kwargs, InverseSqrt::name, {"timescale"});
    const double fallback = p.num_warmup_steps > 0 ? static_cast<double>(p.num_warmup_steps) : 10000.0;
    Config c{k.number("timescale", fallback)};
    check(c.timescale > 0, "inverse_sqrt schedule: timescale must be positive, got {}", c.timescale);
    return c;
  }
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const double shift = c.timescale - static_cast<double>(p.num_warmup_steps);
    return 1.0 / std::sqrt((static_cast<double>(step) + shift) / c.timescale);
  }
};
}  // namespace loom::schedule
