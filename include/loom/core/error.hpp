#pragma once
// core/ re-exports loom::Error (defined in config/, the bottom layer) and adds the helpers
// the upper layers use to raise it.

#include <loom/config/error.hpp>
#include <loom/config/inline.hpp>

#include <fmt/format.h>

#include <utility>

namespace loom {

namespace detail {
/// Throws loom::Error with `format` applied to `args`: the type-erased body of fail/check,
/// so {fmt}'s formatting engine is compiled here once, not in every caller.
[[noreturn]] LOOM_INLINE void vfail(fmt::string_view format, fmt::format_args args);
}  // namespace detail

/// Throws loom::Error with a {fmt}-formatted message ("loom: " is prepended).
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  detail::vfail(format.get(), fmt::make_format_args(args...));
}

/// Throws loom::Error unless `condition` holds.
template <class... Args>
void check(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition) [[unlikely]]
    detail::vfail(format.get(), fmt::make_format_args(args...));
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/core/impl/error.ipp>
#endif
