#pragma once
// Definitions of metrics/speed.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/metrics.hpp>
#include <loom/metrics/speed.hpp>

#include <chrono>
#include <cmath>
#include <optional>
#include <string>

namespace loom {

namespace detail {
LOOM_INLINE double round_to(double v, int digits) {
  const double scale = std::pow(10.0, digits);
  return std::round(v * scale) / scale;
}
}  // namespace detail

LOOM_INLINE Metrics speed_metrics(const std::string& split, std::chrono::steady_clock::time_point start,
                                  std::optional<double> num_samples, std::optional<double> num_steps) {
  const double runtime = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Metrics m;
  m.set(split + "_runtime", detail::round_to(runtime, 4));
  if (num_samples) m.set(split + "_samples_per_second", detail::round_to(*num_samples / runtime, 3));
  if (num_steps) m.set(split + "_steps_per_second", detail::round_to(*num_steps / runtime, 3));
  return m;
}

}  // namespace loom
