#pragma once
// core/ re-exports loom::Error (defined in config/, the bottom layer) and adds the helpers
// the upper layers use to raise it.

#include <loom/config/error.hpp>

#include <fmt/format.h>

#include <utility>

namespace loom {

/// Throws loom::Error with a {fmt}-formatted message ("loom: " is prepended).
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

/// Throws loom::Error unless `condition` holds.
template <class... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace loom
