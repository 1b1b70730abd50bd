#pragma once
// Text <-> value for the settings of a reflected struct (config/fields.hpp): a command-line
// flag's text read into a field's type, and a field's value written as --help shows its
// default. The words, number forms and messages are HfArgumentParser's:
//   bool      true/false/1/0/yes/no/y/n/t/f/on/off, any case (Python's strtobool)
//   integers  the whole text, no overflow, no "-1" for an unsigned field
//   numbers   finite only: 1e-3, 5e-5, .5, 3 (no nan, inf)
//   optional  `none` or `None` resets it

#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/meta.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace loom::detail {

// ---- text -> value ----------------------------------------------------------------------

/// Bytes of an HF-style size ("50GB", "200MB", "10GiB", "1000"): a positive integer with an
/// optional unit B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB (powers of 1024), any case;
/// a loom::Error naming `what` otherwise.
LOOM_INLINE int64_t parse_byte_size(std::string_view text, std::string_view what);

/// `s` with A-Z lowered (other bytes as they are).
LOOM_INLINE std::string ascii_lower(std::string_view s);

/// The words Python's strtobool (used by HfArgumentParser) accepts, in any case.
LOOM_INLINE std::optional<bool> parse_bool(std::string_view text);

// Whole-string integer parse: rejects "", "3.5", "abc", " 3", overflow, and "-1" for unsigned.
template <class I>
std::optional<I> parse_integer(std::string_view text) {
  if (!text.empty() && text.front() == '+') {
    text.remove_prefix(1);
    if (!text.empty() && text.front() == '-') return std::nullopt;
  }
  if (text.empty()) return std::nullopt;
  I value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Whole-string finite floating parse: accepts 1e-3, 5e-5, .5, 3; rejects nan, inf, overflow,
// "abc" and trailing junk.
LOOM_INLINE std::optional<float> parse_finite_float(std::string_view text);
LOOM_INLINE std::optional<double> parse_finite_double(std::string_view text);

template <class D>
std::optional<D> parse_floating(std::string_view text) {
  if constexpr (std::is_same_v<D, float>) {
    return parse_finite_float(text);
  } else {
    // long double goes through double: from_chars(long double) is not everywhere.
    const std::optional<double> value = parse_finite_double(text);
    if (!value) return std::nullopt;
    return static_cast<D>(*value);
  }
}

/// "none" or "None": resets an optional field.
LOOM_INLINE bool is_none_literal(std::string_view text);

/// "loom: --<flag> expects <kind>, got '<text>'".
LOOM_INLINE Error bad_text_error(std::string_view flag, std::string_view kind, std::string_view text);

/// Sets `field` from command-line text; `flag` is the canonical field name, for messages.
template <class F>
void set_from_text(F& field, std::string_view text, std::string_view flag) {
  using Traits = field_traits<F>;
  if constexpr (Traits::is_optional) {
    if (is_none_literal(text)) {
      field.reset();
      return;
    }
  }
  using S = typename Traits::scalar;
  std::optional<S> parsed;
  if constexpr (std::is_same_v<S, bool>) parsed = parse_bool(text);
  else if constexpr (is_integer_field_v<S>) parsed = parse_integer<S>(text);
  else if constexpr (std::is_floating_point_v<S>) parsed = parse_floating<S>(text);
  else if constexpr (std::is_same_v<S, std::string>) parsed = std::string(text);
  else static_assert(dependent_false_v<S>, "loom: unsupported field type");
  if (!parsed) throw bad_text_error(flag, field_kind_phrase<F>(), text);
  field = std::move(*parsed);
}

// ---- value -> text (for --help) -----------------------------------------------------------

/// Shortest text that reads back to the same value: 5e-05, 0.9, 3, 1e-08 (long double is
/// shown as double); non-finite values as an ostream writes them (inf, nan).
LOOM_INLINE std::string floating_to_text(float value);
LOOM_INLINE std::string floating_to_text(double value);
LOOM_INLINE std::string floating_to_text(long double value);

template <class S>
std::string scalar_to_text(const S& value) {
  if constexpr (std::is_same_v<S, bool>) {
    return value ? "true" : "false";
  } else if constexpr (is_integer_field_v<S>) {
    return std::to_string(value);
  } else if constexpr (std::is_floating_point_v<S>) {
    return floating_to_text(value);
  } else if constexpr (std::is_same_v<S, std::string>) {
    return value.empty() ? std::string("\"\"") : value;
  } else {
    static_assert(dependent_false_v<S>, "loom: unsupported field type");
  }
}

template <class F>
std::string field_to_text(const F& value) {
  if constexpr (field_traits<F>::is_optional) {
    return value ? scalar_to_text(*value) : std::string("none");
  } else {
    return scalar_to_text(value);
  }
}

/// Appends `  --<name> <<kind>>  (default: <default_text>)`, a newline, and the description
/// (when there is one) on a line of its own, indented: one setting of --help.
LOOM_INLINE void append_help_line(std::string& out, std::string_view name, std::string_view kind,
                                  const std::string& default_text, std::string_view description);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/text.ipp>
#endif
