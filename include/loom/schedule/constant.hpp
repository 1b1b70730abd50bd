#pragma once
// HF "constant": the learning rate never changes.
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<Constant> {
  static double factor(int64_t, const ScheduleParams&) { return 1.0; }
};
}  // namespace loom::schedule
