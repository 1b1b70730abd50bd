#pragma once
// Definitions of schedule/schedule_decl.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/json.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/schedule/schedule_decl.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace loom::schedule {

LOOM_INLINE Kwargs::Kwargs(const nlohmann::json& kwargs, std::string_view schedule,
                           std::initializer_list<std::string_view> known)
    : kwargs_(kwargs.is_null() ? nlohmann::json::object() : kwargs), schedule_(schedule) {
  check(kwargs_.is_object(), "lr_scheduler_kwargs must be a JSON object, got {}", kwargs_.dump());
  for (const auto& [key, value] : kwargs_.items()) {
    bool ok = false;
    std::string list;
    for (auto k : known) {
      ok = ok || k == key;
      list += list.empty() ? "" : ", ";
      list += k;
    }
    check(ok, "lr_scheduler_kwargs: '{}' is not an argument of {} (it takes: {})", key, schedule_,
          list.empty() ? "nothing" : list);
  }
}

LOOM_INLINE std::string Range::text() const {
  return fmt::format("{}{}, {}{}", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
}

LOOM_INLINE double Kwargs::number(std::string_view key, double fallback, Range range) const {
  const auto it = kwargs_.find(std::string(key));
  if (it == kwargs_.end()) return fallback;
  check(it->is_number(), "lr_scheduler_kwargs: {} of {} must be a number, got {}", key, schedule_, it->dump());
  const double v = it->get<double>();
  check(std::isfinite(v) && range.contains(v), "lr_scheduler_kwargs: {} of {} must be in {}, got {}", key, schedule_,
        range.text(), v);
  return v;
}

LOOM_INLINE int64_t Kwargs::count(std::string_view key, int64_t fallback) const {
  if (!kwargs_.contains(std::string(key))) return fallback;
  const double v = number(key, 0.0);
  check(std::isfinite(v) && v >= 0 && v < 1e15 && v == std::floor(v),
        "lr_scheduler_kwargs: {} of {} must be a whole number of at least 0 (below 1e15), got {}", key, schedule_, v);
  return static_cast<int64_t>(v);
}

LOOM_INLINE std::optional<double> Kwargs::optional_number(std::string_view key, Range range) const {
  const auto it = kwargs_.find(std::string(key));
  if (it == kwargs_.end() || it->is_null()) return std::nullopt;
  return number(key, 0.0, range);
}

LOOM_INLINE std::string Kwargs::choice(std::string_view key, std::string fallback,
                                       std::initializer_list<std::string_view> allowed) const {
  const auto it = kwargs_.find(std::string(key));
  if (it == kwargs_.end()) return fallback;
  check(it->is_string(), "lr_scheduler_kwargs: {} of {} must be a string, got {}", key, schedule_, it->dump());
  const auto value = it->get<std::string>();
  std::string list;
  for (auto a : allowed) {
    if (a == value) return value;
    list += list.empty() ? "" : ", ";
    list += a;
  }
  fail("lr_scheduler_kwargs: {} of {} must be one of {}, got '{}'", key, schedule_, list, value);
}

LOOM_INLINE int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t num_training_steps) {
  // Bounded before the cast (a double beyond int64's range cast to it is undefined).
  check(warmup_steps < 1e15, "--warmup_steps {} is not a step count below 1e15", warmup_steps);
  if (warmup_steps >= 1) return static_cast<int64_t>(warmup_steps);
  if (warmup_steps > 0)
    return static_cast<int64_t>(std::ceil(warmup_steps * static_cast<double>(num_training_steps)));
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(num_training_steps)));
}

LOOM_INLINE ScheduleParams make_schedule_params(const TrainingArguments& args, int64_t num_training_steps) {
  ScheduleParams p;
  p.num_training_steps = num_training_steps;
  p.num_warmup_steps = resolve_warmup_steps(args.warmup_steps, args.warmup_ratio, num_training_steps);
  p.base_lr = args.learning_rate;
  p.kwargs = json::parse(args.lr_scheduler_kwargs, "--lr_scheduler_kwargs");
  return p;
}

LOOM_INLINE nlohmann::json LRSchedulerBase::state_dict() const {
  return {{"last_epoch", step_}, {"base_lrs", {base_lr()}}};
}

LOOM_INLINE void LRSchedulerBase::load_state_dict(const nlohmann::json& j) {
  step_ = json::Fields(j, "").integer("last_epoch", 0);
}

}  // namespace loom::schedule
