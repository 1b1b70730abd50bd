#pragma once
// Definitions of config/nearest.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/nearest.hpp>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::detail {

LOOM_INLINE std::size_t levenshtein(std::string_view a, std::string_view b) {
  // Two rolling rows: prev[j] = distance(a[0..i), b[0..j)).
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

LOOM_INLINE std::string nearest_name(std::string_view query, std::span<const std::string_view> candidates) {
  const std::size_t limit = std::max<std::size_t>(2, query.size() / 3);
  std::string_view best, best_prefixed;
  std::size_t best_distance = limit + 1;
  std::size_t best_prefixed_distance = static_cast<std::size_t>(-1);
  for (std::string_view candidate : candidates) {
    const std::size_t d = levenshtein(query, candidate);
    if (d < best_distance) {  // strict: ties keep the earlier candidate
      best_distance = d;
      best = candidate;
    }
    if (query.size() >= 3 && candidate.starts_with(query) && d < best_prefixed_distance) {
      best_prefixed_distance = d;
      best_prefixed = candidate;
    }
  }
  return std::string(best.empty() ? best_prefixed : best);
}

}  // namespace loom::detail
