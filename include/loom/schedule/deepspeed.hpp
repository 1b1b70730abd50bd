#pragma once
// DeepSpeed's schedules (deepspeed.runtime.lr_schedules): "warmup_lr", "warmup_decay_lr" and
// "warmup_cosine_lr", which a --deepspeed config's scheduler section (WarmupLR, WarmupDecayLR,
// WarmupCosineLR) picks, as HF's Trainer hands that section to DeepSpeed. Each gives the rate
// itself, as DeepSpeed computes it (min + (max - min) x gamma, or lr x ratio), not base x factor.
//
// DeepSpeed's schedulers set the rate at construction and step after each optimizer step, so
// optimizer step k (from 0) runs at its get_lr() with last_batch_iteration k - 1: step 0 at the
// construction rate (warmup_min_lr; 0 for WarmupCosineLR), step k >= 1 at iteration k - 1.
//
// lr_scheduler_kwargs (a DeepSpeed config's scheduler.params, "auto" filled as HF fills them):
//   warmup_type       "log" (DeepSpeed's default) or "linear"
//   warmup_min_lr     warmup_lr, warmup_decay_lr: the rate warmup starts from (default 0)
//   warmup_min_ratio  warmup_cosine_lr: warmup starts at this share of the peak (default 0)
//   cos_min_ratio     warmup_cosine_lr: the share of the peak the cosine ends at (default 0.0001)
//   warmup_num_steps, total_num_steps   when given, must equal max(1, the run's warmup steps)
//                     and the run's optimizer steps (HF's DeepSpeed integration checks both)
// The warmup lasts max(2, warmup steps) iterations, DeepSpeed's clamp.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>
#include <cstdint>
#include <numbers>

namespace loom::schedule {

namespace detail {
/// What DeepSpeed's three schedules share: the warmup's length and shape.
struct DeepSpeedWarmup {
  int64_t warmup = 2;             ///< DeepSpeed's warmup_num_steps (at least 2)
  bool log = true;                ///< warmup_type "log", else "linear"
  double inverse_log_warmup = 0;  ///< 1 / log(warmup)
  /// DeepSpeed's _get_gamma during warmup at iteration `it` (< warmup).
  [[nodiscard]] double gamma(int64_t it) const {
    return log ? inverse_log_warmup * std::log(static_cast<double>(it + 1))
               : static_cast<double>(it) / static_cast<double>(warmup);
  }
};
/// Reads warmup_type and checks warmup_num_steps / total_num_steps against the run.
LOOM_INLINE DeepSpeedWarmup deepspeed_warmup(const Kwargs& k, const ScheduleParams& p, std::string_view schedule);
}  // namespace detail

template <>
struct ScheduleImpl<WarmupLR> {
  struct Config {
    detail::DeepSpeedWarmup warmup;
    double min_lr = 0;
  };
  static Config configure(const ScheduleParams& p);
  static double lr(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step == 0) return c.min_lr;
    const int64_t it = step - 1;
    const double gamma = it < c.warmup.warmup ? c.warmup.gamma(it) : 1.0;
    return c.min_lr + (p.base_lr - c.min_lr) * gamma;
  }
};

template <>
struct ScheduleImpl<WarmupDecayLR> {
  using Config = ScheduleImpl<WarmupLR>::Config;
  static Config configure(const ScheduleParams& p);
  static double lr(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step == 0) return c.min_lr;
    const int64_t it = step - 1;
    const double gamma =
        it < c.warmup.warmup
            ? c.warmup.gamma(it)
            : std::max(0.0, static_cast<double>(p.num_training_steps - it) /
                                std::max(1.0, static_cast<double>(p.num_training_steps - c.warmup.warmup)));
    return c.min_lr + (p.base_lr - c.min_lr) * gamma;
  }
};

template <>
struct ScheduleImpl<WarmupCosineLR> {
  struct Config {
    detail::DeepSpeedWarmup warmup;
    double warmup_min_ratio = 0, cos_min_ratio = 0.0001;
  };
  static Config configure(const ScheduleParams& p);
  static double lr(int64_t step, const ScheduleParams& p, const Config& c) {
    if (step == 0) return 0.0;
    const int64_t it = step - 1;
    double ratio = 0;
    if (it < c.warmup.warmup) {
      ratio = c.warmup_min_ratio + c.warmup.gamma(it) * (1.0 - c.warmup_min_ratio);
    } else {
      const auto done = static_cast<double>(it - c.warmup.warmup + 1);
      const auto span = static_cast<double>(std::max<int64_t>(1, p.num_training_steps - c.warmup.warmup));
      const double progress = std::min(1.0, done / span);
      ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * ((1 + std::cos(std::numbers::pi * progress)) / 2));
    }
    return p.base_lr * ratio;
  }
};

}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/deepspeed.ipp>
#endif
