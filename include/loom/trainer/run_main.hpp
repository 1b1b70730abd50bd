#pragma once
// run_main: the error boundary of a loom program's main(). Every failure ends as one
// stderr line starting "loom:" and exit code 2: loom::Error as is, libtorch's c10::Error
// without its stack trace, anything else marked unexpected. A run stopped by a preemption
// signal (loom::Preempted, trainer/preemption.hpp) has saved itself: rank 0 says where, and
// the exit code is kExitPreempted (75).

#include <loom/core/error.hpp>
#include <loom/trainer/preemption.hpp>

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <exception>

namespace loom {

/// Runs `body` (returning the exit code); an exception becomes one `loom:` line and exit code 2.
template <class F>
int run_main(F&& body) {
  try {
    return body();
  } catch (const Preempted& e) {
    const char* rank = std::getenv("RANK");
    if (rank == nullptr || std::string_view(rank) == "0") std::fprintf(stderr, "%s\n", e.what());
    return kExitPreempted;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "loom: libtorch error: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: unexpected error: %s\n", e.what());
  }
  return 2;
}

}  // namespace loom
