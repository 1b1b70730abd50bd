#pragma once
// Strict JSON reading for loom's own files (checkpoint state, trainer_state.json, argument
// files, safetensors headers) and JSON arguments. nlohmann's parser checks the syntax; this
// adds what it lets through and loom refuses: a key given twice in one object (nlohmann keeps
// the last one silently). `Fields` reads one object's fields by type and range, and every
// error names the file (or flag) and the field:
//
//   const auto j = loom::json::read_file(dir / "loop_state.json");
//   loom::json::Fields f(j, (dir / "loop_state.json").string());
//   const int64_t last = f.integer("globalstep_last_logged", /*min=*/0);
//   // loom: RUN/checkpoint-3/loop_state.json: field 'globalstep_last_logged' must be an integer >= 0, got -5
//
// Writing is loom::json::write_file (config/json_io.hpp): indent 2, atomically.

#include <loom/config/inline.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace loom::json {

/// Parses `text` (from `where`, a file or a flag): a syntax error is "loom: <where> is not
/// valid JSON: ...", a key given twice "loom: <where>: key 'k' appears twice in <object>".
LOOM_INLINE nlohmann::json parse(std::string_view text, std::string_view where);
/// parse(), keeping the keys in the order of the text.
LOOM_INLINE nlohmann::ordered_json parse_ordered(std::string_view text, std::string_view where);

/// Reads the file at `path` and parses it as parse() does; a missing or unreadable file is
/// "loom: cannot read <path> (...)".
LOOM_INLINE nlohmann::json read_file(const std::filesystem::path& path);

/// Typed, range-checked access to the fields of one JSON object. Optional fields are absent
/// or null; required ones are neither. Unknown fields are left alone (files written by HF
/// carry more).
class Fields {
 public:
  /// `j` must be an object ("loom: <where> is not a JSON object"). An empty `where` leaves
  /// the file to the caller, which adds it in front ("loom: field 'x' ..." ->
  /// "loom: <file>: field 'x' ...": Checkpointer does this for each state file).
  LOOM_INLINE Fields(const nlohmann::json& j, std::string where);

  [[nodiscard]] bool has(std::string_view key) const;  ///< present and not null
  /// An integer in [min, max].
  LOOM_INLINE int64_t integer(std::string_view key, int64_t min = std::numeric_limits<int64_t>::min(),
                              int64_t max = std::numeric_limits<int64_t>::max()) const;
  LOOM_INLINE std::optional<int64_t> optional_integer(std::string_view key,
                                                      int64_t min = std::numeric_limits<int64_t>::min()) const;
  /// A number (integer or not) >= min. (JSON has no nan or inf: nlohmann writes them as
  /// null, so a field that may hold one is read with optional_number.)
  LOOM_INLINE double number(std::string_view key, double min = -std::numeric_limits<double>::infinity()) const;
  LOOM_INLINE std::optional<double> optional_number(std::string_view key,
                                                    double min = -std::numeric_limits<double>::infinity()) const;
  LOOM_INLINE bool boolean(std::string_view key) const;
  LOOM_INLINE std::string string(std::string_view key) const;
  LOOM_INLINE std::optional<std::string> optional_string(std::string_view key) const;
  /// The object (or array) at `key`.
  LOOM_INLINE const nlohmann::json& object(std::string_view key) const;
  LOOM_INLINE const nlohmann::json& array(std::string_view key) const;

  /// "loom: <where>: field '<key>' <problem>" (throws).
  [[noreturn]] LOOM_INLINE void fail(std::string_view key, std::string_view problem) const;
  [[nodiscard]] const std::string& where() const { return where_; }

 private:
  LOOM_INLINE const nlohmann::json& required(std::string_view key) const;
  const nlohmann::json* j_;
  std::string where_;
};

inline bool Fields::has(std::string_view key) const {
  const auto it = j_->find(std::string(key));
  return it != j_->end() && !it->is_null();
}

}  // namespace loom::json

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/json.ipp>
#endif
