#pragma once
// HF's TrainerMemoryTracker, for skip_memory_metrics=false: per stage (init, train, eval,
// test) the change in process RSS and how far the peak went above the end value,
//   <stage>_mem_cpu_alloc_delta, <stage>_mem_cpu_peaked_delta   (bytes)
// plus the same for the CUDA caching allocator when the model is on a GPU
//   <stage>_mem_gpu_alloc_delta, <stage>_mem_gpu_peaked_delta.
// The CPU peak comes from the kernel's high-water mark (VmHWM), reset at the start of a
// stage through /proc/self/clear_refs, so no sampling thread is needed.

#include <loom/core/metrics.hpp>

#include <torch/torch.h>
#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#include <c10/cuda/CUDACachingAllocator.h>
#define LOOM_HAS_CUDA_ALLOCATOR_STATS 1
#endif

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace loom {

namespace detail {
// A field of /proc/self/status in bytes (values there are in kB).
inline std::optional<int64_t> proc_status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return std::nullopt;
}
}  // namespace detail

/// Process resident set size in bytes (0 where /proc is missing).
inline int64_t cpu_rss_bytes() { return detail::proc_status_bytes("VmRSS").value_or(0); }

/// Measures one stage's memory; stop() adds the HF metric names to a Metrics.
class MemoryTracker {
 public:
  /// Starts measuring `stage` ("init", "train", "eval", "test"); does nothing when `enabled` is false.
  MemoryTracker(std::string stage, bool enabled, torch::Device device) : stage_(std::move(stage)), device_(device) {
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
  /// Adds <stage>_mem_* metrics to `metrics` (nothing when disabled).
  void stop(Metrics& metrics) const {
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

 private:
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
  int64_t allocated() const {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index());
    return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
  }
#endif
  std::string stage_;
  torch::Device device_;
  bool active_ = false;
  int64_t cpu_begin_ = 0, gpu_begin_ = 0;
};

}  // namespace loom
