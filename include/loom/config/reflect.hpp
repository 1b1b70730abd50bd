#pragma once
// Reflection over plain aggregates (TrainingArguments, a user's ModelArgs, ...) with
// Boost.PFR: command-line parsing in the style of HfArgumentParser, --help text, and JSON.
//
// Supported field types: bool, integer types (not the character types char, wchar_t,
// char8_t, char16_t, char32_t; int8_t/uint8_t are fine), float/double/long double,
// std::string, and std::optional of any of those. Any other field type, a const field, or a
// non-aggregate is a compile error whose message starts with "loom:".
//
// Command line (one or several structs at once, as HfArgumentParser((A, B))):
//   --name value   --name=value   --name-with-dashes value (dashes read as underscores)
//   bool fields may be bare: `--fp16` means true; `--fp16 false` (or true/1/0/yes/no/on/off/
//   t/f/y/n, any case) sets the value; a bare bool followed by another --flag is true.
//   optional fields: a value sets them, `none` or `None` resets them to nullopt.
//   --help or -h anywhere asks for help. No positional arguments.
//   A field name present in two of the structs parsed together is a compile error, and so is
//   a field named `help`.

#include <loom/config/error.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/json.hpp>
#include <loom/config/nearest.hpp>

#include <boost/pfr.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if !BOOST_PFR_CORE_NAME_ENABLED
#error "loom: config/reflect.hpp needs Boost.PFR field names (C++20 with g++ >= 11 or clang >= 12)"
#endif

namespace loom {

/// What try_parse_args found: the parsed structs, or help == true when --help/-h was given.
template <class... Ts>
struct ParseResult {
  std::tuple<Ts...> values{};  ///< each struct default-constructed, then the given flags applied
  bool help = false;           ///< --help or -h was given; `values` then holds the defaults
};

namespace detail {

// ---- supported field types ------------------------------------------------------------

template <class S>
inline constexpr bool is_char_type_v =
    std::is_same_v<S, char> || std::is_same_v<S, wchar_t> || std::is_same_v<S, char8_t> ||
    std::is_same_v<S, char16_t> || std::is_same_v<S, char32_t>;

template <class S>
inline constexpr bool is_integer_field_v =
    std::is_integral_v<S> && !std::is_same_v<S, bool> && !is_char_type_v<S>;

// A scalar field: what may stand alone or inside std::optional. cv-qualified types are out
// (a const field cannot be assigned by the parser).
template <class S>
inline constexpr bool is_scalar_field_v =
    std::is_same_v<S, std::remove_cv_t<S>> &&
    (std::is_same_v<S, bool> || is_integer_field_v<S> || std::is_floating_point_v<S> ||
     std::is_same_v<S, std::string>);

template <class F>
struct field_traits {
  using scalar = F;
  static constexpr bool is_optional = false;
};
template <class U>
struct field_traits<std::optional<U>> {
  using scalar = U;
  static constexpr bool is_optional = true;
};

template <class F>
inline constexpr bool is_supported_field_v =
    std::is_same_v<F, std::remove_cv_t<F>> && is_scalar_field_v<typename field_traits<F>::scalar>;

template <class T>
consteval bool all_fields_supported() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (is_supported_field_v<boost::pfr::tuple_element_t<I, T>> && ... && true);
  }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
}

template <class T>
consteval bool has_field_named_help() {
  for (std::string_view name : boost::pfr::names_as_array<T>())
    if (name == "help") return true;
  return false;
}

template <class T>
constexpr void check_reflectable() {
  static_assert(std::is_aggregate_v<T> && std::is_default_constructible_v<T>,
                "loom: reflected types must be default-constructible aggregates (plain structs)");
  static_assert(all_fields_supported<T>(),
                "loom: every field of a reflected struct must be bool, an integer, a floating-point "
                "number, std::string, or std::optional of one of those (and not const)");
}

template <class... Ts>
consteval bool field_names_unique() {
  constexpr std::size_t total = (boost::pfr::tuple_size_v<Ts> + ... + 0);
  std::array<std::string_view, total> all{};
  std::size_t k = 0;
  (
      [&] {
        for (std::string_view name : boost::pfr::names_as_array<Ts>()) all[k++] = name;
      }(),
      ...);
  for (std::size_t i = 0; i < total; ++i)
    for (std::size_t j = i + 1; j < total; ++j)
      if (all[i] == all[j]) return false;
  return true;
}

template <class... Ts>
constexpr void check_parseable() {
  (check_reflectable<Ts>(), ...);
  static_assert(sizeof...(Ts) > 0, "loom: parse_args needs at least one struct type");
  static_assert(field_names_unique<Ts...>(),
                "loom: two structs parsed together have a field with the same name; rename one");
  static_assert(!(has_field_named_help<Ts>() || ...),
                "loom: a field named `help` would clash with --help; rename it");
}

// ---- kinds: how a field type is named in messages and --help ---------------------------

/// "an integer", "a number", ... as used in "expects ..." and "needs a value (...)".
template <class S>
constexpr std::string_view kind_phrase() {
  if constexpr (std::is_same_v<S, bool>) return "true/false";
  else if constexpr (is_integer_field_v<S> && std::is_unsigned_v<S>) return "a non-negative integer";
  else if constexpr (is_integer_field_v<S>) return "an integer";
  else if constexpr (std::is_floating_point_v<S>) return "a number";
  else if constexpr (std::is_same_v<S, std::string>) return "a string";
  else {
    static_assert(dependent_false_v<S>, "loom: unsupported field type");
    return {};
  }
}

/// "int", "float", ... as shown in --help.
template <class S>
constexpr std::string_view kind_short() {
  if constexpr (std::is_same_v<S, bool>) return "bool";
  else if constexpr (is_integer_field_v<S>) return "int";
  else if constexpr (std::is_floating_point_v<S>) return "float";
  else if constexpr (std::is_same_v<S, std::string>) return "string";
  else {
    static_assert(dependent_false_v<S>, "loom: unsupported field type");
    return {};
  }
}

template <class F>
std::string field_kind_phrase() {
  std::string phrase(kind_phrase<typename field_traits<F>::scalar>());
  if constexpr (field_traits<F>::is_optional) phrase += " or none";
  return phrase;
}

// ---- text -> value ----------------------------------------------------------------------

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

// ---- the flat table of every field of every struct ---------------------------------------

struct FieldInfo {
  std::string_view name;    // canonical field name (static storage, from Boost.PFR)
  std::size_t type_index;   // which struct of the pack
  std::size_t field_index;  // which field of that struct
  bool is_bool;             // bool or optional<bool>: may be given bare
  std::string kind;         // "an integer", "a number or none", ...
};

template <class T, std::size_t TI>
void append_fields(std::vector<FieldInfo>& table) {
  constexpr auto names = boost::pfr::names_as_array<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (table.push_back(FieldInfo{
         names[I], TI, I,
         std::is_same_v<typename field_traits<boost::pfr::tuple_element_t<I, T>>::scalar, bool>,
         field_kind_phrase<boost::pfr::tuple_element_t<I, T>>()}),
     ...);
  }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
}

template <class... Ts>
std::vector<FieldInfo> field_table() {
  std::vector<FieldInfo> table;
  [&]<std::size_t... TI>(std::index_sequence<TI...>) {
    (append_fields<Ts, TI>(table), ...);
  }(std::index_sequence_for<Ts...>{});
  return table;
}

template <std::size_t TI = 0, class Tuple>
void assign_field(Tuple& values, const FieldInfo& info, std::string_view text) {
  if constexpr (TI < std::tuple_size_v<Tuple>) {
    if (info.type_index != TI) return assign_field<TI + 1>(values, info, text);
    boost::pfr::for_each_field(std::get<TI>(values), [&](auto& field, std::size_t index) {
      if (index == info.field_index) set_from_text(field, text, info.name);
    });
  }
}

/// "loom: unknown argument --<given>", with the nearest flag of `table` when one is close.
LOOM_INLINE std::string unknown_flag_message(std::string_view given, const std::vector<FieldInfo>& table);

/// True when --help or -h is among `args`.
LOOM_INLINE bool asks_for_help(std::span<const std::string> args);

/// What parse_flags calls to store a flag's text into the field `info` names: `assign(context,
/// info, text)` (a function pointer, so the parsing loop is compiled once, not per struct pack).
struct FieldAssigner {
  void* context;
  void (*assign)(void* context, const FieldInfo& info, std::string_view text);
};

/// The flag loop of try_parse_args over `table`: splits --name=value, reads dashes as
/// underscores, finds the field, rejects unknown, repeated and value-less flags, and hands
/// each value to `assigner` in order.
LOOM_INLINE void parse_flags(std::span<const std::string> args, const std::vector<FieldInfo>& table,
                             FieldAssigner assigner);

// ---- --help text and the CLI entry's exits --------------------------------------------------

/// The usage line and the fixed part of --help, up to and including the --help line.
LOOM_INLINE std::string help_usage(std::string_view program);

/// Appends `  --<name> <<kind>>  (default: <default_text>)` and a newline.
LOOM_INLINE void append_help_line(std::string& out, std::string_view name, std::string_view kind,
                                  const std::string& default_text);

/// argv[0]'s file name ("program" when argv[0] is missing; argv[0] itself when it has no name).
LOOM_INLINE std::string program_name(int argc, const char* const* argv);

/// argv[1..argc) as strings.
LOOM_INLINE std::vector<std::string> collect_args(int argc, const char* const* argv);

/// Prints `e` to stderr and exits 2.
[[noreturn]] LOOM_INLINE void exit_with_error(const Error& e);

/// Prints `help` to stdout and exits 0.
[[noreturn]] LOOM_INLINE void exit_with_help(const std::string& help);

// ---- JSON value -> field ------------------------------------------------------------------

/// A JSON value as error messages show it: "an object", "an array", "null", or its dump
/// (cut to 60 characters). Any nlohmann::basic_json; the two usual ones are compiled once.
template <class Json>
std::string describe_json(const Json& value) {
  if (value.is_object() || value.is_array()) return std::string("an ") + value.type_name();
  if (value.is_null()) return "null";
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}
LOOM_INLINE std::string describe_json(const nlohmann::json& value);
LOOM_INLINE std::string describe_json(const nlohmann::ordered_json& value);

/// "loom: JSON key '<key>' expects <kind>, got <got><note>".
LOOM_INLINE Error json_type_error(std::string_view key, std::string_view kind, std::string_view got,
                                  std::string_view note);

/// "loom: JSON key '<key>' is null, but the field is not optional (expects <kind>)".
LOOM_INLINE Error json_null_error(std::string_view key, std::string_view kind);

/// "loom: unknown JSON key '<key>'", with the nearest of `names` when one is close.
LOOM_INLINE Error unknown_key_error(const std::string& key, std::span<const std::string_view> names);

template <class F, class Json>
void set_from_json(F& field, const Json& value, std::string_view key) {
  using Traits = field_traits<F>;
  using S = typename Traits::scalar;
  auto wrong = [&](std::string_view note = {}) {
    return json_type_error(key, field_kind_phrase<F>(), describe_json(value), note);
  };
  if (value.is_null()) {
    if constexpr (Traits::is_optional) {
      field.reset();
      return;
    } else {
      throw json_null_error(key, field_kind_phrase<F>());
    }
  }
  S parsed{};
  if constexpr (std::is_same_v<S, bool>) {
    if (!value.is_boolean()) throw wrong();
    parsed = value.template get<bool>();
  } else if constexpr (is_integer_field_v<S>) {
    if (value.is_number_unsigned()) {
      const auto v = value.template get<std::uint64_t>();
      if (!std::in_range<S>(v)) throw wrong(" (out of range)");
      parsed = static_cast<S>(v);
    } else if (value.is_number_integer()) {
      const auto v = value.template get<std::int64_t>();
      if (!std::in_range<S>(v)) throw wrong(" (out of range)");
      parsed = static_cast<S>(v);
    } else {
      throw wrong();
    }
  } else if constexpr (std::is_floating_point_v<S>) {
    if (!value.is_number()) throw wrong();
    parsed = static_cast<S>(value.template get<double>());
  } else if constexpr (std::is_same_v<S, std::string>) {
    if (!value.is_string()) throw wrong();
    parsed = value.template get<std::string>();
  } else {
    static_assert(dependent_false_v<S>, "loom: unsupported field type");
  }
  field = std::move(parsed);
}

template <class S>
nlohmann::ordered_json scalar_to_json(const S& value) {
  if constexpr (is_integer_field_v<S> && std::is_unsigned_v<S>) return static_cast<std::uint64_t>(value);
  else if constexpr (is_integer_field_v<S>) return static_cast<std::int64_t>(value);
  else if constexpr (std::is_floating_point_v<S>) return static_cast<double>(value);
  else return value;  // bool, std::string
}

/// Writes json.dump(2) and a newline to `path` atomically (path.tmp, then rename); creates
/// parent folders.
LOOM_INLINE void save_json_value(const nlohmann::ordered_json& json, const std::filesystem::path& path);

/// Re-says `e` with the file in front: "loom: <path>: unknown JSON key ...".
[[noreturn]] LOOM_INLINE void rethrow_with_path(const std::filesystem::path& path, const Error& e);

}  // namespace detail

// ---- command line -----------------------------------------------------------------------

/// Parses flags (argv without the program name) over `initial`; throws loom::Error.
template <class... Ts>
ParseResult<Ts...> try_parse_args(std::span<const std::string> args, std::tuple<Ts...> initial) {
  detail::check_parseable<Ts...>();
  ParseResult<Ts...> result{std::move(initial), false};
  if (detail::asks_for_help(args)) {
    result.help = true;
    return result;
  }

  const std::vector<detail::FieldInfo> table = detail::field_table<Ts...>();
  detail::parse_flags(args, table,
                      {&result.values, [](void* values, const detail::FieldInfo& info, std::string_view text) {
                         detail::assign_field(*static_cast<std::tuple<Ts...>*>(values), info, text);
                       }});
  return result;
}

/// Parses flags (argv without the program name) into default-constructed Ts; throws loom::Error.
template <class... Ts>
ParseResult<Ts...> try_parse_args(std::span<const std::string> args) {
  return try_parse_args(args, std::tuple<Ts...>{});
}

/// Usage line plus one line per field: `  --name <kind>  (default: value)`.
template <class... Ts>
std::string help_text(std::string_view program, const std::tuple<Ts...>& defaults) {
  detail::check_parseable<Ts...>();
  std::string out = detail::help_usage(program);
  auto list = [&]<class T>(const T& defaults) {
    constexpr auto names = boost::pfr::names_as_array<T>();
    boost::pfr::for_each_field(defaults, [&]<class F>(const F& field, std::size_t index) {
      detail::append_help_line(out, names[index], detail::kind_short<typename detail::field_traits<F>::scalar>(),
                               detail::field_to_text(field));
    });
  };
  std::apply([&](const auto&... d) { (list(d), ...); }, defaults);
  return out;
}

/// help_text for default-constructed Ts.
template <class... Ts>
std::string help_text(std::string_view program) {
  return help_text(program, std::tuple<Ts...>{});
}

/// CLI entry over `defaults`: returns T (one type) or std::tuple<Ts...>; --help prints help
/// (showing these defaults) and exits 0, an error prints it and exits 2.
template <class... Ts>
  requires(sizeof...(Ts) > 0)
auto parse_args(int argc, const char* const* argv, Ts... defaults) {
  detail::check_parseable<Ts...>();
  const std::string program = detail::program_name(argc, argv);
  const std::vector<std::string> args = detail::collect_args(argc, argv);

  std::tuple<Ts...> initial{std::move(defaults)...};
  ParseResult<Ts...> result;
  try {
    result = try_parse_args(args, initial);
  } catch (const Error& e) {
    detail::exit_with_error(e);
  }
  if (result.help) detail::exit_with_help(help_text(program, initial));
  if constexpr (sizeof...(Ts) == 1) {
    return std::get<0>(std::move(result.values));
  } else {
    return std::move(result.values);
  }
}

/// CLI entry for default-constructed Ts: returns T (one type) or std::tuple<Ts...>.
template <class... Ts>
  requires(sizeof...(Ts) > 0)
auto parse_args(int argc, const char* const* argv) {
  return parse_args(argc, argv, Ts{}...);
}

// ---- JSON ---------------------------------------------------------------------------------

/// Every field in declaration order; an empty optional becomes null.
template <class T>
nlohmann::ordered_json to_json(const T& value) {
  detail::check_reflectable<T>();
  constexpr auto names = boost::pfr::names_as_array<T>();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  boost::pfr::for_each_field(value, [&]<class F>(const F& field, std::size_t index) {
    const std::string key(names[index]);
    if constexpr (detail::field_traits<F>::is_optional) {
      out[key] = field ? detail::scalar_to_json(*field) : nlohmann::ordered_json(nullptr);
    } else {
      out[key] = detail::scalar_to_json(field);
    }
  });
  return out;
}

/// A default-constructed T with the keys present set; unknown key, wrong type or bad null throws loom::Error.
template <class T, class Json = nlohmann::json>
T from_json(const Json& json) {
  detail::check_reflectable<T>();
  if (!json.is_object())
    throw Error("loom: expected a JSON object of settings, got " + detail::describe_json(json));
  constexpr auto names = boost::pfr::names_as_array<T>();
  T value{};
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string& key = it.key();
    std::size_t index = 0;
    while (index < names.size() && names[index] != key) ++index;
    if (index == names.size()) throw detail::unknown_key_error(key, names);
    boost::pfr::for_each_field(value, [&](auto& field, std::size_t i) {
      if (i == index) detail::set_from_json(field, it.value(), names[index]);
    });
  }
  return value;
}

/// Writes to_json(value) with indent 2 to `path` atomically (path.tmp, then rename); creates parent folders.
template <class T>
void save_json(const T& value, const std::filesystem::path& path) {
  detail::save_json_value(to_json(value), path);
}

/// Reads a JSON object written by save_json (or by hand) into T; errors name the path.
template <class T>
T load_json(const std::filesystem::path& path) {
  const nlohmann::json json = loom::json::read_file(path);
  try {
    return from_json<T>(json);
  } catch (const Error& e) {
    detail::rethrow_with_path(path, e);
  }
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/reflect.ipp>
#endif
