#pragma once
// HF "warmup_stable_decay": warmup (linear | cosine | 1-sqrt) from min_lr_ratio to 1, a
// stable phase at 1, a decay (linear | cosine | 1-sqrt) to min_lr_ratio over num_decay_steps
// (required), then min_lr_ratio. num_stable_steps defaults to T - W - num_decay_steps.
#include <loom/schedule/schedule_decl.hpp>

#include <cmath>
#include <numbers>

namespace loom::schedule {
template <>
struct ScheduleImpl<WarmupStableDecay> {
  enum class Shape { linear, cosine, one_minus_sqrt };
  struct Config {
    int64_t num_stable_steps = 0, num_decay_steps = 0;
    Shape warmup = Shape::linear, decay = Shape::cosine;
    double min_lr_ratio = 0.0, num_cycles = 0.5;
  };
  static Shape shape(const std::string& s);
  static Config configure(const ScheduleParams& p);
  static double factor(int64_t step, const ScheduleParams& p, const Config& c) {
    const int64_t w = p.num_warmup_steps;
    if (step < w) {
      const double progress = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, w));
      double f = progress;
      if (c.warmup == Shape::cosine) f = 0.5 * (1.0 - std::cos(std::numbers::pi * progress));
      if (c.warmup == Shape::one_minus_sqrt) f = 1.0 - std::sqrt(1.0 - progress);
      return std::max(0.0, f * (1.0 - c.min_lr_ratio) + c.min_lr_ratio);
    }
    if (step < w + c.num_stable_steps) return 1.0;
    if (step < w + c.num_stable_steps + c.num_decay_steps) {
      const double progress = static_cast<double>(step - w - c.num_stable_steps) /
                              static_cast<double>(std::max<int64_t>(1, c.num_decay_steps));
      double f = 1.0 - progress;
      if (c.decay == Shape::cosine) f = 0.5 * (1.0 + std::cos(std::numbers::pi * c.num_cycles * 2.0 * progress));
      if (c.decay == Shape::one_minus_sqrt) f = 1.0 - std::sqrt(progress);
      return std::max(0.0, f * (1.0 - c.min_lr_ratio) + c.min_lr_ratio);
    }
    return c.min_lr_ratio;
  }
};
}  // namespace loom::schedule

#if defined(LOOM_HEADER_ONLY)
#include <loom/schedule/impl/warmup_stable_decay.ipp>
#endif
