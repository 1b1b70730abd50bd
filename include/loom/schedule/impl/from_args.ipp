#pragma once
// Definitions of schedule/from_args.hpp (compiled once with LOOM_SEPARATE_COMPILATION): the
// constructor and its per-tag `pick`, so every schedule's configure and the closure over its
// factor are instantiated here once.

#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/schedule/from_args.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom::schedule {

template <class Tag>
void LRScheduler<FromArgs>::pick(Tag, std::string_view name, bool& found, std::string& known) {
  known += known.empty() ? "" : ", ";
  known += Tag::name;
  if (found || Tag::name != name) return;
  found = true;
  if constexpr (std::is_same_v<Tag, ReduceLROnPlateau>) {
    plateau_ = PlateauState::configure(params());
  } else {
    auto config = ScheduleImpl<Tag>::configure(params());
    rate_ = [p = params(), config](int64_t step) { return schedule_rate<Tag>(step, p, config); };
  }
}

LOOM_INLINE LRScheduler<FromArgs>::LRScheduler(ScheduleParams params, std::string_view name)
    : LRSchedulerBase(std::move(params)) {
  bool found = false;
  std::string known;
  std::apply([&](auto... tags) { (pick(tags, name, found, known), ...); }, NamedSchedules{});
  check(found, "lr_scheduler_type '{}' is not one of {}", name, known);
}

LOOM_INLINE nlohmann::json LRScheduler<FromArgs>::state_dict() const {
  auto j = LRSchedulerBase::state_dict();
  if (plateau_) j["plateau"] = plateau_->to_json();
  return j;
}

LOOM_INLINE void LRScheduler<FromArgs>::load_state_dict(const nlohmann::json& j) {
  LRSchedulerBase::load_state_dict(j);
  if (plateau_) plateau_->from_json(json::Fields(j, "").object("plateau"));
}

}  // namespace loom::schedule
