#pragma once
// Definitions of config/given_flags.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/given_flags.hpp>

#include <algorithm>
#include <string>
#include <string_view>

namespace loom {

LOOM_INLINE bool GivenFlags::contains(std::string_view name) const {
  return std::binary_search(names_.begin(), names_.end(), name);
}

namespace detail {
// Inserts `name` into the sorted `names` unless it is there.
inline void insert_sorted(std::vector<std::string>& names, std::string_view name) {
  const auto at = std::lower_bound(names.begin(), names.end(), name);
  if (at == names.end() || *at != name) names.emplace(at, name);
}
}  // namespace detail

LOOM_INLINE void GivenFlags::insert(std::string_view name) { detail::insert_sorted(names_, name); }

LOOM_INLINE void GivenFlags::insert_ignored(std::string_view name) { detail::insert_sorted(ignored_, name); }

}  // namespace loom
