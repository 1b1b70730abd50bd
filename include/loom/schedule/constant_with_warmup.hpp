#pragma once
// HF "constant_with_warmup": linear warmup, then 1.
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<ConstantWithWarmup> {
  static double factor(int64_t step, const ScheduleParams& p) {
    return step < p.num_warmup_steps ? warmup_factor(step, p) : 1.0;
  }
};
}  // namespace loom::schedule
