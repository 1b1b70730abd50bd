#pragma once
// Definitions of config/json.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>

#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace loom::json {

namespace detail {
inline constexpr int kMaxDepth = 1000;

template <class Json>
Json parse_strict(std::string_view text, std::string_view where) {
  // The parser reports each object's keys as it reads them; a set per open object finds a
  // key given twice (nlohmann itself would keep the last value).
  struct Open {
    std::string name;  // where the object sits, e.g. "stateful_callbacks.TrainerControl"
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Open> open;
  std::string duplicate, in_object;
  typename Json::parser_callback_t watch = [&](int depth, typename Json::parse_event_t event, Json& parsed) {
    using E = typename Json::parse_event_t;
    // Memory grows with the nesting (each open object's path is kept): a limit far above any
    // file loom reads (tokenizer.json, configs and states nest under 10 deep) and above Python
    // json's own (its recursion limit, about 1000).
    if (depth > kMaxDepth)
      throw Error("loom: " + std::string(where) + ": JSON nested more than " + std::to_string(kMaxDepth) +
                  " levels deep (arrays and objects); no file loom reads nests like this");
    if (event == E::object_start) {
      std::string name;
      if (!open.empty()) name = (open.back().name.empty() ? "" : open.back().name + ".") + open.back().last_key;
      open.push_back({std::move(name), {}, {}});
    } else if (event == E::object_end) {
      if (!open.empty()) open.pop_back();
    } else if (event == E::key && !open.empty()) {
      auto key = parsed.template get<std::string>();
      if (!open.back().keys.insert(key).second && duplicate.empty()) {
        duplicate = key;
        in_object = open.back().name.empty() ? std::string("the top-level object")
                                             : "the object '" + open.back().name + "'";
      }
      open.back().last_key = std::move(key);
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), watch);
  } catch (const nlohmann::json::exception& e) {
    throw Error("loom: " + std::string(where) + " is not valid JSON: " + e.what());
  }
  if (!duplicate.empty())
    throw Error("loom: " + std::string(where) + ": key '" + duplicate + "' appears twice in " + in_object);
  return j;
}
}  // namespace detail

LOOM_INLINE nlohmann::json parse(std::string_view text, std::string_view where) {
  return detail::parse_strict<nlohmann::json>(text, where);
}

LOOM_INLINE nlohmann::ordered_json parse_ordered(std::string_view text, std::string_view where) {
  return detail::parse_strict<nlohmann::ordered_json>(text, where);
}

LOOM_INLINE nlohmann::json read_file(const std::filesystem::path& path) {
  if (!path_exists(path, PathKind::file)) throw Error("loom: cannot open " + path.string() + " (missing or unreadable)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("loom: cannot open " + path.string() + " (missing or unreadable)");
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw Error("loom: cannot read " + path.string());
  return parse(text.str(), path.string());
}

LOOM_INLINE Fields::Fields(const nlohmann::json& j, std::string where) : j_(&j), where_(std::move(where)) {
  if (!j.is_object()) throw Error("loom: " + (where_.empty() ? std::string("the state") : where_) + " is not a JSON object");
}

LOOM_INLINE void Fields::fail(std::string_view key, std::string_view problem) const {
  throw Error("loom: " + (where_.empty() ? std::string() : where_ + ": ") + "field '" + std::string(key) + "' " +
              std::string(problem));
}

LOOM_INLINE const nlohmann::json& Fields::required(std::string_view key) const {
  const auto it = j_->find(std::string(key));
  if (it == j_->end()) fail(key, "is missing");
  if (it->is_null()) fail(key, "is null");
  return *it;
}

LOOM_INLINE int64_t Fields::integer(std::string_view key, int64_t min, int64_t max) const {
  const auto& v = required(key);
  auto range = [&] {
    std::string r = "an integer";
    if (min != std::numeric_limits<int64_t>::min() && max != std::numeric_limits<int64_t>::max())
      r += " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
    else if (min != std::numeric_limits<int64_t>::min())
      r += " >= " + std::to_string(min);
    return r;
  };
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(max)))
    fail(key, "must be " + range() + ", got " + v.dump());
  const auto x = v.get<int64_t>();
  if (x < min || x > max) fail(key, "must be " + range() + ", got " + v.dump());
  return x;
}

LOOM_INLINE std::optional<int64_t> Fields::optional_integer(std::string_view key, int64_t min) const {
  if (!has(key)) return std::nullopt;
  return integer(key, min);
}

LOOM_INLINE double Fields::number(std::string_view key, double min) const {
  const auto& v = required(key);
  if (!v.is_number()) fail(key, "must be a number, got " + v.dump());
  const auto x = v.get<double>();
  if (!(x >= min)) {
    std::ostringstream m;
    m << "must be a number >= " << min << ", got " << v.dump();
    fail(key, m.str());
  }
  return x;
}

LOOM_INLINE std::optional<double> Fields::optional_number(std::string_view key, double min) const {
  if (!has(key)) return std::nullopt;
  return number(key, min);
}

LOOM_INLINE bool Fields::boolean(std::string_view key) const {
  const auto& v = required(key);
  if (!v.is_boolean()) fail(key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}

LOOM_INLINE std::string Fields::string(std::string_view key) const {
  const auto& v = required(key);
  if (!v.is_string()) fail(key, "must be a string, got " + v.dump());
  return v.get<std::string>();
}

LOOM_INLINE std::optional<std::string> Fields::optional_string(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return string(key);
}

LOOM_INLINE const nlohmann::json& Fields::object(std::string_view key) const {
  const auto& v = required(key);
  if (!v.is_object()) fail(key, "must be a JSON object, got " + v.dump());
  return v;
}

LOOM_INLINE const nlohmann::json& Fields::array(std::string_view key) const {
  const auto& v = required(key);
  if (!v.is_array()) fail(key, "must be a JSON array, got " + v.dump());
  return v;
}

}  // namespace loom::json
