#pragma once
// Definitions of schedule/polynomial.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/schedule/polynomial.hpp>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<Polynomial>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, Polynomial::name, {"lr_end", "power"});
  Config c{k.number("lr_end", 1e-7, kNonNegative), k.number("power", 1.0, kPositive)};
  check(p.base_lr > c.lr_end, "polynomial schedule: lr_end ({}) must be smaller than the learning rate ({})",
        c.lr_end, p.base_lr);
  return c;
}

}  // namespace loom::schedule
