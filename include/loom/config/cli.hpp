#pragma once
// The command line of a program, in the style of HfArgumentParser, over one or several
// reflected structs (config/fields.hpp), and its --help text.
//
//   auto args = loom::parse_args<loom::TrainingArguments>(argc, argv);
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
//   Each flag given, and each key of the JSON settings file, is recorded in its struct's
//   GivenFlags field when it has one (config/given_flags.hpp): args.given.contains("seed").

#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/text.hpp>

#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace loom {

/// What try_parse_args found: the parsed structs, or help == true when --help/-h was given.
template <class... Ts>
struct ParseResult {
  std::tuple<Ts...> values{};  ///< each struct default-constructed, then the given flags applied
  bool help = false;           ///< --help or -h was given; `values` then holds the defaults
};

namespace detail {

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

/// argv[0]'s file name ("program" when argv[0] is missing; argv[0] itself when it has no name).
LOOM_INLINE std::string program_name(int argc, const char* const* argv);

/// argv[1..argc) as strings.
LOOM_INLINE std::vector<std::string> collect_args(int argc, const char* const* argv);

/// Prints `e` to stderr and exits 2.
[[noreturn]] LOOM_INLINE void exit_with_error(const Error& e);

/// Prints `help` to stdout and exits 0.
[[noreturn]] LOOM_INLINE void exit_with_help(const std::string& help);

}  // namespace detail

/// Parses argv without the program name over `initial`: a first argument ending in .json is
/// read as a JSON object of settings, then the flags are applied; each is recorded in its
/// struct's GivenFlags field (added to what `initial` holds there). Throws loom::Error.
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
    detail::apply_json_file(result.values, args.front(), table, detail::RecordGiven::yes);
    args = args.subspan(1);
  }
  detail::parse_flags(args, table,
                      {&result.values, [](void* context, const detail::FieldInfo& info, std::string_view text) {
                         detail::with_struct(*static_cast<std::tuple<Ts...>*>(context), info.type_index,
                                             [&]<class T>(T& value) {
                                               detail::Reflected<T>::set_text(value, info, text);
                                               detail::Reflected<T>::record_given(value, info.name);
                                             });
                       }});
  return result;
}

/// try_parse_args into default-constructed Ts.
template <class... Ts>
ParseResult<Ts...> try_parse_args(std::span<const std::string> args) {
  return try_parse_args(args, std::tuple<Ts...>{});
}

/// The --help text: the usage, then each struct under its heading (config/field_help.hpp),
/// one flag a line: `  --name <kind>  (default: value)`, its description on the next line;
/// the settings of a group under a sub-heading ` <group>:`.
template <class... Ts>
std::string help_text(std::string_view program, const std::tuple<Ts...>& defaults) {
  detail::check_parseable<Ts...>();
  std::string out = detail::help_usage(program);
  std::apply([&]<class... T>(const T&... d) { (detail::Reflected<T>::append_help(out, d), ...); }, defaults);
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

}  // namespace loom

#include <loom/config/reflected_ops.hpp>

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/cli.ipp>
#endif
