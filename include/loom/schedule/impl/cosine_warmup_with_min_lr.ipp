#pragma once
// Definitions of schedule/cosine_warmup_with_min_lr.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/schedule/cosine_warmup_with_min_lr.hpp>
#include <loom/schedule/cosine_with_min_lr.hpp>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<CosineWarmupWithMinLR>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, CosineWarmupWithMinLR::name, {"num_cycles", "min_lr", "min_lr_rate", "warmup_lr_rate"});
  return {k.number("num_cycles", 0.5, kNonNegative), resolve_min_lr_rate(k, p, CosineWarmupWithMinLR::name),
          k.optional_number("warmup_lr_rate", kUnit)};
}

}  // namespace loom::schedule
