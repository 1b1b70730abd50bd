#pragma once
// JSON <-> reflected structs (config/fields.hpp), in the style of HfArgumentParser's
// parse_json_file and TrainingArguments.to_json_string:
//   loom::to_json(args) / loom::from_json<T>(j)      every setting in declaration order; an
//                                                    empty optional is null
//   loom::save_json(args, path) / loom::load_json<T>(path)   the same through a file
//   loom::parse_json_file<Ts...>(path)               one object of settings for several structs
// Reading goes through the strict reader (config/json.hpp): a key given twice, an unknown key
// (with the nearest name), a wrong type or a bad null is a loom::Error naming the file and
// the key. Writing is atomic (loom::json::write_file). GivenFlags fields are never written or
// read; parse_json_file records the keys it read in them.

#include <loom/config/error.hpp>
#include <loom/config/fields.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/json.hpp>
#include <loom/config/meta.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::json {

/// A JSON value as error messages show it: "an object", "an array", "null", or its dump
/// (cut to 60 characters). Any nlohmann::basic_json; the two usual ones are compiled once.
template <class Json>
std::string describe(const Json& value) {
  if (value.is_object() || value.is_array()) return std::string("an ") + value.type_name();
  if (value.is_null()) return "null";
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}
LOOM_INLINE std::string describe(const nlohmann::json& value);
LOOM_INLINE std::string describe(const nlohmann::ordered_json& value);

/// Writes json.dump(2) and a newline to `path` atomically (path.tmp, then rename); creates
/// parent folders. Throws loom::Error.
LOOM_INLINE void write_file(const nlohmann::ordered_json& json, const std::filesystem::path& path);
/// The arguments the other way round would compile (a path converts to JSON and JSON to a
/// path) and fail at run time; refused at compile time instead.
void write_file(const std::filesystem::path& path, const nlohmann::ordered_json& json) = delete;
void write_file(const std::filesystem::path& path, const nlohmann::json& json) = delete;

}  // namespace loom::json

namespace loom::detail {

/// Writes `text` to `path` atomically: to path.tmp (removed on failure), then renamed over
/// `path`; creates parent folders. No fsync. Throws loom::Error.
LOOM_INLINE void write_text_atomically(const std::filesystem::path& path, std::string_view text);

/// `j.dump(indent)` and a newline through write_text_atomically (sorted keys, as HF's
/// json.dumps(sort_keys=True)): the Trainer's run files and the checkpoint's JSON files.
LOOM_INLINE void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent);

// ---- JSON value -> field ------------------------------------------------------------------

/// "loom: JSON key '<key>' expects <kind>, got <got><note>".
LOOM_INLINE Error json_type_error(std::string_view key, std::string_view kind, std::string_view got,
                                  std::string_view note);

/// "loom: JSON key '<key>' is null, but the field is not optional (expects <kind>)".
LOOM_INLINE Error json_null_error(std::string_view key, std::string_view kind);

/// "loom: unknown JSON key '<key>'", with the nearest field of `table` when one is close; for a
/// transformers.TrainingArguments setting loom has no flag for, why, and `given` (the value
/// as describe() shows it) beside the values that would be accepted.
LOOM_INLINE Error unknown_key_error(const std::string& key, const std::vector<FieldInfo>& table,
                                    std::string_view given = {});

/// True when `value` is one of the values ForeignSetting::accepted lists for `key`.
LOOM_INLINE bool foreign_value_accepted(std::string_view key, const nlohmann::json& value);

/// What a JSON settings file written by transformers (TrainingArguments.to_json_string, or
/// HfArgumentParser's JSON) gives in HF's own form, in the form loom's field takes: lists where
/// loom takes comma-separated words (report_to, include_for_metrics, label_names; fsdp's words
/// by spaces), objects where loom takes JSON text (lr_scheduler_kwargs, fsdp_config, deepspeed,
/// gradient_checkpointing_kwargs), null lr_scheduler_kwargs as {} and a bool fsdp as text.
/// Nothing when `value` is already loom's form.
LOOM_INLINE std::optional<nlohmann::json> hf_json_form(std::string_view key, const nlohmann::json& value);

/// Records `key` with GivenFlags::insert_ignored in the first struct of `values` that holds a
/// GivenFlags field (TrainingArguments, when it is parsed).
template <std::size_t TI = 0, class Tuple>
void record_ignored(Tuple& values, std::string_view key) {
  if constexpr (TI < std::tuple_size_v<Tuple>) {
    using T = std::tuple_element_t<TI, Tuple>;
    if (!Reflected<T>::record_ignored(std::get<TI>(values), key)) record_ignored<TI + 1>(values, key);
  }
}

template <class F, class Json>
void set_from_json(F& field, const Json& value, std::string_view key) {
  using Traits = field_traits<F>;
  using S = typename Traits::scalar;
  auto wrong = [&](std::string_view note = {}) {
    return json_type_error(key, field_kind_phrase<F>(), loom::json::describe(value), note);
  };
  if (value.is_null()) {
    if constexpr (Traits::is_optional) {
      field.reset();
      return;
    } else {
      throw json_null_error(key, field_kind_phrase<F>());
    }
  }
  S parsed{};
  if constexpr (std::is_same_v<S, bool>) {
    if (!value.is_boolean()) throw wrong();
    parsed = value.template get<bool>();
  } else if constexpr (is_integer_field_v<S>) {
    if (value.is_number_unsigned()) {
      const auto v = value.template get<std::uint64_t>();
      if (!std::in_range<S>(v)) throw wrong(" (out of range)");
      parsed = static_cast<S>(v);
    } else if (value.is_number_integer()) {
      const auto v = value.template get<std::int64_t>();
      if (!std::in_range<S>(v)) throw wrong(" (out of range)");
      parsed = static_cast<S>(v);
    } else {
      throw wrong();
    }
  } else if constexpr (std::is_floating_point_v<S>) {
    if (!value.is_number()) throw wrong();
    parsed = static_cast<S>(value.template get<double>());
  } else if constexpr (std::is_same_v<S, std::string>) {
    if (!value.is_string()) throw wrong();
    parsed = value.template get<std::string>();
  } else {
    static_assert(dependent_false_v<S>, "loom: unsupported field type");
  }
  field = std::move(parsed);
}

template <class S>
nlohmann::ordered_json scalar_to_json(const S& value) {
  if constexpr (is_integer_field_v<S> && std::is_unsigned_v<S>) return static_cast<std::uint64_t>(value);
  else if constexpr (is_integer_field_v<S>) return static_cast<std::int64_t>(value);
  else if constexpr (std::is_floating_point_v<S>) return static_cast<double>(value);
  else return value;  // bool, std::string
}

/// Re-says `e` with the file in front: "loom: <path>: unknown JSON key ...".
[[noreturn]] LOOM_INLINE void rethrow_with_path(const std::filesystem::path& path, const Error& e);

/// Whether apply_json_object records the keys it reads in the structs' GivenFlags fields
/// (settings given by the user, not a file loom wrote).
enum class RecordGiven : bool { no, yes };

/// Sets the fields that the keys of `json` (an object) name, in `values` (a tuple of structs
/// over `table`); an unknown key, a wrong type or a bad null throws loom::Error.
template <class Json, class Tuple>
void apply_json_object(Tuple& values, const Json& json, const std::vector<FieldInfo>& table,
                       RecordGiven record = RecordGiven::no) {
  if (!json.is_object()) throw Error("loom: expected a JSON object of settings, got " + loom::json::describe(json));
  for (auto it = json.begin(); it != json.end(); ++it) {
    const FieldInfo* info = find_field(table, it.key());
    if (info == nullptr) {
      // A transformers setting loom has no flag for, at a value loom already honours (HF's
      // default): read, and listed at start-up; any other value is refused by name.
      const nlohmann::json plain = it.value();
      if (!foreign_value_accepted(it.key(), plain)) throw unknown_key_error(it.key(), table, loom::json::describe(plain));
      if (record == RecordGiven::yes) record_ignored(values, it.key());
      continue;
    }
    const std::optional<nlohmann::json> hf_form = hf_json_form(info->name, it.value());
    with_struct(values, info->type_index, [&]<class T>(T& value) {
      if (hf_form) Reflected<T>::set_json(value, *info, *hf_form);
      else if constexpr (std::is_same_v<Json, nlohmann::json>) Reflected<T>::set_json(value, *info, it.value());
      else Reflected<T>::set_json(value, *info, nlohmann::json(it.value()));
      if (record == RecordGiven::yes) Reflected<T>::record_given(value, info->name);
    });
  }
}

/// apply_json_object over the file at `path` (read strictly: a key given twice is an error);
/// every message names the file.
template <class Tuple>
void apply_json_file(Tuple& values, const std::filesystem::path& path, const std::vector<FieldInfo>& table,
                     RecordGiven record = RecordGiven::no) {
  const nlohmann::json json = loom::json::read_file(path);
  try {
    apply_json_object(values, json, table, record);
  } catch (const Error& e) {
    rethrow_with_path(path, e);
  }
}

}  // namespace loom::detail

namespace loom {

/// Reads a JSON object of settings for all of Ts at once (HF's parse_json_file): each key
/// sets the field of that name in whichever struct has it, and is recorded in that struct's
/// GivenFlags field if it has one. Returns T (one type) or std::tuple<Ts...>; an unknown key
/// (with the nearest name), a wrong type or a key given twice throws loom::Error naming the file.
template <class... Ts>
  requires(sizeof...(Ts) > 0)
auto parse_json_file(const std::filesystem::path& path) {
  detail::check_parseable<Ts...>();
  std::tuple<Ts...> values{};
  detail::apply_json_file(values, path, detail::field_table<Ts...>(), detail::RecordGiven::yes);
  if constexpr (sizeof...(Ts) == 1) {
    return std::get<0>(std::move(values));
  } else {
    return values;
  }
}

namespace json {
/// True for a field type reflection reads from and writes to JSON (bool, integers, floating
/// point, strings, and their optionals): what a config struct of models/ may hold.
template <class F>
inline constexpr bool is_field = ::loom::detail::is_supported_field_v<F>;
/// Sets `field` from `value`, the JSON at key `key`, as parse_json_file does: a loom::Error
/// naming the key when the value does not fit the field's type.
template <class F, class Json>
void read_field(F& field, const Json& value, std::string_view key) {
  ::loom::detail::set_from_json(field, value, key);
}
/// `field` as JSON, as to_json writes it (an empty optional: null).
template <class F>
nlohmann::ordered_json field_to_json(const F& field) {
  if constexpr (::loom::detail::field_traits<F>::is_optional)
    return field ? ::loom::detail::scalar_to_json(*field) : nlohmann::ordered_json(nullptr);
  else
    return ::loom::detail::scalar_to_json(field);
}
/// Rethrows `e` with `path`, the file its value came from, named in the message.
[[noreturn]] inline void rethrow_with_path(const std::filesystem::path& path, const Error& e) {
  ::loom::detail::rethrow_with_path(path, e);
}
}  // namespace json

/// Every setting in declaration order; an empty optional becomes null (GivenFlags fields are left out).
template <class T>
nlohmann::ordered_json to_json(const T& value) {
  detail::Reflected<T>::check();
  return detail::Reflected<T>::to_json(value);
}

/// A default-constructed T with the keys present set; unknown key, wrong type or bad null throws loom::Error.
template <class T, class Json = nlohmann::json>
T from_json(const Json& json) {
  detail::Reflected<T>::check();
  std::tuple<T> value{};
  detail::apply_json_object(value, json, detail::field_table<T>());
  return std::get<0>(std::move(value));
}

/// Writes to_json(value) with json::write_file: indent 2, atomically, parent folders created.
template <class T>
void save_json(const T& value, const std::filesystem::path& path) {
  json::write_file(to_json(value), path);
}

/// Reads a JSON object written by save_json (or by hand) into T; errors name the path.
template <class T>
T load_json(const std::filesystem::path& path) {
  detail::Reflected<T>::check();
  std::tuple<T> value{};
  detail::apply_json_file(value, path, detail::field_table<T>());
  return std::get<0>(std::move(value));
}

}  // namespace loom

#include <loom/config/reflected_ops.hpp>

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/json_io.ipp>
#endif
