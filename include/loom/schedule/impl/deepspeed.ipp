#pragma once
// Definitions of schedule/deepspeed.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/schedule/deepspeed.hpp>

#include <algorithm>
#include <cmath>
#include <string_view>

namespace loom::schedule {

namespace detail {
LOOM_INLINE DeepSpeedWarmup deepspeed_warmup(const Kwargs& k, const ScheduleParams& p, std::string_view schedule) {
  DeepSpeedWarmup w;
  w.log = k.choice("warmup_type", "log", {"log", "linear"}) == "log";
  // HF fills warmup_num_steps with max(1, warmup steps); DeepSpeed then keeps at least 2.
  const int64_t hf_warmup = std::max<int64_t>(1, p.num_warmup_steps);
  const int64_t given_warmup = k.count("warmup_num_steps", hf_warmup);
  check(given_warmup == hf_warmup,
        "{}: warmup_num_steps {} disagrees with the run's warmup of {} steps (max(1, --warmup_steps / "
        "--warmup_ratio)); HF's DeepSpeed integration requires them equal: set it to \"auto\"",
        schedule, given_warmup, hf_warmup);
  const int64_t given_total = k.count("total_num_steps", p.num_training_steps);
  check(given_total == p.num_training_steps,
        "{}: total_num_steps {} disagrees with the run's {} optimizer steps; HF's DeepSpeed integration requires "
        "them equal: set it to \"auto\"",
        schedule, given_total, p.num_training_steps);
  w.warmup = std::max<int64_t>(2, hf_warmup);
  w.inverse_log_warmup = 1.0 / std::log(static_cast<double>(w.warmup));
  return w;
}
}  // namespace detail

LOOM_INLINE auto ScheduleImpl<WarmupLR>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, WarmupLR::name, {"warmup_type", "warmup_min_lr", "warmup_num_steps", "total_num_steps"});
  Config c;
  c.warmup = detail::deepspeed_warmup(k, p, WarmupLR::name);
  c.min_lr = k.number("warmup_min_lr", 0.0, kNonNegative);
  return c;
}

LOOM_INLINE auto ScheduleImpl<WarmupDecayLR>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, WarmupDecayLR::name, {"warmup_type", "warmup_min_lr", "warmup_num_steps", "total_num_steps"});
  Config c;
  c.warmup = detail::deepspeed_warmup(k, p, WarmupDecayLR::name);
  c.min_lr = k.number("warmup_min_lr", 0.0, kNonNegative);
  return c;
}

LOOM_INLINE auto ScheduleImpl<WarmupCosineLR>::configure(const ScheduleParams& p) -> Config {
  Kwargs k(p.kwargs, WarmupCosineLR::name,
           {"warmup_type", "warmup_min_ratio", "cos_min_ratio", "warmup_num_steps", "total_num_steps"});
  Config c;
  c.warmup = detail::deepspeed_warmup(k, p, WarmupCosineLR::name);
  c.warmup_min_ratio = k.number("warmup_min_ratio", 0.0, kUnit);
  c.cos_min_ratio = k.number("cos_min_ratio", 0.0001, kUnit);
  return c;
}

}  // namespace loom::schedule
