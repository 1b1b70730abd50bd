#pragma once
// HF "constant_with_warmup": linear warmup, then 1.
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<ConstantWithWarmup> {
  struct Config {};
  static Config configure(const ScheduleParams& p) {
    Kwargs(p.kwargs, ConstantWithWarmup::name, {});
    return {};
  }
  static double factor(int64_t step, const ScheduleParams& p, const Config&) {
    return step < p.num_warmup_steps ? warmup_factor(step, p) : 1.0;
  }
};
}  // namespace loom::schedule
