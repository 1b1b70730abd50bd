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
// key) and the parsers fill it. A field that is itself a plain struct is a group, and so are
// the bases of a struct derived from loom::Grouped<A, B, ...> (config/field_help.hpp):
// their settings join the flat list, so flags and JSON keys keep their own names. Any other
// field type, a const field, or a non-aggregate is a compile error whose message starts with
// "loom:".

#include <loom/config/field_help.hpp>
#include <loom/config/given_flags.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/meta.hpp>
#include <loom/config/reflected.hpp>

#include <boost/pfr.hpp>

#include <algorithm>
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

// ---- groups: the tree of a struct's settings ------------------------------------------------
//
// A reflected struct is a tree. Its children are its fields (Boost.PFR), or, for a struct that
// declares `using loom_groups = loom::Groups<A, B, ...>` (as deriving from loom::Grouped<A, B,
// ...> does, config/field_help.hpp), its base classes A, B, ... (PFR cannot
// see into a class with bases, and bases keep `args.learning_rate` a plain member access). A
// child is a setting (a supported field), a GivenFlags field (skipped), or a group: a field of
// aggregate class type, reflected in turn. Settings are numbered in declaration order through
// the whole tree, so a grouped struct reads and writes as one flat list of names: flags, JSON
// keys and --help lines do not show the groups (only --help's headings do). Each struct in the
// tree is held to Boost.PFR's limit of 100 fields; the tree has none.

/// True for a struct composed of base-class groups (`using loom_groups = loom::Groups<...>`).
template <class T>
concept has_base_groups = requires { typename T::loom_groups; };

/// True for a field that is a nested group of settings (an aggregate struct, not GivenFlags).
template <class F>
inline constexpr bool is_group_v =
    std::is_class_v<F> && std::is_aggregate_v<F> && !is_given_flags_v<F> && std::is_same_v<F, std::remove_cv_t<F>>;

template <class T>
struct node_of {  // a plain struct: its fields
  static constexpr std::size_t arity = boost::pfr::tuple_size_v<T>;
  template <std::size_t I>
  using child = boost::pfr::tuple_element_t<I, T>;
  template <std::size_t I, class V>
  static constexpr auto& get(V& value) {
    return boost::pfr::get<I>(value);
  }
  template <std::size_t I>
  static constexpr std::string_view name() {
    return boost::pfr::get_name<I, T>();
  }
};

template <class T, class List>
struct base_node_of;
template <class T, class... G>
struct base_node_of<T, Groups<G...>> {  // a struct of base-class groups: its bases
  static constexpr std::size_t arity = sizeof...(G);
  template <std::size_t I>
  using child = std::tuple_element_t<I, std::tuple<G...>>;
  template <std::size_t I, class V>
  static constexpr auto& get(V& value) {
    using C = child<I>;
    if constexpr (std::is_const_v<V>) return static_cast<const C&>(value);
    else return static_cast<C&>(value);
  }
  template <std::size_t I>
  static constexpr std::string_view name() {
    return {};
  }
};

template <class T>
  requires has_base_groups<T>
struct node_of<T> : base_node_of<T, typename T::loom_groups> {};

/// T's child number I (a field's type, or a base-class group).
template <class T, std::size_t I>
using child_t = typename node_of<T>::template child<I>;

// The leaves of the tree: settings, and GivenFlags fields.
enum class Leaf { setting, given_flags };

template <class T, Leaf K>
consteval std::size_t leaf_count();

/// How many leaves of kind K a child of type C holds: a setting or a GivenFlags field is one of
/// its kind, a group holds its own.
template <class C, Leaf K>
consteval std::size_t leaves_in() {
  if constexpr (is_group_v<C>) return leaf_count<C, K>();
  else if constexpr (is_given_flags_v<C>) return K == Leaf::given_flags ? 1 : 0;
  else return K == Leaf::setting ? 1 : 0;
}

/// The setting index each child of T starts at (one more entry: the total).
template <class T>
consteval std::array<std::size_t, node_of<T>::arity + 1> child_offsets() {
  std::array<std::size_t, node_of<T>::arity + 1> out{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((out[I + 1] = out[I] + leaves_in<child_t<T, I>, Leaf::setting>()), ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
  return out;
}

/// How many leaves of kind K T holds, through its groups.
template <class T, Leaf K>
consteval std::size_t leaf_count() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (leaves_in<child_t<T, I>, K>() + ... + std::size_t{0});
  }(std::make_index_sequence<node_of<T>::arity>{});
}

/// How many settings T holds, through its groups.
template <class T>
consteval std::size_t setting_count() {
  return leaf_count<T, Leaf::setting>();
}

/// How many GivenFlags fields T holds, through its groups.
template <class T>
consteval std::size_t given_flags_count() {
  return leaf_count<T, Leaf::given_flags>();
}

/// True when T holds a GivenFlags field (directly or in a group).
template <class T>
inline constexpr bool has_given_flags_v = given_flags_count<T>() > 0;

/// T::help_heading, else T's name without namespaces (defined with the --help helpers below).
/// A group's heading is its help_heading, else its field's name (a member group) or this.
template <class T>
constexpr std::string_view help_heading();

/// The names of T's settings, by setting index.
template <class T>
consteval std::array<std::string_view, setting_count<T>()> setting_names() {
  std::array<std::string_view, setting_count<T>()> out{};
  constexpr auto at = child_offsets<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ([&] {
      using C = child_t<T, I>;
      if constexpr (is_group_v<C>) {
        constexpr auto inner = setting_names<C>();
        for (std::size_t k = 0; k < inner.size(); ++k) out[at[I] + k] = inner[k];
      } else if constexpr (!is_given_flags_v<C>) {
        out[at[I]] = node_of<T>::template name<I>();
      }
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
  return out;
}

/// The innermost group heading of each of T's settings ("" for T's own fields), by setting index.
template <class T>
consteval std::array<std::string_view, setting_count<T>()> setting_groups() {
  std::array<std::string_view, setting_count<T>()> out{};
  constexpr auto at = child_offsets<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ([&] {
      using C = child_t<T, I>;
      if constexpr (is_group_v<C>) {
        constexpr auto inner = setting_groups<C>();
        constexpr std::string_view own = [] {
          if constexpr (requires { C::help_heading; } || has_base_groups<T>) return help_heading<C>();
          else return node_of<T>::template name<I>();
        }();
        for (std::size_t k = 0; k < inner.size(); ++k) out[at[I] + k] = inner[k].empty() ? own : inner[k];
      }
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
  return out;
}

// The type of T's setting number S (setting_t below).
template <class T, std::size_t S>
consteval auto setting_type_of() {
  constexpr auto at = child_offsets<T>();
  constexpr std::size_t I = [&] {
    std::size_t i = 0;
    while (!(at[i] <= S && S < at[i + 1])) ++i;
    return i;
  }();
  using C = child_t<T, I>;
  if constexpr (is_group_v<C>) return setting_type_of<C, S - at[I]>();
  else return std::type_identity<C>{};
}

/// The type of T's setting number S.
template <class T, std::size_t S>
using setting_t = typename decltype(setting_type_of<T, S>())::type;

template <std::size_t Offset, class V, class F>
constexpr void for_each_setting_from(V& value, F& f) {
  using T = std::remove_cv_t<V>;
  constexpr auto at = child_offsets<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ([&] {
      using C = child_t<T, I>;
      auto& child = node_of<T>::template get<I>(value);
      if constexpr (is_group_v<C>) for_each_setting_from<Offset + at[I]>(child, f);
      else if constexpr (!is_given_flags_v<C>) f(child, std::integral_constant<std::size_t, Offset + at[I]>{});
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
}

/// Calls f(field, std::integral_constant<std::size_t, S>{}) for each setting of `value` in
/// declaration order through its groups, S its setting index (GivenFlags fields skipped).
template <class T, class F>
constexpr void for_each_setting(T&& value, F&& f) {
  for_each_setting_from<0>(value, f);
}

/// Calls f(field) with the setting of `value` whose setting index is `index`.
template <class T, class F>
void visit_setting(T& value, std::size_t index, F&& f) {
  for_each_setting(value, [&](auto& field, std::size_t i) {
    if (i == index) f(field);
  });
}

/// Calls f(flags) for each GivenFlags field of `value`, directly or in a group.
template <class T, class F>
void for_each_given_flags(T& value, F&& f) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ([&] {
      using C = child_t<T, I>;
      if constexpr (is_given_flags_v<C>) f(node_of<T>::template get<I>(value));
      else if constexpr (is_group_v<C>) for_each_given_flags(node_of<T>::template get<I>(value), f);
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
}

// ---- compile-time checks of a struct ----------------------------------------------------

template <class T>
consteval bool all_fields_supported();

// A child of type C is a supported field, GivenFlags, or a group of such.
template <class C>
consteval bool child_supported() {
  if constexpr (is_group_v<C>) return all_fields_supported<C>();
  else return is_supported_field_v<C> || is_given_flags_v<C>;
}

template <class T>
consteval bool all_fields_supported() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (child_supported<child_t<T, I>>() && ... && true);
  }(std::make_index_sequence<node_of<T>::arity>{});
}

template <class T, class List>
struct groups_are_bases : std::false_type {};
template <class T, class... G>
struct groups_are_bases<T, Groups<G...>> {
  struct Only : G... {};  // the same bases, no member of T's own
  static constexpr bool value = (std::is_base_of_v<G, T> && ...) && sizeof(Only) == sizeof(T);
};

template <class T>
consteval bool groups_well_formed();

// A child of type C of a struct whose children are base classes (InBases) or fields.
template <class C, bool InBases>
consteval bool child_well_formed() {
  if constexpr (is_group_v<C>) return groups_well_formed<C>();
  else return !InBases;  // a base-class group list names structs only
}

template <class T>
consteval bool groups_well_formed() {
  if constexpr (has_base_groups<T>) {
    if (!groups_are_bases<T, typename T::loom_groups>::value) return false;
  }
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return (child_well_formed<child_t<T, I>, has_base_groups<T>>() && ... && true);
  }(std::make_index_sequence<node_of<T>::arity>{});
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
                "number, std::string, std::optional of one of those (and not const), or a struct of such "
                "fields (a group)");
  static_assert(groups_well_formed<T>(),
                "loom: a struct of base-class groups (loom::Grouped<A, B, ...>, or `using loom_groups = "
                "loom::Groups<A, B, ...>`) must list every base class, structs only, and may have no fields "
                "of its own beside them");
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

inline constexpr std::size_t no_index = static_cast<std::size_t>(-1);

// A struct may list its setting names, in declaration order, in a constant table found by ADL:
// `constexpr const std::array<std::string_view, N>& setting_name_table(loom::HelpFor<T>)`
// (TrainingArguments does). The check that no flag is defined by two structs parsed together
// then reads the table instead of reflecting T in every program that parses it; check_struct<T>
// (compiled once with Reflected<T>) asserts that the table is exactly T's settings.
void setting_name_table() = delete;  // setting_name_table(HelpFor<T>) is found by ADL only

template <class T>
concept has_setting_name_table = requires { setting_name_table(HelpFor<T>{}); };

/// T's setting names for the checks of a pack: its table where it has one, else reflected.
template <class T>
consteval auto pack_setting_names() {
  if constexpr (has_setting_name_table<T>) return setting_name_table(HelpFor<T>{});
  else return setting_names<T>();
}

template <class T, std::size_t Setting>
struct FieldNameOf {
  static constexpr std::string_view value = pack_setting_names<T>()[Setting];
};

// Instantiated only for a clash; the template arguments are what the message is about.
template <class Flag, class First, class Second>
struct flag_defined_by_two_structs {
  static_assert(dependent_false_v<First>,
                "loom: a flag is defined by two structs parsed together (the flag and the two structs are "
                "the template arguments of flag_defined_by_two_structs above); rename one of the fields");
};
template <class Flag, class T>
struct setting_defined_twice {
  static_assert(dependent_false_v<T>,
                "loom: two settings of one struct have the same name, a flag defined twice (the flag and "
                "the struct are the template arguments of setting_defined_twice above); rename one of "
                "the fields");
};

// Where a setting name first appears in two structs of the pack (first_field: a setting index).
struct NameClash {
  bool found = false;
  std::size_t first_type = 0, first_field = 0, second_type = 0;
};

// Compares each name with the names of the structs after its own only: a struct's own names are
// unique (check_struct), and TrainingArguments' ~230 names against each other were most of the
// check's compile time.
template <class... Ts>
consteval NameClash find_name_clash() {
  constexpr std::size_t total = (pack_setting_names<Ts>().size() + ... + 0);
  std::array<std::string_view, total> names{};
  std::array<std::size_t, total> type_of{}, field_of{};
  std::array<std::size_t, sizeof...(Ts)> type_end{};
  std::size_t k = 0, t = 0;
  (
      [&] {
        std::size_t f = 0;
        for (std::string_view name : pack_setting_names<Ts>()) {
          names[k] = name;
          type_of[k] = t;
          field_of[k++] = f++;
        }
        type_end[t++] = k;
      }(),
      ...);
  for (std::size_t i = 0; i < total; ++i)
    for (std::size_t j = type_end[type_of[i]]; j < total; ++j)
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

// The index of the first of T's settings whose name an earlier setting has; no_index if none.
template <class T>
consteval std::size_t repeated_setting() {
  constexpr auto names = pack_setting_names<T>();
  for (std::size_t i = 1; i < names.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (names[i] == names[j]) return i;
  return no_index;
}

// T's own settings: its setting_name_table, where it has one, the reflected names in order;
// then no name twice (two groups of one struct may declare the same field).
template <class T>
constexpr void check_setting_names() {
  if constexpr (has_setting_name_table<T>) {
    constexpr auto table = setting_name_table(HelpFor<T>{});
    constexpr auto names = setting_names<T>();
    static_assert(table.size() == names.size() && std::ranges::equal(table, names),
                  "loom: a struct's setting_name_table must list every setting, in declaration order");
  }
  constexpr std::size_t repeated = repeated_setting<T>();
  if constexpr (repeated != no_index)
    (void)sizeof(setting_defined_twice<spelled<FieldNameOf<T, repeated>>, T>);
}

// ---- descriptions and headings for --help (config/field_help.hpp) ---------------------------

void field_help() = delete;  // field_help(HelpFor<T>) is found by ADL only

template <class T>
concept has_member_field_help = requires { std::size(T::field_help); };
template <class T>
concept has_adl_field_help = requires { std::size(field_help(HelpFor<T>{})); };
template <class T>
concept names_help_heading = requires {
  { T::help_heading } -> std::convertible_to<std::string_view>;
};

// True when T's help_heading is its base-class group G's.
template <class T, class G>
consteval bool heading_from() {
  if constexpr (names_help_heading<G>)
    return static_cast<const void*>(&G::help_heading) == static_cast<const void*>(&T::help_heading);
  else
    return false;
}

// True when T's help_heading is one of its base-class groups' (inherited, not T's own).
template <class T, class... G>
consteval bool heading_inherited(Groups<G...>) {
  return (heading_from<T, G>() || ...);
}

template <class T>
consteval bool heading_is_own() {
  if constexpr (has_base_groups<T>) return !heading_inherited<T>(typename T::loom_groups{});
  else return true;
}

/// True when T declares a help_heading of its own (a group's, inherited, does not count).
template <class T>
concept has_help_heading = names_help_heading<T> && heading_is_own<T>();

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
  [&]<std::size_t... I>(std::index_sequence<I...>) {  // each group's own table too
    ([] {
      if constexpr (is_group_v<child_t<T, I>>) check_field_help<child_t<T, I>>();
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
}

/// The description of each setting of T, by setting index ("" where T gives none): a group's
/// own table, then T's entries over it.
template <class T>
consteval std::array<std::string_view, setting_count<T>()> field_descriptions() {
  constexpr auto names = setting_names<T>();
  std::array<std::string_view, names.size()> out{};
  constexpr auto at = child_offsets<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ([&] {
      if constexpr (is_group_v<child_t<T, I>>) {
        constexpr auto inner = field_descriptions<child_t<T, I>>();
        for (std::size_t k = 0; k < inner.size(); ++k) out[at[I] + k] = inner[k];
      }
    }(),
     ...);
  }(std::make_index_sequence<node_of<T>::arity>{});
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

/// The compile-time checks of T alone (Reflected<T>::check calls them: compiled once for a
/// struct whose Reflected is instantiated in loom::compiled).
template <class T>
constexpr void check_struct() {
  check_reflectable<T>();
  static_assert(!has_field_named_help<T>(), "loom: a field named `help` would clash with --help; rename it");
  check_setting_names<T>();
  check_field_help<T>();
}

/// Every check parse_args and help_text make of the structs Ts parsed together: each one's
/// own, then that no flag is defined by two of them.
template <class... Ts>
void check_parseable() {
  static_assert(sizeof...(Ts) > 0, "loom: parse_args needs at least one struct type");
  (Reflected<Ts>::check(), ...);
  if constexpr (sizeof...(Ts) > 1) check_no_flag_twice<Ts...>();
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

/// One entry per setting of the structs Ts parsed together, in order (config/reflected.hpp's
/// FieldInfo).
template <class... Ts>
std::vector<FieldInfo> field_table() {
  std::vector<FieldInfo> table;
  [&]<std::size_t... TI>(std::index_sequence<TI...>) {
    (Reflected<Ts>::append_fields(table, TI), ...);
  }(std::index_sequence_for<Ts...>{});
  return table;
}

/// Calls f(value) with the struct of `values` (a tuple of structs) whose pack index is `type_index`.
template <std::size_t TI = 0, class Tuple, class F>
void with_struct(Tuple& values, std::size_t type_index, F&& f) {
  if constexpr (TI < std::tuple_size_v<Tuple>) {
    if (type_index != TI) return with_struct<TI + 1>(values, type_index, std::forward<F>(f));
    f(std::get<TI>(values));
  }
}

/// The entry of `table` named `name`, or nullptr.
LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name);

/// The field name of `table` nearest to `given` (for "did you mean ...?"), or "".
LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table);
/// A transformers.TrainingArguments setting loom has no flag for (torch_compile, push_to_hub, ...).
struct ForeignSetting {
  std::string_view name;                   ///< HF's field name
  std::vector<std::string_view> accepted;  ///< JSON texts a settings file may give it (HF's default first): loom does that already
  std::string_view why;                    ///< why loom has no flag for it
};
/// Every such setting (config/impl/fields.ipp).
LOOM_INLINE const std::vector<ForeignSetting>& foreign_settings();
/// The ForeignSetting named `name`, or nullptr.
LOOM_INLINE const ForeignSetting* foreign_setting(std::string_view name);
/// Why loom does not take `name` when it is a transformers.TrainingArguments field loom has
/// no flag for (torch_compile, push_to_hub, ...); none otherwise.
LOOM_INLINE std::optional<std::string_view> foreign_flag_reason(std::string_view name);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/fields.ipp>
#endif
