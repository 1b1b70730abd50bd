#pragma once
// "Did you mean ...?" support shared by config/fields.hpp (unknown flags and JSON keys) and
// config/validate.hpp (unknown strategy / optimizer / scheduler names).

#include <loom/config/inline.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace loom::detail {

/// Levenshtein edit distance (insert, delete, substitute; each costs 1).
LOOM_INLINE std::size_t levenshtein(std::string_view a, std::string_view b);

/// The candidate closest to `query` within max(2, query.size() / 3) edits; failing that, the
/// closest candidate that starts with `query` (3+ characters: adamw -> adamw_torch); else "".
LOOM_INLINE std::string nearest_name(std::string_view query, std::span<const std::string_view> candidates);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/nearest.ipp>
#endif
