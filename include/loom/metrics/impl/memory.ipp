#pragma once
// Definitions of metrics/memory.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/metrics.hpp>
#include <loom/metrics/memory.hpp>

#include <torch/torch.h>
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

namespace loom {

namespace detail {
LOOM_INLINE std::optional<int64_t> proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return std::nullopt;
}
}  // namespace detail

LOOM_INLINE int64_t cpu_rss_bytes() { return detail::proc_status_bytes("VmRSS").value_or(0); }

LOOM_INLINE MemoryTracker::MemoryTracker(std::string stage, bool enabled, torch::Device device)
    : stage_(std::move(stage)), device_(device) {
  if (!enabled) return;
  active_ = true;
  std::ofstream("/proc/self/clear_refs") << "5";  // resets VmHWM to the current RSS
  cpu_begin_ = cpu_rss_bytes();
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device_.index());
    gpu_begin_ = allocated();
  }
#endif
}

LOOM_INLINE void MemoryTracker::stop(Metrics& metrics) const {
  if (!active_) return;
  const int64_t end = cpu_rss_bytes();
  const int64_t peak = std::max(detail::proc_status_bytes("VmHWM").value_or(end), end);
  metrics.set(stage_ + "_mem_cpu_alloc_delta", static_cast<double>(end - cpu_begin_));
  metrics.set(stage_ + "_mem_cpu_peaked_delta", static_cast<double>(std::max<int64_t>(0, peak - end)));
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
  if (device_.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    const auto agg = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t gpu_end = stats.allocated_bytes[agg].current;
    const int64_t gpu_peak = stats.allocated_bytes[agg].peak;
    metrics.set(stage_ + "_mem_gpu_alloc_delta", static_cast<double>(gpu_end - gpu_begin_));
    metrics.set(stage_ + "_mem_gpu_peaked_delta", static_cast<double>(std::max<int64_t>(0, gpu_peak - gpu_end)));
  }
#endif
}

#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
LOOM_INLINE int64_t MemoryTracker::allocated() const {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
  return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}
#endif

}  // namespace loom
