#pragma once
// schedule::FromArgs: the schedule named by lr_scheduler_type, picked once at start-up
// (a function pointer), so one binary serves every --lr_scheduler_type.
#include <loom/schedule/constant.hpp>
#include <loom/schedule/constant_with_warmup.hpp>
#include <loom/schedule/cosine.hpp>
#include <loom/schedule/linear.hpp>
#include <loom/schedule/schedule_decl.hpp>

#include <array>
#include <utility>
#include <string>
#include <string_view>

namespace loom::schedule {

/// Signature shared by every ScheduleImpl<Tag>::factor.
using FactorFn = double (*)(int64_t, const ScheduleParams&);

/// The schedules that FromArgs can choose, by HF name.
inline constexpr std::array<std::pair<std::string_view, FactorFn>, 4> kNamedSchedules{{
    {Linear::name, &ScheduleImpl<Linear>::factor},
    {Constant::name, &ScheduleImpl<Constant>::factor},
    {ConstantWithWarmup::name, &ScheduleImpl<ConstantWithWarmup>::factor},
    {Cosine::name, &ScheduleImpl<Cosine>::factor},
}};

/// The factor function for `name`, or a loom::Error listing the implemented names.
inline FactorFn factor_for(std::string_view name) {
  std::string known;
  for (const auto& [n, fn] : kNamedSchedules) {
    if (n == name) return fn;
    known += known.empty() ? "" : ", ";
    known += n;
  }
  throw Error("lr_scheduler_type '" + std::string(name) + "' is not available in this build; choose one of " + known);
}

/// The schedule named by lr_scheduler_type: the formula is a function pointer chosen at start-up.
template <>
class LRScheduler<FromArgs> : public LRSchedulerBase {
 public:
  /// A scheduler for lr_scheduler_type `name`; unknown names are a loom::Error.
  LRScheduler(double base_lr, ScheduleParams params, std::string_view name)
      : LRSchedulerBase(base_lr, std::move(params)), fn_(factor_for(name)) {}
  /// Learning rate for optimizer step `step`.
  [[nodiscard]] double lr_at(int64_t step) const { return base_lr() * fn_(step, params()); }
  /// Learning rate for the next optimizer step.
  [[nodiscard]] double current_lr() const { return lr_at(step_count()); }

 private:
  FactorFn fn_;
};

}  // namespace loom::schedule
