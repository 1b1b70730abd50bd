#pragma once
// The learning-rate schedule machinery. ScheduleImpl<Tag> is specialized once per schedule
// tag, each in its own file; the primary template only fails loudly. LRScheduler<Tag> is
// HF's LambdaLR: the learning rate of optimizer step k is base_lr * factor(k).

#include <loom/core/error.hpp>
#include <loom/policy/tags.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace loom::schedule {

/// What every schedule formula may read.
struct ScheduleParams {
  int64_t num_warmup_steps = 0;    ///< resolved warmup length in optimizer steps
  int64_t num_training_steps = 0;  ///< total optimizer steps (TrainerState::max_steps)
  nlohmann::json kwargs = nlohmann::json::object();  ///< lr_scheduler_kwargs
};

template <class T>
inline constexpr bool dependent_false = false;

/// Specialized per schedule tag with `static double factor(int64_t step, const ScheduleParams&)`.
template <class Tag>
struct ScheduleImpl {
  static_assert(dependent_false<Tag>, "loom: no ScheduleImpl for this schedule tag; "
                                      "include its header from loom/schedule/");
};

/// HF's warmup length: warmup_steps when >= 1, a fraction of training when in (0, 1),
/// else ceil(warmup_ratio * num_training_steps).
inline int64_t resolve_warmup_steps(double warmup_steps, double warmup_ratio,
                                    int64_t num_training_steps) {
  if (warmup_steps >= 1) return static_cast<int64_t>(warmup_steps);
  if (warmup_steps > 0)
    return static_cast<int64_t>(std::ceil(warmup_steps * static_cast<double>(num_training_steps)));
  return static_cast<int64_t>(std::ceil(warmup_ratio * static_cast<double>(num_training_steps)));
}

/// Linear warmup from 0, HF's shared first phase: step / max(1, warmup).
inline double warmup_factor(int64_t step, const ScheduleParams& p) {
  return static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, p.num_warmup_steps));
}

/// What every scheduler shares: the peak learning rate, the formula's inputs, the step count.
class LRSchedulerBase {
 public:
  LRSchedulerBase(double base_lr, ScheduleParams params) : base_lr_(base_lr), params_(std::move(params)) {}

  /// Advances one optimizer step (HF's lr_scheduler.step()).
  void step() { ++step_; }
  /// Optimizer steps taken so far.
  [[nodiscard]] int64_t step_count() const { return step_; }
  /// The formula's inputs.
  [[nodiscard]] const ScheduleParams& params() const { return params_; }
  /// The peak learning rate.
  [[nodiscard]] double base_lr() const { return base_lr_; }
  /// State for checkpoints (field names as torch's LambdaLR state_dict).
  [[nodiscard]] nlohmann::json state_dict() const {
    return {{"last_epoch", step_}, {"base_lrs", {base_lr_}}};
  }
  /// Restores state_dict() output.
  void load_state_dict(const nlohmann::json& j) { step_ = j.at("last_epoch").get<int64_t>(); }

 private:
  double base_lr_;
  ScheduleParams params_;
  int64_t step_ = 0;
};

/// HF's LambdaLR with a compile-time formula: lr(step) = base_lr * ScheduleImpl<Tag>::factor(step).
template <class Tag>
class LRScheduler : public LRSchedulerBase {
 public:
  using LRSchedulerBase::LRSchedulerBase;
  /// Learning rate for optimizer step `step`.
  [[nodiscard]] double lr_at(int64_t step) const { return base_lr() * ScheduleImpl<Tag>::factor(step, params()); }
  /// Learning rate for the next optimizer step.
  [[nodiscard]] double current_lr() const { return lr_at(step_count()); }
};

}  // namespace loom::schedule
