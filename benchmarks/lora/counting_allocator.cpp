// bench::CountingAllocator behind a C interface, for the Python side of benchmarks/lora
// (run.py loads this library with ctypes after importing torch, so it wraps the allocator of
// the libc10 that torch loaded): the transformers process counts its tensor bytes exactly as
// build/benchmarks/lora counts loom's.

#include "../common/counting_allocator.hpp"

#include <cstdint>

extern "C" {
void counting_install() { bench::CountingAllocator::install(); }
void counting_reset_peak() { bench::CountingAllocator::install().reset_peak(); }
int64_t counting_peak() { return bench::CountingAllocator::install().peak(); }
int64_t counting_live() { return bench::CountingAllocator::install().live(); }
}
