#pragma once
// Definitions of core/error.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>

#include <fmt/format.h>

#include <string>

namespace loom::detail {

[[noreturn]] LOOM_INLINE void vfail(fmt::string_view format, fmt::format_args args) {
  throw Error(fmt::vformat(format, args));
}

}  // namespace loom::detail
