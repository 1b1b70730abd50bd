#pragma once
// The learning-rate schedule machinery. ScheduleImpl<Tag> is specialized once per schedule
// tag, each in its own file; the primary template only fails loudly. A specialization has
//   struct Config;                                          resolved lr_scheduler_kwargs
//   static Config configure(const ScheduleParams&);         validates them ("loom:" errors)
//   static double factor(int64_t step, const ScheduleParams&, const Config&);
// LRScheduler<Tag> is HF's LambdaLR: the rate of optimizer step k is base_lr * factor(k).
// A schedule that computes the rate itself (DeepSpeed's: min + (max - min) x gamma) has
//   static double lr(int64_t step, const ScheduleParams&, const Config&);
// instead of factor, and the rate of step k is lr(k) (ScheduleGivesRate).

#include <loom/config/inline.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/policy/tags.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom::schedule {

/// What every schedule formula may read.
struct ScheduleParams {
  int64_t num_warmup_steps = 0;    ///< resolved warmup length in optimizer steps
  int64_t num_training_steps = 0;  ///< total optimizer steps (TrainerState::max_steps)
  double base_lr = 1.0;            ///< the peak learning rate (HF's optimizer.defaults["lr"])
  nlohmann::json kwargs = nlohmann::json::object();  ///< lr_scheduler_kwargs
};

/// Specialized per schedule tag (see the top of this file).
template <class Tag>
struct ScheduleImpl {
  static_assert(dependent_false_v<Tag>, "loom: no ScheduleImpl for this schedule tag; "
                                      "include its header from loom/schedule/");
};

/// Reads lr_scheduler_kwargs for one schedule: typed lookups with defaults, and an error
/// for any key the schedule does not take (HF raises TypeError there too).
/// The values a kwarg may take: [min, max], either end open; the message names the interval.
struct Range {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false, max_open = false;
  [[nodiscard]] bool contains(double v) const {
    return (min_open ? v > min : v >= min) && (max_open ? v < max : v <= max);
  }
  [[nodiscard]] LOOM_INLINE std::string text() const;
};
inline constexpr Range kNonNegative{0.0};
inline constexpr Range kPositive{0.0, std::numeric_limits<double>::infinity(), true};
inline constexpr Range kUnit{0.0, 1.0};  ///< [0, 1]

class Kwargs {
 public:
  Kwargs(const nlohmann::json& kwargs, std::string_view schedule, std::initializer_list<std::string_view> known);
  /// The number at `key`, or `fallback` when absent; null is an error (HF's argument has a
  /// number default, and None fails there too).
  [[nodiscard]] LOOM_INLINE double number(std::string_view key, double fallback, Range range = {}) const;
  /// The number at `key` as a count (steps, evaluations), or `fallback` when absent: a whole
  /// number in [0, 1e15) (HF truncates 2.5 with int(); loom refuses it).
  [[nodiscard]] LOOM_INLINE int64_t count(std::string_view key, int64_t fallback) const;
  /// The number at `key`, if given (null counts as not given: HF's default is None), in `range`.
  [[nodiscard]] std::optional<double> optional_number(std::string_view key, Range range = {}) const;
  /// The string at `key` (one of `allowed`), or `fallback` when absent; null is an error.
  [[nodiscard]] std::string choice(std::string_view key, std::string fallback,
                                   std::initializer_list<std::string_view> allowed) const;

 private:
  nlohmann::json kwargs_;
  std::string_view schedule_;
};

/// HF's warmup length: warmup_steps when >= 1, a fraction of training when in (0, 1),
/// else ceil(warmup_ratio * num_training_steps).
LOOM_INLINE int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio, int64_t num_training_steps);

/// The Trainer's ScheduleParams over `num_training_steps` optimizer steps: warmup resolved
/// from warmup_steps / warmup_ratio, base_lr = learning_rate, kwargs parsed from
/// lr_scheduler_kwargs (a JSON parse error propagates as nlohmann::json::parse_error).
LOOM_INLINE ScheduleParams make_schedule_params(const TrainingArguments& args, int64_t num_training_steps);

/// Linear warmup from 0, HF's shared first phase: step / max(1, warmup).
inline double warmup_factor(int64_t step, const ScheduleParams& p) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, p.num_warmup_steps));
}

/// Fraction of the post-warmup phase done at `step`: (step - W) / max(1, T - W).
inline double decay_progress(int64_t step, const ScheduleParams& p) {
  return static_cast<double>(step - p.num_warmup_steps) /
         static_cast<double>(std::max<int64_t>(1, p.num_training_steps - p.num_warmup_steps));
}

/// What every scheduler shares: the formula's inputs and the step count.
class LRSchedulerBase {
 public:
  explicit LRSchedulerBase(ScheduleParams params) : params_(std::move(params)) {}

  /// Advances one optimizer step (HF's lr_scheduler.step()).
  void step() { ++step_; }
  /// Optimizer steps taken so far.
  [[nodiscard]] int64_t step_count() const { return step_; }
  /// The formula's inputs.
  [[nodiscard]] const ScheduleParams& params() const { return params_; }
  /// The peak learning rate.
  [[nodiscard]] double base_lr() const { return params_.base_lr; }
  /// State for checkpoints (field names as torch's LambdaLR state_dict).
  [[nodiscard]] nlohmann::json state_dict() const;
  /// Restores state_dict() output.
  void load_state_dict(const nlohmann::json& j);

 private:
  ScheduleParams params_;
  int64_t step_ = 0;
};

/// A schedule whose ScheduleImpl gives the rate itself (lr), not a factor of base_lr.
template <class Tag>
concept ScheduleGivesRate = requires(int64_t step, const ScheduleParams& p,
                                     const typename ScheduleImpl<Tag>::Config& c) {
  { ScheduleImpl<Tag>::lr(step, p, c) } -> std::convertible_to<double>;
};

/// The rate of optimizer step `step` under schedule `Tag`: lr(step), or base_lr * factor(step).
template <class Tag>
double schedule_rate(int64_t step, const ScheduleParams& p, const typename ScheduleImpl<Tag>::Config& c) {
  if constexpr (ScheduleGivesRate<Tag>) return ScheduleImpl<Tag>::lr(step, p, c);
  else return p.base_lr * ScheduleImpl<Tag>::factor(step, p, c);
}

/// HF's LambdaLR with a compile-time formula: lr(step) = base_lr * ScheduleImpl<Tag>::factor(step)
/// (or the schedule's own rate, ScheduleGivesRate).
template <class Tag>
class LRScheduler : public LRSchedulerBase {
 public:
  /// Validates the kwargs of `params` for this schedule.
  explicit LRScheduler(ScheduleParams params)
      : LRSchedulerBase(std::move(params)), config_(ScheduleImpl<Tag>::configure(this->params())) {}
  /// Learning rate for optimizer step `step`.
  [[nodiscard]] double lr_at(int64_t step) const { return schedule_rate<Tag>(step, params(), config_); }
  /// Learning rate for the next optimizer step.
  [[nodiscard]] double current_lr() const { return lr_at(step_count()); }
  /// Schedules driven by steps ignore evaluation metrics.
  void step_metric(double) {}
  /// False: this schedule does not read evaluation metrics.
  [[nodiscard]] bool wants_metric() const { return false; }

 private:
  typename ScheduleImpl<Tag>::Config config_;
};

/// What the Trainer asks of a scheduler (LRScheduler<Tag>, or a create_scheduler override's).
template <class S>
concept Schedule = std::derived_from<S, LRSchedulerBase> && requires(S& s, const S& cs, const nlohmann::json& j) {
  { cs.current_lr() } -> std::convertible_to<double>;
  { cs.wants_metric() } -> std::convertible_to<bool>;
  s.step_metric(1.0);
  { cs.state_dict() } -> std::convertible_to<nlohmann::json>;
  s.load_state_dict(j);
};

/// A scheduler whose formula is picked at run time from lr_scheduler_type (schedule::FromArgs).
template <class S>
concept NamedAtRunTime = std::constructible_from<S, ScheduleParams, std::string_view>;

}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/schedule_decl.ipp>
#endif
