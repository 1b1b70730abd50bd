#pragma once
// Definitions of config/json_io.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/json_io.hpp>

#include <algorithm>

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

LOOM_INLINE Error unknown_key_error(const std::string& key, const std::vector<FieldInfo>& table,
                                    std::string_view given) {
  if (const ForeignSetting* foreign = foreign_setting(key)) {
    std::string message = "loom: JSON key '" + key + "' is a transformers.TrainingArguments field that loom does not take: " +
                          std::string(foreign->why);
    if (!given.empty()) {
      message += " (given " + std::string(given) + "; read only as ";
      for (std::size_t i = 0; i < foreign->accepted.size(); ++i)
        message += (i == 0 ? "" : i + 1 == foreign->accepted.size() ? " or " : ", ") + std::string(foreign->accepted[i]);
      message += foreign->accepted.size() == 1 ? ", HF's default)" : ")";
    }
    return Error(message);
  }
  const std::string suggestion = nearest_field(key, table);
  return Error("loom: unknown JSON key '" + key + "'" +
               (suggestion.empty() ? std::string() : "; did you mean '" + suggestion + "'?"));
}

LOOM_INLINE bool foreign_value_accepted(std::string_view key, const nlohmann::json& value) {
  const ForeignSetting* foreign = foreign_setting(key);
  if (foreign == nullptr) return false;
  for (const std::string_view text : foreign->accepted)
    if (nlohmann::json::parse(text) == value) return true;
  return false;
}

LOOM_INLINE std::optional<nlohmann::json> hf_json_form(std::string_view key, const nlohmann::json& value) {
  // transformers' list settings: loom reads comma-separated words (fsdp: space-separated).
  struct ListForm {
    std::string_view key, separator;
    nlohmann::json empty;  // what an empty list means in loom's form
  };
  static const ListForm lists[] = {{"report_to", ",", "none"},
                                   {"include_for_metrics", ",", ""},
                                   {"label_names", ",", nullptr},
                                   {"fsdp", " ", nullptr},
                                   {"fsdp_transformer_layer_cls_to_wrap", ",", nullptr}};
  for (const ListForm& list : lists) {
    if (key != list.key || !value.is_array()) continue;
    if (value.empty()) return list.empty;
    std::string joined;
    for (const auto& item : value) {
      if (!item.is_string()) return std::nullopt;  // not HF's form: the field's own error says so
      joined += (joined.empty() ? "" : std::string(list.separator)) + item.get<std::string>();
    }
    return joined;
  }
  // transformers' dict settings: loom reads JSON text (HF's own string form, JSON or a file).
  static constexpr std::string_view dicts[] = {"lr_scheduler_kwargs", "gradient_checkpointing_kwargs", "fsdp_config",
                                               "deepspeed"};
  if (std::ranges::find(dicts, key) != std::end(dicts) && value.is_object()) return value.dump();
  if (key == "lr_scheduler_kwargs" && value.is_null()) return "{}";  // HF's default, None: no arguments
  if (key == "fsdp" && value.is_boolean()) return value.get<bool>() ? "true" : "false";  // HF 5: fsdp=True
  return std::nullopt;
}

LOOM_INLINE void rethrow_with_path(const std::filesystem::path& path, const Error& e) {
  // Re-say the message with the file in front: "loom: <path>: unknown JSON key ...".
  constexpr std::string_view prefix = "loom: ";
  throw Error("loom: " + path.string() + ": " + std::string(e.what()).substr(prefix.size()));
}

}  // namespace loom::detail
