#pragma once
// Definitions of config/json_io.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/json_io.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace loom::json {

LOOM_INLINE std::string describe(const nlohmann::json& value) { return describe<nlohmann::json>(value); }

LOOM_INLINE std::string describe(const nlohmann::ordered_json& value) {
  return describe<nlohmann::ordered_json>(value);
}

LOOM_INLINE void write_file(const nlohmann::ordered_json& json, const std::filesystem::path& path) {
  loom::detail::write_text_atomically(path, json.dump(2) + "\n");
}

}  // namespace loom::json

namespace loom::detail {

LOOM_INLINE void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent) {
  write_text_atomically(path, j.dump(indent) + "\n");
}

LOOM_INLINE void write_text_atomically(const std::filesystem::path& path, std::string_view text) {
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
  if (const auto why = foreign_flag_reason(key))
    return Error("loom: JSON key '" + key + "' is a transformers.TrainingArguments field that loom does not take: " +
                 std::string(*why));
  const std::string suggestion = nearest_field(key, table);
  return Error("loom: unknown JSON key '" + key + "'" +
               (suggestion.empty() ? std::string() : "; did you mean '" + suggestion + "'?"));
}

LOOM_INLINE void rethrow_with_path(const std::filesystem::path& path, const Error& e) {
  // Re-say the message with the file in front: "loom: <path>: unknown JSON key ...".
  constexpr std::string_view prefix = "loom: ";
  throw Error("loom: " + path.string() + ": " + std::string(e.what()).substr(prefix.size()));
}

}  // namespace loom::detail
