#pragma once
// What loom's reflection (Boost.PFR) sees of a plain aggregate (TrainingArguments, a user's
// ModelArgs, ...): the field types it supports, the compile-time checks of a struct's fields
// and of its field_help table (config/field_help.hpp), the --help headings and descriptions,
// and the flat table of every field of the structs parsed together, which the command line
// (config/cli.hpp) and JSON (config/json_io.hpp) share.
//
// Supported field types: bool, integer types (not the character types char, wchar_t,
// char8_t, char16_t, char32_t; int8_t/uint8_t are fine), float/double/long double,
// std::string, and std::optional of any of those. A loom::GivenFlags field
// (config/given_flags.hpp) is no setting: it is skipped (no flag, no --help line, no JSON
// key) and the parsers fill it. Any other field type, a const field, or a non-aggregate is a
// compile error whose message starts with "loom:".

#include <loom/config/field_help.hpp>
#include <loom/config/given_flags.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/meta.hpp>

#include <boost/pfr.hpp>

#include <array>
#include <concepts>
#include <cstddef>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if !BOOST_PFR_CORE_NAME_ENABLED
#error "loom: config/fields.hpp needs Boost.PFR field names (C++20 with g++ >= 11 or clang >= 12)"
#endif

namespace loom::detail {

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

/// True for a GivenFlags field (of any constness): no setting, skipped by reflection.
template <class F>
inline constexpr bool is_given_flags_v = std::is_same_v<std::remove_cv_t<F>, GivenFlags>;

// ---- the settings of a struct: its fields less the GivenFlags ones ------------------------

/// How many fields of T are settings.
template <class T>
consteval std::size_t setting_count() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return ((is_given_flags_v<boost::pfr::tuple_element_t<I, T>> ? std::size_t{0} : std::size_t{1}) + ... +
            std::size_t{0});
  }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
}

/// True when T holds a GivenFlags field.
template <class T>
inline constexpr bool has_given_flags_v = setting_count<T>() != boost::pfr::tuple_size_v<T>;

/// Boost.PFR's field index of each setting of T, in declaration order.
template <class T>
consteval std::array<std::size_t, setting_count<T>()> setting_fields() {
  std::array<std::size_t, setting_count<T>()> out{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    std::size_t k = 0;
    ((is_given_flags_v<boost::pfr::tuple_element_t<I, T>> ? void() : void(out[k++] = I)), ...);
    (void)k;
  }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
  return out;
}

/// The names of T's settings, by setting index.
template <class T>
consteval std::array<std::string_view, setting_count<T>()> setting_names() {
  constexpr auto names = boost::pfr::names_as_array<T>();
  constexpr auto fields = setting_fields<T>();
  std::array<std::string_view, fields.size()> out{};
  for (std::size_t i = 0; i < fields.size(); ++i) out[i] = names[fields[i]];
  return out;
}

/// The type of T's setting number S.
template <class T, std::size_t S>
using setting_t = boost::pfr::tuple_element_t<setting_fields<T>()[S], T>;

// The setting index of T's field number `field` (a setting): the settings before it.
template <class T>
consteval std::size_t setting_index(std::size_t field) {
  std::size_t before = 0;
  for (std::size_t f : setting_fields<T>()) before += f < field ? 1 : 0;
  return before;
}

/// Calls f(field, std::integral_constant<std::size_t, S>{}) for each setting of `value` in
/// declaration order, S its setting index (boost::pfr::for_each_field less the GivenFlags fields).
template <class T, class F>
constexpr void for_each_setting(T&& value, F&& f) {
  using U = std::remove_cvref_t<T>;
  boost::pfr::for_each_field(value, [&]<class Field, std::size_t I>(Field&& field, std::integral_constant<std::size_t, I>) {
    if constexpr (!is_given_flags_v<std::remove_reference_t<Field>>)
      f(field, std::integral_constant<std::size_t, setting_index<U>(I)>{});
  });
}

// ---- compile-time checks of a struct ----------------------------------------------------

template <class T>
consteval bool all_fields_supported() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return ((is_supported_field_v<boost::pfr::tuple_element_t<I, T>> ||
             std::is_same_v<boost::pfr::tuple_element_t<I, T>, GivenFlags>) &&
            ... && true);
  }(std::make_index_sequence<boost::pfr::tuple_size_v<T>>{});
}

template <class T>
consteval bool has_field_named_help() {
  for (std::string_view name : setting_names<T>())
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

template <class T, std::size_t Setting>
struct FieldNameOf {
  static constexpr std::string_view value = setting_names<T>()[Setting];
};

// Instantiated only for a clash; the template arguments are what the message is about.
template <class Flag, class First, class Second>
struct flag_defined_by_two_structs {
  static_assert(dependent_false_v<First>,
                "loom: a flag is defined by two structs parsed together (the flag and the two structs are "
                "the template arguments of flag_defined_by_two_structs above); rename one of the fields");
};

// Where a setting name first appears in two structs of the pack (first_field: a setting index).
struct NameClash {
  bool found = false;
  std::size_t first_type = 0, first_field = 0, second_type = 0;
};

template <class... Ts>
consteval NameClash find_name_clash() {
  constexpr std::size_t total = (setting_count<Ts>() + ... + 0);
  std::array<std::string_view, total> names{};
  std::array<std::size_t, total> type_of{}, field_of{};
  std::size_t k = 0, t = 0;
  (
      [&] {
        std::size_t f = 0;
        for (std::string_view name : setting_names<Ts>()) {
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

/// True when no setting name appears in two of Ts.
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

// The first entry that names no setting of T, or names one an earlier entry named; no_index if none.
template <class T>
consteval std::size_t bad_field_help_entry(bool duplicates) {
  constexpr auto entries = field_help_entries<T>();
  constexpr auto names = setting_names<T>();
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

/// The description of each setting of T, by setting index ("" where T gives none).
template <class T>
consteval std::array<std::string_view, setting_count<T>()> field_descriptions() {
  constexpr auto names = setting_names<T>();
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

/// Every check parse_args and help_text make of the structs Ts parsed together.
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

// ---- the flat table of every setting of every struct ---------------------------------------

struct FieldInfo {
  std::string_view name;    // canonical field name (static storage, from Boost.PFR)
  std::size_t type_index;   // which struct of the pack
  std::size_t field_index;  // which setting of that struct (setting index)
  bool is_bool;             // bool or optional<bool>: may be given bare
  std::string kind;         // "an integer", "a number or none", ...
};

template <class T, std::size_t TI>
void append_fields(std::vector<FieldInfo>& table) {
  constexpr auto names = setting_names<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (table.push_back(FieldInfo{names[I], TI, I,
                               std::is_same_v<typename field_traits<setting_t<T, I>>::scalar, bool>,
                               field_kind_phrase<setting_t<T, I>>()}),
     ...);
  }(std::make_index_sequence<setting_count<T>()>{});
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
    for_each_setting(std::get<TI>(values), [&](auto& field, std::size_t index) {
      if (index == info.field_index) f(field);
    });
  }
}

/// Records `info`'s name in the GivenFlags fields of its struct in `values` (a tuple of
/// structs); nothing for a struct without one.
template <std::size_t TI = 0, class Tuple>
void record_given(Tuple& values, const FieldInfo& info) {
  if constexpr (TI < std::tuple_size_v<Tuple>) {
    using T = std::tuple_element_t<TI, Tuple>;
    if (info.type_index != TI) return record_given<TI + 1>(values, info);
    if constexpr (has_given_flags_v<T>) {
      boost::pfr::for_each_field(std::get<TI>(values), [&]<class F>(F& field) {
        if constexpr (is_given_flags_v<F>) field.insert(info.name);
      });
    }
  }
}

/// The entry of `table` named `name`, or nullptr.
LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name);

/// The field name of `table` nearest to `given` (for "did you mean ...?"), or "".
LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table);
/// Why loom does not take `name` when it is a transformers.TrainingArguments field loom has
/// no flag for (torch_compile, push_to_hub, ...); none otherwise.
LOOM_INLINE std::optional<std::string_view> foreign_flag_reason(std::string_view name);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/fields.ipp>
#endif
