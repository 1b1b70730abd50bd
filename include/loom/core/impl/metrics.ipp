#pragma once
// Definitions of core/metrics.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/metrics.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>

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

namespace detail {

// Python's repr of a float: the shortest round-trip digits, and ".0" on a whole number.
inline std::string python_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // e: exponent, n: nan/inf
  return s;
}

// Python's round(v, 4): the double nearest the correctly rounded decimal.
inline double round4(double v) {
  if (!std::isfinite(v)) return v;
  return std::stod(fmt::format("{:.4f}", v));
}

// HF's _secs2timedelta: str(timedelta(seconds=int(secs))) + "." + two digits of the fraction.
inline std::string secs_to_timedelta(double secs) {
  const auto whole = static_cast<int64_t>(secs);  // Python's int(): toward zero
  const auto cents = static_cast<int64_t>(std::abs(secs - static_cast<double>(whole)) * 100);
  // timedelta normalizes to days >= any sign and 0 <= seconds < 86400.
  int64_t days = whole / 86400, rest = whole % 86400;
  if (rest < 0) rest += 86400, days -= 1;
  std::string out;
  if (days != 0) out = fmt::format("{} day{}, ", days, days == 1 || days == -1 ? "" : "s");
  out += fmt::format("{}:{:02}:{:02}", rest / 3600, rest / 60 % 60, rest % 60);
  return fmt::format("{}.{:02}", out, cents);
}

}  // namespace detail

LOOM_INLINE std::vector<std::pair<std::string, std::string>> metrics_format(const Metrics& metrics) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [k, v] : metrics) {
    std::string text;
    if (k.find("_mem_") != std::string::npos) text = fmt::format("{}MB", static_cast<int64_t>(v) >> 20);
    else if (k.find("_runtime") != std::string::npos) text = detail::secs_to_timedelta(v);
    else if (k == "total_flos") text = fmt::format("{}GF", static_cast<int64_t>(v) >> 30);
    else text = detail::python_float(detail::round4(v));
    out.emplace_back(k, std::move(text));
  }
  return out;
}

LOOM_INLINE std::string format_metrics_report(std::string_view split, const Metrics& metrics) {
  auto rows = metrics_format(metrics);
  std::sort(rows.begin(), rows.end());
  std::size_t kw = 0, vw = 0;
  for (const auto& [k, v] : rows) kw = std::max(kw, k.size()), vw = std::max(vw, v.size());
  std::string out = fmt::format("***** {} metrics *****\n", split);
  for (const auto& [k, v] : rows) out += fmt::format("  {:<{}} = {:>{}}\n", k, kw, v, vw);
  return out;
}

}  // namespace loom
