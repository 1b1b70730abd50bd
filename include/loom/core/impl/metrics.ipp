#pragma once
// Definitions of core/metrics.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/metrics.hpp>

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

LOOM_INLINE Metrics::Metrics(std::initializer_list<value_type> items) {
  for (const auto& [k, v] : items) set(k, v);
}

LOOM_INLINE void Metrics::set(std::string_view name, double value) {
  for (auto& item : items_)
    if (item.first == name) {
      item.second = value;
      return;
    }
  items_.emplace_back(std::string(name), value);
}

LOOM_INLINE std::optional<double> Metrics::get(std::string_view name) const {
  for (const auto& item : items_)
    if (item.first == name) return item.second;
  return std::nullopt;
}

LOOM_INLINE void Metrics::erase(std::string_view name) {
  std::erase_if(items_, [&](const value_type& item) { return item.first == name; });
}

LOOM_INLINE void Metrics::merge(const Metrics& other, std::string_view prefix) {
  for (const auto& [k, v] : other.items_) set(std::string(prefix) + k, v);
}

LOOM_INLINE nlohmann::ordered_json Metrics::to_json() const {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& [k, v] : items_) out[k] = v;
  return out;
}

}  // namespace loom
