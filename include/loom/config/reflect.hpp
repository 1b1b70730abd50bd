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
//   auto [args, model_args] = loom::parse_args<loom::TrainingArguments, ModelArgs>(argc, argv);
//   --name value   --name=value   --name-with-dashes value (dashes read as underscores)
//   bool fields may be bare: `--fp16` means true; `--fp16 false` (or true/1/0/yes/no/on/off/
//   t/f/y/n, any case) sets the value; a bare bool followed by another --flag is true.
//   optional fields: a value sets them, `none` or `None` resets them to nullopt.
//   A first argument ending in .json is a JSON object of settings for all the structs (HF's
//   `python train.py args.json`), read before the flags, which override it. No other
//   positional arguments.
//   --help or -h anywhere asks for help: each struct's flags under its own heading, with the
//   descriptions of config/field_help.hpp.
//   A field name present in two of the structs parsed together is a compile error naming the
//   field and both structs, and so is a field named `help`.

#include <loom/config/error.hpp>
#include <loom/config/field_help.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/json.hpp>
#include <loom/config/nearest.hpp>

#include <boost/pfr.hpp>
#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
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

// A name spelled as a type, so that the compiler's message shows it: a template argument
// Name<'s', 'e', 'e', 'd'> reads the same in g++ and clang++.
template <char... C>
struct Name {};

template <class Source, std::size_t... I>
Name<Source::value[I]...> spell(std::index_sequence<I...>);
/// Name<...> for the string_view Source::value.
template <class Source>
using spelled = decltype(spell<Source>(std::make_index_sequence<Source::value.size()>{}));

template <class T, std::size_t Field>
struct FieldNameOf {
  static constexpr std::string_view value = boost::pfr::get_name<Field, T>();
};

// Instantiated only for a clash; the template arguments are what the message is about.
template <class Flag, class First, class Second>
struct flag_defined_by_two_structs {
  static_assert(dependent_false_v<First>,
                "loom: a flag is defined by two structs parsed together (the flag and the two structs are "
                "the template arguments of flag_defined_by_two_structs above); rename one of the fields");
};

// Where a field name first appears in two structs of the pack.
struct NameClash {
  bool found = false;
  std::size_t first_type = 0, first_field = 0, second_type = 0;
};

template <class... Ts>
consteval NameClash find_name_clash() {
  constexpr std::size_t total = (boost::pfr::tuple_size_v<Ts> + ... + 0);
  std::array<std::string_view, total> names{};
  std::array<std::size_t, total> type_of{}, field_of{};
  std::size_t k = 0, t = 0;
  (
      [&] {
        std::size_t f = 0;
        for (std::string_view name : boost::pfr::names_as_array<Ts>()) {
          names[k] = name;
          type_of[k] = t;
          field_of[k++] = f++;
        }
        ++t;
      }(),
      ...);
  for (std::size_t i = 0; i < total; ++i)
    for (std::size_t j = i + 1; j < total; ++j)
      if (names[i] == names[j]) return {true, type_of[i], field_of[i], type_of[j]};
  return {};
}

/// True when no field name appears in two of Ts.
template <class... Ts>
consteval bool field_names_unique() {
  return !find_name_clash<Ts...>().found;
}

template <class... Ts>
constexpr void check_no_flag_twice() {
  constexpr NameClash clash = find_name_clash<Ts...>();
  if constexpr (clash.found) {
    using First = std::tuple_element_t<clash.first_type, std::tuple<Ts...>>;
    using Second = std::tuple_element_t<clash.second_type, std::tuple<Ts...>>;
    (void)sizeof(flag_defined_by_two_structs<spelled<FieldNameOf<First, clash.first_field>>, First, Second>);
  }
}

// ---- descriptions and headings for --help (config/field_help.hpp) ---------------------------

void field_help() = delete;  // field_help(HelpFor<T>) is found by ADL only

template <class T>
concept has_member_field_help = requires { std::size(T::field_help); };
template <class T>
concept has_adl_field_help = requires { std::size(field_help(HelpFor<T>{})); };
template <class T>
concept has_help_heading = requires {
  { T::help_heading } -> std::convertible_to<std::string_view>;
};

// T's table as T gives it (a member array, or what field_help(HelpFor<T>) returns).
template <class T>
constexpr decltype(auto) field_help_source() {
  if constexpr (has_member_field_help<T>) return (T::field_help);
  else return field_help(HelpFor<T>{});
}

template <class T>
consteval std::size_t field_help_count() {
  if constexpr (has_member_field_help<T> || has_adl_field_help<T>) return std::size(field_help_source<T>());
  else return 0;
}

/// T's FieldHelp entries, copied out of whatever T gives (empty when it gives none).
template <class T>
consteval std::array<FieldHelp, field_help_count<T>()> field_help_entries() {
  std::array<FieldHelp, field_help_count<T>()> out{};
  if constexpr (field_help_count<T>() > 0) {
    std::size_t i = 0;
    for (const FieldHelp& entry : field_help_source<T>()) out[i++] = entry;
  }
  return out;
}

template <class Entry, class T>
struct field_help_names_no_field {
  static_assert(dependent_false_v<T>,
                "loom: a field_help entry names no field of its struct (the entry and the struct are the "
                "template arguments of field_help_names_no_field above)");
};
template <class Entry, class T>
struct field_help_names_a_field_twice {
  static_assert(dependent_false_v<T>,
                "loom: field_help describes a field twice (the field and the struct are the template "
                "arguments of field_help_names_a_field_twice above)");
};

inline constexpr std::size_t no_index = static_cast<std::size_t>(-1);

// The first entry that names no field of T, or names one an earlier entry named; no_index if none.
template <class T>
consteval std::size_t bad_field_help_entry(bool duplicates) {
  constexpr auto entries = field_help_entries<T>();
  constexpr auto names = boost::pfr::names_as_array<T>();
  for (std::size_t e = 0; e < entries.size(); ++e) {
    bool known = false;
    for (std::string_view name : names) known = known || name == entries[e].name;
    bool repeated = false;
    for (std::size_t earlier = 0; earlier < e; ++earlier) repeated = repeated || entries[earlier].name == entries[e].name;
    if (duplicates ? repeated : !known) return e;
  }
  return no_index;
}

template <class T, std::size_t Entry>
struct HelpEntryNameOf {
  static constexpr std::string_view value = field_help_entries<T>()[Entry].name;
};

template <class T>
constexpr void check_field_help() {
  constexpr std::size_t unknown = bad_field_help_entry<T>(false);
  if constexpr (unknown != no_index)
    (void)sizeof(field_help_names_no_field<spelled<HelpEntryNameOf<T, unknown>>, T>);
  constexpr std::size_t repeated = bad_field_help_entry<T>(true);
  if constexpr (repeated != no_index)
    (void)sizeof(field_help_names_a_field_twice<spelled<HelpEntryNameOf<T, repeated>>, T>);
}

/// The description of each field of T, by field index ("" where T gives none).
template <class T>
consteval std::array<std::string_view, boost::pfr::tuple_size_v<T>> field_descriptions() {
  constexpr auto names = boost::pfr::names_as_array<T>();
  std::array<std::string_view, names.size()> out{};
  for (const FieldHelp& entry : field_help_entries<T>())
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == entry.name) out[i] = entry.help;
  return out;
}

// The compiler's spelling of T, e.g. "reflect_test::ModelArgs" (g++ and clang++).
template <class T>
constexpr std::string_view qualified_type_name() {
  constexpr std::string_view signature = __PRETTY_FUNCTION__;
  // g++: "... qualified_type_name() [with T = ns::X; std::string_view = ...]"; clang: "... [T = ns::X]"
  constexpr std::size_t start = signature.find("T = ") + 4;
  std::size_t end = start;
  int depth = 0;
  while (end < signature.size()) {
    const char c = signature[end];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth == 0 && (c == ';' || c == ']')) break;
    ++end;
  }
  return signature.substr(start, end - start);
}

/// The --help heading of T: T::help_heading, else T's name without its namespaces.
template <class T>
constexpr std::string_view help_heading() {
  if constexpr (has_help_heading<T>) {
    return T::help_heading;
  } else {
    const std::string_view name = qualified_type_name<T>();
    std::size_t cut = 0;
    int depth = 0;
    for (std::size_t i = 0; i + 1 < name.size(); ++i) {
      if (name[i] == '<') ++depth;
      if (name[i] == '>') --depth;
      if (depth == 0 && name[i] == ':' && name[i + 1] == ':') cut = i + 2;
    }
    return name.substr(cut);
  }
}

template <class... Ts>
constexpr void check_parseable() {
  (check_reflectable<Ts>(), ...);
  static_assert(sizeof...(Ts) > 0, "loom: parse_args needs at least one struct type");
  check_no_flag_twice<Ts...>();
  static_assert(!(has_field_named_help<Ts>() || ...),
                "loom: a field named `help` would clash with --help; rename it");
  (check_field_help<Ts>(), ...);
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

/// Calls f(field) with the field of `values` (a tuple of structs) that `info` names.
template <std::size_t TI = 0, class Tuple, class F>
void visit_field(Tuple& values, const FieldInfo& info, F&& f) {
  if constexpr (TI < std::tuple_size_v<Tuple>) {
    if (info.type_index != TI) return visit_field<TI + 1>(values, info, std::forward<F>(f));
    boost::pfr::for_each_field(std::get<TI>(values), [&](auto& field, std::size_t index) {
      if (index == info.field_index) f(field);
    });
  }
}

/// The entry of `table` named `name`, or nullptr.
LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name);

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

/// True for a first argument that names a JSON settings file: ends in .json, no leading '-'.
LOOM_INLINE bool is_json_file_argument(std::string_view arg);

/// The flag loop of try_parse_args over `table`: splits --name=value, reads dashes as
/// underscores, finds the field, rejects unknown, repeated and value-less flags, and hands
/// each value to `assigner` in order.
LOOM_INLINE void parse_flags(std::span<const std::string> args, const std::vector<FieldInfo>& table,
                             FieldAssigner assigner);

// ---- --help text and the CLI entry's exits --------------------------------------------------

/// The usage line and the fixed part of --help, up to and including the --help line.
LOOM_INLINE std::string help_usage(std::string_view program);

/// Appends `  --<name> <<kind>>  (default: <default_text>)`, a newline, and the description
/// (when there is one) on a line of its own, indented.
LOOM_INLINE void append_help_line(std::string& out, std::string_view name, std::string_view kind,
                                  const std::string& default_text, std::string_view description);

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

/// "loom: unknown JSON key '<key>'", with the nearest field of `table` when one is close.
LOOM_INLINE Error unknown_key_error(const std::string& key, const std::vector<FieldInfo>& table);

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

/// Sets the fields that the keys of `json` (an object) name, in `values` (a tuple of structs
/// over `table`); an unknown key, a wrong type or a bad null throws loom::Error.
template <class Json, class Tuple>
void apply_json_object(Tuple& values, const Json& json, const std::vector<FieldInfo>& table) {
  if (!json.is_object()) throw Error("loom: expected a JSON object of settings, got " + describe_json(json));
  for (auto it = json.begin(); it != json.end(); ++it) {
    const FieldInfo* info = find_field(table, it.key());
    if (info == nullptr) throw unknown_key_error(it.key(), table);
    visit_field(values, *info, [&](auto& field) { set_from_json(field, it.value(), info->name); });
  }
}

/// apply_json_object over the file at `path` (read strictly: a key given twice is an error);
/// every message names the file.
template <class Tuple>
void apply_json_file(Tuple& values, const std::filesystem::path& path, const std::vector<FieldInfo>& table) {
  const nlohmann::json json = loom::json::read_file(path);
  try {
    apply_json_object(values, json, table);
  } catch (const Error& e) {
    rethrow_with_path(path, e);
  }
}

}  // namespace detail

// ---- command line -----------------------------------------------------------------------

/// Parses argv without the program name over `initial`: a first argument ending in .json is
/// read as a JSON object of settings, then the flags are applied. Throws loom::Error.
template <class... Ts>
ParseResult<Ts...> try_parse_args(std::span<const std::string> args, std::tuple<Ts...> initial) {
  detail::check_parseable<Ts...>();
  ParseResult<Ts...> result{std::move(initial), false};
  if (detail::asks_for_help(args)) {
    result.help = true;
    return result;
  }

  const std::vector<detail::FieldInfo> table = detail::field_table<Ts...>();
  if (!args.empty() && detail::is_json_file_argument(args.front())) {
    detail::apply_json_file(result.values, args.front(), table);
    args = args.subspan(1);
  }
  detail::parse_flags(args, table,
                      {&result.values, [](void* values, const detail::FieldInfo& info, std::string_view text) {
                         detail::visit_field(*static_cast<std::tuple<Ts...>*>(values), info,
                                             [&](auto& field) { detail::set_from_text(field, text, info.name); });
                       }});
  return result;
}

/// try_parse_args into default-constructed Ts.
template <class... Ts>
ParseResult<Ts...> try_parse_args(std::span<const std::string> args) {
  return try_parse_args(args, std::tuple<Ts...>{});
}

/// The --help text: the usage, then each struct under its heading (config/field_help.hpp),
/// one flag a line: `  --name <kind>  (default: value)`, its description on the next line.
template <class... Ts>
std::string help_text(std::string_view program, const std::tuple<Ts...>& defaults) {
  detail::check_parseable<Ts...>();
  std::string out = detail::help_usage(program);
  auto list = [&]<class T>(const T& defaults) {
    constexpr auto names = boost::pfr::names_as_array<T>();
    constexpr auto descriptions = detail::field_descriptions<T>();
    out += '\n';
    out += detail::help_heading<T>();
    out += ":\n";
    boost::pfr::for_each_field(defaults, [&]<class F>(const F& field, std::size_t index) {
      detail::append_help_line(out, names[index], detail::kind_short<typename detail::field_traits<F>::scalar>(),
                               detail::field_to_text(field), descriptions[index]);
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

/// The command-line entry, as HfArgumentParser(...).parse_args_into_dataclasses():
///   auto args = loom::parse_args<loom::TrainingArguments>(argc, argv);
///   auto [args, model] = loom::parse_args<loom::TrainingArguments, ModelArgs>(argc, argv);
///   auto [args, model] = loom::parse_args(argc, argv, my_defaults, ModelArgs{});
/// Returns T (one type) or std::tuple<Ts...>, starting from `defaults`; --help prints
/// help_text (showing these defaults) and exits 0; an error prints its `loom:` line and exits 2.
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

/// parse_args for default-constructed Ts: returns T (one type) or std::tuple<Ts...>.
template <class... Ts>
  requires(sizeof...(Ts) > 0)
auto parse_args(int argc, const char* const* argv) {
  return parse_args(argc, argv, Ts{}...);
}

/// Reads a JSON object of settings for all of Ts at once (HF's parse_json_file): each key
/// sets the field of that name in whichever struct has it. Returns T (one type) or
/// std::tuple<Ts...>; an unknown key (with the nearest name), a wrong type or a key given
/// twice throws loom::Error naming the file.
template <class... Ts>
  requires(sizeof...(Ts) > 0)
auto parse_json_file(const std::filesystem::path& path) {
  detail::check_parseable<Ts...>();
  std::tuple<Ts...> values{};
  detail::apply_json_file(values, path, detail::field_table<Ts...>());
  if constexpr (sizeof...(Ts) == 1) {
    return std::get<0>(std::move(values));
  } else {
    return values;
  }
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
  std::tuple<T> value{};
  detail::apply_json_object(value, json, detail::field_table<T>());
  return std::get<0>(std::move(value));
}

/// Writes to_json(value) with indent 2 to `path` atomically (path.tmp, then rename); creates parent folders.
template <class T>
void save_json(const T& value, const std::filesystem::path& path) {
  detail::save_json_value(to_json(value), path);
}

/// Reads a JSON object written by save_json (or by hand) into T; errors name the path.
template <class T>
T load_json(const std::filesystem::path& path) {
  detail::check_reflectable<T>();
  std::tuple<T> value{};
  detail::apply_json_file(value, path, detail::field_table<T>());
  return std::get<0>(std::move(value));
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/reflect.ipp>
#endif
