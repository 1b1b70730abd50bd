#pragma once
// A counting wrapper around torch's CPU allocator, for the benchmarks that report peak tensor
// memory (checkpointing, lora). Installed with c10::SetCPUAllocator before the tensors it
// should see exist, it counts the bytes of every CPU tensor storage allocated through it that
// is still alive, and the most alive at once since the last reset_peak(). It counts requested
// bytes, exactly: no allocator slack, no libtorch code or oneDNN scratch space. Storages
// allocated before it was installed are not counted, nor their release.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace bench {

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}

  /// Wraps the current CPU allocator in one that lives for the whole process and installs it
  /// (priority 100: above torch's default); later calls return the same one.
  static CountingAllocator& install() {
    static CountingAllocator* counting = [] {
      auto* c = new CountingAllocator(c10::GetCPUAllocator());  // never freed: storages may outlive main
      c10::SetCPUAllocator(c, /*priority=*/100);
      return c;
    }();
    return *counting;
  }

  c10::DataPtr allocate(size_t n) override {
    auto* ctx = new Context{base_->allocate(n), n, this};
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {ctx->inner.get(), ctx, &Context::release, c10::Device(c10::kCPU)};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  /// Starts a new peak from the bytes alive now.
  void reset_peak() { peak_.store(live_.load()); }
  /// The most bytes alive at once since the last reset_peak (or installation).
  [[nodiscard]] int64_t peak() const { return peak_.load(); }
  /// Bytes alive now (of the storages allocated since installation).
  [[nodiscard]] int64_t live() const { return live_.load(); }

 private:
  struct Context {
    c10::DataPtr inner;
    size_t bytes;
    CountingAllocator* owner;
    static void release(void* p) {
      auto* ctx = static_cast<Context*>(p);
      ctx->owner->live_.fetch_sub(static_cast<int64_t>(ctx->bytes));
      delete ctx;
    }
  };
  c10::Allocator* base_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

}  // namespace bench
