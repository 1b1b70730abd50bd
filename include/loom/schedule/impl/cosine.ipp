#pragma once
// Definitions of schedule/cosine.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/schedule/cosine.hpp>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<Cosine>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, Cosine::name, {"num_cycles"});
  return {k.number("num_cycles", 0.5, kNonNegative)};
}

}  // namespace loom::schedule
