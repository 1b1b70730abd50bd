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

LOOM_INLINE void GivenFlags::insert(std::string_view name) {
  const auto at = std::lower_bound(names_.begin(), names_.end(), name);
  if (at == names_.end() || *at != name) names_.emplace(at, name);
}

}  // namespace loom
