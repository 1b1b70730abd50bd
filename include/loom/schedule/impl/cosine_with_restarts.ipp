#pragma once
// Definitions of schedule/cosine_with_restarts.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/schedule/cosine_with_restarts.hpp>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<CosineWithRestarts>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, CosineWithRestarts::name, {"num_cycles"});
  return {k.number("num_cycles", 1, kPositive)};
}

}  // namespace loom::schedule
