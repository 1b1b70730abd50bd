#pragma once
// Definitions of schedule/inverse_sqrt.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/schedule/inverse_sqrt.hpp>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<InverseSqrt>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, InverseSqrt::name, {"timescale"});
  const double fallback = p.num_warmup_steps > 0 ? static_cast<double>(p.num_warmup_steps) : 10000.0;
  Config c{k.number("timescale", fallback)};
  check(c.timescale > 0, "inverse_sqrt schedule: timescale must be positive, got {}", c.timescale);
  return c;
}

}  // namespace loom::schedule
