#pragma once
// Descriptions of a reflected struct's fields, for --help (HfArgumentParser takes them from
// a dataclass field's metadata={"help": ...}; C++ comments are gone at run time, so a struct
// lists them in a table). A struct gives its table in one of two ways:
//
//   struct ModelArgs {                    // 1. a static member named field_help
//     std::string model_name = "gpt2";
//     int64_t hidden_size = 64;
//     static constexpr loom::FieldHelp field_help[] = {
//         {"model_name", "which model to build"},
//         {"hidden_size", "width of the hidden layers"}};
//     static constexpr std::string_view help_heading = "model";  // optional: the --help heading
//   };
//
//   namespace my {                         // 2. a constexpr function found by ADL, for a struct
//   inline constexpr loom::FieldHelp data_help[] = {{"data_dir", "where the IDX files are"}};
//   constexpr std::span<const loom::FieldHelp> field_help(loom::HelpFor<DataArgs>) { return data_help; }
//   }                                      //    you would rather keep as plain data
//
// The table may leave fields out (they get no description). An entry naming no field of the
// struct, or a field named twice, is a compile error starting "loom:". Without help_heading,
// the heading is the struct's name (without its namespace).

#include <string_view>

namespace loom {

/// One field's description: {field name, text shown under its flag in --help}.
struct FieldHelp {
  std::string_view name;  ///< the field's name, as declared
  std::string_view help;  ///< one line of text
};

/// The tag a `field_help(loom::HelpFor<T>)` function is found by (ADL: T's namespace).
template <class T>
struct HelpFor {};

/// The list of a struct's base-class groups (`using loom_groups = loom::Groups<A, B>;`), as
/// loom::Grouped declares it.
template <class... G>
struct Groups {};

/// The base of a struct whose settings live in groups, for a struct too large for one Boost.PFR
/// reflection (100 fields):
///   struct Args : loom::Grouped<OptimizerArgs, LoggingArgs> {};
/// Reflection reads the groups in this order as one flat list of settings (config/fields.hpp),
/// and code keeps writing `args.learning_rate`. A group is shown as a sub-heading in --help (its
/// help_heading, else its name) and may have its own field_help table.
template <class... G>
struct Grouped : G... {
  using loom_groups = Groups<G...>;  ///< the groups, in order
};

}  // namespace loom
