#pragma once
// The host memory the processes of this machine may use, read before anything large is
// allocated: by the memory plan (a CPU run's capacity) and by the models (a config whose
// parameters cannot fit is refused before the model is built).

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>

namespace loom {

/// Bytes of memory this machine gives its processes: /proc/meminfo's MemTotal, or the
/// cgroup's memory.max when that is lower; 0 when neither can be read (unknown).
inline double host_memory_bytes() {
  double total = 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemTotal:") {
      total = kb * 1024;
      break;
    }
    std::getline(meminfo, key);
  }
  std::ifstream cgroup("/sys/fs/cgroup/memory.max");
  double limit = 0;
  if (cgroup >> limit && limit > 0 && (total == 0 || limit < total)) total = limit;  // "max" reads as no number
  return total;
}

/// The job's processes on this machine (torchrun's LOCAL_WORLD_SIZE; 1 without it or when it
/// is not a positive number, which start-up reports).
inline int local_processes() {
  const char* text = std::getenv("LOCAL_WORLD_SIZE");
  if (text == nullptr) return 1;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  return end != text && *end == '\0' && n > 0 && n < 1'000'000 ? static_cast<int>(n) : 1;
}

}  // namespace loom
