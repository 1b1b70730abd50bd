#pragma once
// HF "constant": the learning rate never changes (warmup_steps is ignored, as in HF).
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<Constant> {
  struct Config {};
  static Config configure(const ScheduleParams& p) {
    Kwargs(p.kwargs, Constant::name, {});
    return {};
  }
  static double factor(int64_t, const ScheduleParams&, const Config&) { return 1.0; }
};
}  // namespace loom::schedule
