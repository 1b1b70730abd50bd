#pragma once
// Definitions of config/reflect.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/nearest.hpp>
#include <loom/config/reflect.hpp>

#include <nlohmann/json.hpp>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace loom::detail {

// ---- text -> value ----------------------------------------------------------------------

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

// ---- the command line ---------------------------------------------------------------------

// The nearest field name of `table` to `given`, or "".
LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table) {
  std::vector<std::string_view> names;
  names.reserve(table.size());
  for (const FieldInfo& info : table) names.push_back(info.name);
  return nearest_name(given, names);
}

LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name) {
  for (const FieldInfo& info : table)
    if (info.name == name) return &info;
  return nullptr;
}

LOOM_INLINE std::string unknown_flag_message(std::string_view given, const std::vector<FieldInfo>& table) {
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

// ---- JSON ---------------------------------------------------------------------------------

LOOM_INLINE std::string describe_json(const nlohmann::json& value) { return describe_json<nlohmann::json>(value); }

LOOM_INLINE std::string describe_json(const nlohmann::ordered_json& value) {
  return describe_json<nlohmann::ordered_json>(value);
}

LOOM_INLINE Error json_type_error(std::string_view key, std::string_view kind, std::string_view got,
                                  std::string_view note) {
  return Error("loom: JSON key '" + std::string(key) + "' expects " + std::string(kind) + ", got " +
               std::string(got) + std::string(note));
}

LOOM_INLINE Error json_null_error(std::string_view key, std::string_view kind) {
  return Error("loom: JSON key '" + std::string(key) + "' is null, but the field is not optional (expects " +
               std::string(kind) + ")");
}

LOOM_INLINE Error unknown_key_error(const std::string& key, const std::vector<FieldInfo>& table) {
  const std::string suggestion = nearest_field(key, table);
  return Error("loom: unknown JSON key '" + key + "'" +
               (suggestion.empty() ? std::string() : "; did you mean '" + suggestion + "'?"));
}

LOOM_INLINE void save_json_value(const nlohmann::ordered_json& json, const std::filesystem::path& path) {
  const std::string text = json.dump(2) + "\n";
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  {
    std::ofstream file(tmp, std::ios::binary | std::ios::trunc);
    if (!file) throw Error("loom: cannot write " + tmp.string());
    file << text;
    file.flush();
    if (!file) {
      file.close();
      std::filesystem::remove(tmp, ec);
      throw Error("loom: cannot write " + tmp.string());
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw Error("loom: cannot rename " + tmp.string() + " to " + path.string() + ": " + ec.message());
  }
}

LOOM_INLINE void rethrow_with_path(const std::filesystem::path& path, const Error& e) {
  // Re-say the message with the file in front: "loom: <path>: unknown JSON key ...".
  constexpr std::string_view prefix = "loom: ";
  throw Error("loom: " + path.string() + ": " + std::string(e.what()).substr(prefix.size()));
}

}  // namespace loom::detail
