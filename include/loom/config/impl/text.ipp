#pragma once
// Definitions of config/text.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/text.hpp>

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace loom::detail {

// ---- text -> value ----------------------------------------------------------------------

LOOM_INLINE int64_t parse_byte_size(std::string_view text, std::string_view what) {
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  int64_t value = 0;
  const auto [unit_begin, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || value <= 0)
    throw Error("loom: " + std::string(what) + " must be a positive integer with an optional unit (\"50GB\", "
                "\"200MB\", \"1000\"), got \"" + std::string(text) + "\"");
  std::string unit(unit_begin, end);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, int64_t> units{{"", 1},         {"B", 1},          {"KB", 1000},
                                                    {"MB", 1000000}, {"GB", 1000000000}, {"TB", 1000000000000},
                                                    {"KIB", 1024},   {"MIB", 1 << 20},   {"GIB", 1 << 30}};
  const auto it = units.find(unit);
  if (it == units.end())
    throw Error("loom: " + std::string(what) + " \"" + std::string(text) +
                "\" has an unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB)");
  if (value > std::numeric_limits<int64_t>::max() / it->second)
    throw Error("loom: " + std::string(what) + " \"" + std::string(text) + "\" is too large");
  return value * it->second;
}

LOOM_INLINE std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

LOOM_INLINE std::optional<bool> parse_bool(std::string_view text) {
  const std::string s = ascii_lower(text);
  if (s == "true" || s == "1" || s == "yes" || s == "y" || s == "t" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "n" || s == "f" || s == "off") return false;
  return std::nullopt;
}

// The body of parse_finite_float / parse_finite_double.
template <class Parsed>
std::optional<Parsed> parse_finite(std::string_view text) {
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return std::nullopt;
  }
  if (text.empty()) return std::nullopt;
  Parsed value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size() || !std::isfinite(value))
    return std::nullopt;
  return value;
}

LOOM_INLINE std::optional<float> parse_finite_float(std::string_view text) { return parse_finite<float>(text); }

LOOM_INLINE std::optional<double> parse_finite_double(std::string_view text) { return parse_finite<double>(text); }

LOOM_INLINE bool is_none_literal(std::string_view text) { return text == "none" || text == "None"; }

LOOM_INLINE Error bad_text_error(std::string_view flag, std::string_view kind, std::string_view text) {
  return Error("loom: --" + std::string(flag) + " expects " + std::string(kind) + ", got '" + std::string(text) +
               "'");
}

// ---- value -> text (for --help) -----------------------------------------------------------

// The body of floating_to_text.
template <class S>
std::string floating_text(S value) {
  if (!std::isfinite(value)) {
    std::ostringstream os;
    os << value;
    return os.str();
  }
  // Shortest text that reads back to the same value: 5e-05, 0.9, 3, 1e-08.
  using Shown = std::conditional_t<std::is_same_v<S, float>, float, double>;
  std::array<char, 64> buffer{};
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), static_cast<Shown>(value));
  return ec == std::errc{} ? std::string(buffer.data(), end) : std::string("?");
}

LOOM_INLINE std::string floating_to_text(float value) { return floating_text(value); }
LOOM_INLINE std::string floating_to_text(double value) { return floating_text(value); }
LOOM_INLINE std::string floating_to_text(long double value) { return floating_text(value); }

LOOM_INLINE void append_help_line(std::string& out, std::string_view name, std::string_view kind,
                                  const std::string& default_text, std::string_view description) {
  out += "  --";
  out += name;
  out += " <";
  out += kind;
  out += ">  (default: ";
  out += default_text;
  out += ")\n";
  if (!description.empty()) {
    out += "      ";
    out += description;
    out += '\n';
  }
}

}  // namespace loom::detail
