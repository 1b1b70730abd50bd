#pragma once
// schedule::FromArgs: the schedule named by lr_scheduler_type, chosen once at start-up,
// so one binary serves every --lr_scheduler_type. Step-driven formulas become a closure
// over their validated Config; reduce_lr_on_plateau keeps its PlateauState.
#include <loom/schedule/constant.hpp>
#include <loom/schedule/constant_with_warmup.hpp>
#include <loom/schedule/cosine.hpp>
#include <loom/schedule/cosine_warmup_with_min_lr.hpp>
#include <loom/schedule/cosine_with_min_lr.hpp>
#include <loom/schedule/cosine_with_restarts.hpp>
#include <loom/schedule/deepspeed.hpp>
#include <loom/schedule/inverse_sqrt.hpp>
#include <loom/schedule/linear.hpp>
#include <loom/schedule/polynomial.hpp>
#include <loom/schedule/reduce_lr_on_plateau.hpp>
#include <loom/schedule/schedule_decl.hpp>
#include <loom/schedule/warmup_stable_decay.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>

namespace loom::schedule {

/// Every schedule tag selectable by name: the catalog's (policy/tags.hpp).
using NamedSchedules = ScheduleCatalog;

/// The schedule chosen at run time by its HF name.
template <>
class LRScheduler<FromArgs> : public LRSchedulerBase {
 public:
  /// A scheduler for lr_scheduler_type `name`; unknown names and bad kwargs are loom::Errors.
  LRScheduler(ScheduleParams params, std::string_view name);
  /// Learning rate for optimizer step `step` (plateau: the current rate).
  [[nodiscard]] double lr_at(int64_t step) const { return plateau_ ? plateau_->lr : rate_(step); }
  /// Learning rate for the next optimizer step.
  [[nodiscard]] double current_lr() const { return lr_at(step_count()); }
  /// Feeds an evaluation metric (only reduce_lr_on_plateau uses it).
  void step_metric(double metric) {
    if (plateau_) plateau_->step(metric);
  }
  /// True for reduce_lr_on_plateau.
  [[nodiscard]] bool wants_metric() const { return plateau_.has_value(); }
  [[nodiscard]] nlohmann::json state_dict() const;
  void load_state_dict(const nlohmann::json& j);

 private:
  /// Configures the schedule `Tag` when it is the one called `name` (the constructor folds
  /// this over NamedSchedules); appends Tag's name to `known`.
  template <class Tag>
  void pick(Tag, std::string_view name, bool& found, std::string& known);

  std::function<double(int64_t)> rate_;
  std::optional<PlateauState> plateau_;
};

}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/from_args.ipp>
#endif
