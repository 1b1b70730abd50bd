#pragma once
// Definitions of config/fields.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/fields.hpp>
#include <loom/config/nearest.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name) {
  for (const FieldInfo& info : table)
    if (info.name == name) return &info;
  return nullptr;
}

LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table) {
  std::vector<std::string_view> names;
  names.reserve(table.size());
  for (const FieldInfo& info : table) names.push_back(info.name);
  return nearest_name(given, names);
}

}  // namespace loom::detail
