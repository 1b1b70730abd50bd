#pragma once
// HF's speed_metrics: <split>_runtime (s, 4 decimals), <split>_samples_per_second and
// <split>_steps_per_second (3 decimals).

#include <loom/config/inline.hpp>
#include <loom/core/metrics.hpp>

#include <chrono>
#include <optional>
#include <string>

namespace loom {

namespace detail {
// `v` rounded to `digits` decimals.
LOOM_INLINE double round_to(double v, int digits);
}  // namespace detail

/// Runtime and throughput of a phase that started at `start`.
LOOM_INLINE Metrics speed_metrics(const std::string& split, std::chrono::steady_clock::time_point start,
                                  std::optional<double> num_samples = std::nullopt,
                                  std::optional<double> num_steps = std::nullopt);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/metrics/impl/speed.ipp>
#endif
