#pragma once
// loom::Metrics: an insertion-ordered name -> number map, the C++ twin of the dicts HF
// passes to log() and returns from evaluate(). Order matters: log_history keeps it.

#include <loom/config/inline.hpp>

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

/// Insertion-ordered metrics ("loss", "eval_accuracy", ...), as HF's logs dicts.
class Metrics {
 public:
  using value_type = std::pair<std::string, double>;

  Metrics() = default;
  /// Builds from a list of (name, value) pairs, keeping their order.
  Metrics(std::initializer_list<value_type> items);

  /// Sets `name` (appending it if new, keeping its place if not).
  void set(std::string_view name, double value);
  /// The value of `name`, if present.
  [[nodiscard]] std::optional<double> get(std::string_view name) const;
  /// True when `name` is present.
  [[nodiscard]] bool contains(std::string_view name) const { return get(name).has_value(); }
  /// Removes `name` if present.
  void erase(std::string_view name);
  /// Copies every entry of `other` with `prefix` prepended to its name.
  void merge(const Metrics& other, std::string_view prefix = {});

  [[nodiscard]] auto begin() const { return items_.begin(); }
  [[nodiscard]] auto end() const { return items_.end(); }
  [[nodiscard]] std::size_t size() const { return items_.size(); }
  [[nodiscard]] bool empty() const { return items_.empty(); }

  /// As a JSON object, in insertion order.
  [[nodiscard]] nlohmann::ordered_json to_json() const;

 private:
  std::vector<value_type> items_;
};

/// `metrics` as HF's metrics_format shows them, in their order: `*_mem_*` as "<bytes >> 20>MB",
/// `*_runtime*` as h:mm:ss.cc, total_flos as "<flos >> 30>GF", every other value rounded to 4
/// digits and written as Python writes a float (loom's metrics are all floats, so an integer
/// HF would print as 3 prints as 3.0).
[[nodiscard]] LOOM_INLINE std::vector<std::pair<std::string, std::string>> metrics_format(const Metrics& metrics);

/// HF's log_metrics text: "***** <split> metrics *****", then "  <name> = <value>" per
/// metric, sorted by name, names padded to the longest and values right-aligned.
[[nodiscard]] LOOM_INLINE std::string format_metrics_report(std::string_view split, const Metrics& metrics);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/core/impl/metrics.ipp>
#endif
