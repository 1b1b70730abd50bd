#pragma once
// Definitions of schedule/warmup_stable_decay.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/schedule/warmup_stable_decay.hpp>

#include <cstdint>
#include <string>

namespace loom::schedule {

LOOM_INLINE auto ScheduleImpl<WarmupStableDecay>::shape(const std::string& s) -> Shape {
  return s == "linear" ? Shape::linear : s == "cosine" ? Shape::cosine : Shape::one_minus_sqrt;
}

LOOM_INLINE auto ScheduleImpl<WarmupStableDecay>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, WarmupStableDecay::name,
           {"num_decay_steps", "num_stable_steps", "warmup_type", "decay_type", "min_lr_ratio", "num_cycles"});
  check(k.optional_number("num_decay_steps").has_value(),
        "warmup_stable_decay needs num_decay_steps in lr_scheduler_kwargs, e.g. '{{\"num_decay_steps\": 100}}'");
  Config c;
  c.num_decay_steps = k.count("num_decay_steps", 0);
  c.num_stable_steps = k.count("num_stable_steps", p.num_training_steps - p.num_warmup_steps - c.num_decay_steps);
  c.warmup = shape(k.choice("warmup_type", "linear", {"linear", "cosine", "1-sqrt"}));
  c.decay = shape(k.choice("decay_type", "cosine", {"linear", "cosine", "1-sqrt"}));
  c.min_lr_ratio = k.number("min_lr_ratio", 0.0, kUnit);
  c.num_cycles = k.number("num_cycles", 0.5, kNonNegative);
  check(c.num_decay_steps >= 0 && c.num_stable_steps >= 0,
        "warmup_stable_decay: warmup ({}) + num_decay_steps ({}) exceed the {} training steps", p.num_warmup_steps,
        c.num_decay_steps, p.num_training_steps);
  return c;
}

}  // namespace loom::schedule
