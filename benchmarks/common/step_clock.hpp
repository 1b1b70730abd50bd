#pragma once
// The step clock of the benchmarks that time a Trainer's steps from a callback (lora, dpo):
// each optimizer step's end since training began, on the wall clock and in the process's CPU
// time (which machine load inflates less); run.py takes the median of the differences.

#include <chrono>
#include <ctime>
#include <vector>

namespace bench {

/// CPU time of this process, all threads (Python's time.process_time()).
inline double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// Seconds from start() to each lap(), wall and CPU.
struct StepClock {
  std::vector<double> ends, cpu_ends;  ///< one per lap

  void start() {
    start_ = std::chrono::steady_clock::now();
    cpu_start_ = cpu_seconds();
  }
  void lap() {
    ends.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    cpu_ends.push_back(cpu_seconds() - cpu_start_);
  }

 private:
  std::chrono::steady_clock::time_point start_;
  double cpu_start_ = 0;
};

}  // namespace bench
