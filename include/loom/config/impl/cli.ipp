#pragma once
// Definitions of config/cli.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/cli.hpp>
#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

// ---- the command line ---------------------------------------------------------------------

LOOM_INLINE std::string unknown_flag_message(std::string_view given, const std::vector<FieldInfo>& table) {
  if (const auto why = foreign_flag_reason(given))
    return "loom: --" + std::string(given) + " is a transformers.TrainingArguments flag that loom does not take: " +
           std::string(*why);
  const std::string suggestion = nearest_field(given, table);
  std::string message = "loom: unknown argument --" + std::string(given);
  if (suggestion.empty()) return message + "; see --help";
  return message + "; did you mean --" + suggestion + "?";
}

LOOM_INLINE bool asks_for_help(std::span<const std::string> args) {
  for (const std::string& arg : args)
    if (arg == "--help" || arg == "-h") return true;
  return false;
}

LOOM_INLINE bool is_json_file_argument(std::string_view arg) {
  return arg.size() > 5 && arg.ends_with(".json") && !arg.starts_with("-");
}

LOOM_INLINE void parse_flags(std::span<const std::string> args, const std::vector<FieldInfo>& table,
                             FieldAssigner assigner) {
  std::vector<bool> seen(table.size(), false);
  auto is_flag = [](std::string_view token) { return token.starts_with("--"); };

  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view token = args[i];
    if (is_json_file_argument(token))
      throw Error("loom: unexpected argument '" + std::string(token) +
                  "'; a JSON settings file must be the first argument, before the flags");
    if (!is_flag(token) || token.size() == 2)
      throw Error("loom: unexpected argument '" + std::string(token) + "'; flags look like --name value");

    std::string_view given = token.substr(2);
    std::optional<std::string_view> inline_value;
    if (const auto eq = given.find('='); eq != std::string_view::npos) {
      inline_value = given.substr(eq + 1);
      given = given.substr(0, eq);
    }
    std::string name(given);
    for (char& c : name)
      if (c == '-') c = '_';  // HfArgumentParser also accepts --learning-rate

    const FieldInfo* found = find_field(table, name);
    if (found == nullptr) throw Error(unknown_flag_message(name, table));
    const FieldInfo& info = *found;
    const auto index = static_cast<std::size_t>(found - table.data());
    if (seen[index]) throw Error("loom: --" + std::string(info.name) + " given twice");
    seen[index] = true;

    std::string_view value;
    if (inline_value) {
      value = *inline_value;
    } else if (info.is_bool) {
      // A bare bool flag means true; a following non-flag token is its value.
      value = (i + 1 < args.size() && !is_flag(args[i + 1])) ? std::string_view(args[++i])
                                                              : std::string_view("true");
    } else {
      if (i + 1 >= args.size() || is_flag(args[i + 1]))
        throw Error("loom: --" + std::string(info.name) + " needs a value (" + info.kind + ")");
      value = args[++i];
    }
    assigner.assign(assigner.context, info, value);
  }
}

LOOM_INLINE std::string help_usage(std::string_view program) {
  std::string out = "usage: " + std::string(program) + " [--help] [settings.json] [--name value ...]\n";
  out += "\n"
         "Flags also take the form --name=value. A bool flag given bare means true\n"
         "(--fp16 is --fp16 true); an optional setting is reset with none. A first\n"
         "argument ending in .json is a JSON object of settings (any flag below as a key),\n"
         "read before the flags, which override it.\n"
         "\n"
         "options:\n"
         "  --help, -h  show this message and exit\n";
  return out;
}

LOOM_INLINE std::string program_name(int argc, const char* const* argv) {
  std::string program = "program";
  if (argc > 0 && argv != nullptr && argv[0] != nullptr) {
    program = std::filesystem::path(argv[0]).filename().string();
    if (program.empty()) program = argv[0];
  }
  return program;
}

LOOM_INLINE std::vector<std::string> collect_args(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return args;
}

LOOM_INLINE void exit_with_error(const Error& e) {
  std::cerr << e.what() << std::endl;
  std::exit(2);
}

LOOM_INLINE void exit_with_help(const std::string& help) {
  std::cout << help << std::flush;
  std::exit(0);
}

}  // namespace loom::detail
