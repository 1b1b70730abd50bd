#pragma once
// HF's TrainerMemoryTracker, for skip_memory_metrics=false: per stage (init, train, eval,
// test) the change in process RSS and how far the peak went above the end value,
//   <stage>_mem_cpu_alloc_delta, <stage>_mem_cpu_peaked_delta   (bytes)
// plus the same for the CUDA caching allocator when the model is on a GPU
//   <stage>_mem_gpu_alloc_delta, <stage>_mem_gpu_peaked_delta.
// The CPU peak comes from the kernel's high-water mark (VmHWM), reset at the start of a
// stage through /proc/self/clear_refs, so no sampling thread is needed.

#include <loom/config/inline.hpp>
#include <loom/core/metrics.hpp>

#include <torch/torch.h>
// The allocator header itself is included by impl/memory.ipp, which alone uses it.
#if __has_include(<c10/cuda/CUDACachingAllocator.h>)
#define LOOM_HAS_CUDA_ALLOCATOR_STATS 1
#endif

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

namespace detail {
// A field of /proc/self/status in bytes (values there are in kB).
LOOM_INLINE std::optional<int64_t> proc_status_bytes(const std::string& key);
}  // namespace detail

/// Process resident set size in bytes (0 where /proc is missing).
LOOM_INLINE int64_t cpu_rss_bytes();

/// Measures one stage's memory; stop() adds the HF metric names to a Metrics.
class MemoryTracker {
 public:
  /// Starts measuring `stage` ("init", "train", "eval", "test"); does nothing when `enabled` is false.
  MemoryTracker(std::string stage, bool enabled, torch::Device device);
  /// Adds <stage>_mem_* metrics to `metrics` (nothing when disabled).
  void stop(Metrics& metrics) const;

 private:
#ifdef LOOM_HAS_CUDA_ALLOCATOR_STATS
  int64_t allocated() const;
#endif
  std::string stage_;
  torch::Device device_;
  bool active_ = false;
  int64_t cpu_begin_ = 0, gpu_begin_ = 0;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/metrics/impl/memory.ipp>
#endif
