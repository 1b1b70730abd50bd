#pragma once
// Definitions of schedule/cosine_with_min_lr.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/schedule/cosine_with_min_lr.hpp>

#include <string_view>

namespace loom::schedule {

LOOM_INLINE double resolve_min_lr_rate(const Kwargs& k, const ScheduleParams& p, std::string_view schedule) {
  const auto min_lr = k.optional_number("min_lr", {0.0, p.base_lr});
  const auto min_lr_rate = k.optional_number("min_lr_rate", kUnit);
  check(!(min_lr && min_lr_rate), "{}: set only one of min_lr and min_lr_rate in lr_scheduler_kwargs", schedule);
  check(min_lr || min_lr_rate, "{} needs min_lr or min_lr_rate in lr_scheduler_kwargs, e.g. '{{\"min_lr_rate\": 0.1}}'",
        schedule);
  return min_lr ? *min_lr / p.base_lr : *min_lr_rate;
}

LOOM_INLINE auto ScheduleImpl<CosineWithMinLR>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, CosineWithMinLR::name, {"num_cycles", "min_lr", "min_lr_rate"});
  return {k.number("num_cycles", 0.5, kNonNegative), resolve_min_lr_rate(k, p, CosineWithMinLR::name)};
}

}  // namespace loom::schedule
