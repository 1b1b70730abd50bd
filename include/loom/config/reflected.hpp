#pragma once
// loom::detail::Reflected<T>: everything the command line, JSON and --help do with one
// reflected struct T (config/fields.hpp), as functions of T alone. parse_args, help_text and
// the JSON readers (config/cli.hpp, config/json_io.hpp) work on a pack of structs by calling
// these for each; the pack's own work (which struct a flag belongs to, a flag defined by two
// structs) stays with them.
//
// Why a class of its own: its members are the per-struct instantiations that reflecting a
// struct of 130 settings costs (the compile-time checks, a setter per field, the --help
// lines), and a struct that every program parses, TrainingArguments, has them compiled once
// in loom::compiled (config/impl/reflected.ipp) and declared `extern template` for the
// programs (config/training_arguments.hpp), instead of in each program's unit. A user's
// structs instantiate them where they are parsed, as before, with the same compile-time checks.
//
// This header holds the declarations only, and no Boost.PFR, so that training_arguments.hpp
// can name the instantiation; the definitions are in config/reflected_ops.hpp.

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

/// One setting of the structs parsed together, as the command line and JSON find it by name.
struct FieldInfo {
  std::string_view name;    // canonical field name (static storage, from Boost.PFR)
  std::size_t type_index;   // which struct of the pack
  std::size_t field_index;  // which setting of that struct (setting index)
  bool is_bool;             // bool or optional<bool>: may be given bare
  std::string kind;         // "an integer", "a number or none", ...
};

template <class T>
struct Reflected {
  /// The compile-time checks of T alone: a reflectable aggregate of supported fields, no
  /// setting named `help`, a field_help table that names T's settings once each.
  static void check();
  /// Appends an entry per setting of T, as struct number `type_index` of the pack.
  static void append_fields(std::vector<FieldInfo>& table, std::size_t type_index);
  /// Sets the setting `info` names from command-line text (its name in messages).
  static void set_text(T& value, const FieldInfo& info, std::string_view text);
  /// Sets the setting `info` names from a JSON value (its name in messages).
  static void set_json(T& value, const FieldInfo& info, const nlohmann::json& json);
  /// Records `name` in T's GivenFlags fields; nothing for a T without one.
  static void record_given(T& value, std::string_view name);
  /// Records `key` as an accepted foreign setting in T's first GivenFlags field; false when T
  /// has none.
  static bool record_ignored(T& value, std::string_view key);
  /// Appends T's --help section: its heading, then a line (and description) per setting,
  /// with the values of `defaults`, under a sub-heading per group.
  static void append_help(std::string& out, const T& defaults);
  /// Every setting in declaration order (an empty optional: null; GivenFlags left out).
  static nlohmann::ordered_json to_json(const T& value);
};

}  // namespace loom::detail
