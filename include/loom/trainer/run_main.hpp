#pragma once
// run_main: the error boundary of a loom program's main(). Every failure ends as one
// stderr line starting "loom:" and exit code 2: loom::Error as is, libtorch's c10::Error
// without its stack trace, anything else marked unexpected.

#include <loom/core/error.hpp>

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

namespace loom {

/// Runs `body` (returning the exit code); an exception becomes one `loom:` line and exit code 2.
template <class F>
int run_main(F&& body) {
  try {
    return body();
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
