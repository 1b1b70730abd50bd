#pragma once
// HF "cosine": warmup, then 0.5 * (1 + cos(pi * 2 * num_cycles * progress)), num_cycles 0.5
// unless lr_scheduler_kwargs says otherwise.
#include <loom/schedule/schedule_decl.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace loom::schedule {
template <>
struct ScheduleImpl<Cosine> {
  static double factor(int64_t step, const ScheduleParams& p) {
    if (step < p.num_warmup_steps) return warmup_factor(step, p);
    const double num_cycles = p.kwargs.is_object() ? p.kwargs.value("num_cycles", 0.5) : 0.5;
    const double progress =
        static_cast<double>(step - p.num_warmup_steps) /
        static_cast<double>(std::max<int64_t>(1, p.num_training_steps - p.num_warmup_steps));
    return std::max(0.0, 0.5 * (1.0 + std::cos(std::numbers::pi * num_cycles * 2.0 * progress)));
  }
};
}  // namespace loom::schedule
