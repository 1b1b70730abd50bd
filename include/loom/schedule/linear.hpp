#pragma once
// HF "linear": warmup, then max(0, (T - step) / max(1, T - W)).
#include <loom/schedule/schedule_decl.hpp>

namespace loom::schedule {
template <>
struct ScheduleImpl<Linear> {
  struct Config {};
  static Config configure(const ScheduleParams& p) {
    Kwargs(p.kwargs, Linear::name, {});
    return {};
  }
  static double factor(int64_t step, const ScheduleParams& p, const Config&) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const auto remaining = static_cast<double>(p.num_training_steps - step);
    const auto span = static_cast<double>(std::max<int64_t>(1, p.num_training_steps - p.num_warmup_steps));
    return std::max(0.0, remaining / span);
  }
};
}  // namespace loom::schedule
