#pragma once
// The definitions of loom::detail::Reflected<T>'s members (config/reflected.hpp): what the
// command line, JSON and --help do with one struct. Function templates, not inline, so that a
// struct declared `extern template` (TrainingArguments, under LOOM_SEPARATE_COMPILATION) takes
// them from loom::compiled instead of instantiating them in each program.

#include <loom/config/fields.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/reflected.hpp>
#include <loom/config/text.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::detail {

template <class T>
void Reflected<T>::check() {
  check_struct<T>();
}

template <class T>
void Reflected<T>::append_fields(std::vector<FieldInfo>& table, std::size_t type_index) {
  constexpr auto names = setting_names<T>();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (table.push_back(FieldInfo{names[I], type_index, I,
                               std::is_same_v<typename field_traits<setting_t<T, I>>::scalar, bool>,
                               field_kind_phrase<setting_t<T, I>>()}),
     ...);
  }(std::make_index_sequence<setting_count<T>()>{});
}

template <class T>
void Reflected<T>::set_text(T& value, const FieldInfo& info, std::string_view text) {
  visit_setting(value, info.field_index, [&](auto& field) { set_from_text(field, text, info.name); });
}

template <class T>
void Reflected<T>::set_json(T& value, const FieldInfo& info, const nlohmann::json& json) {
  visit_setting(value, info.field_index, [&](auto& field) { set_from_json(field, json, info.name); });
}

template <class T>
void Reflected<T>::record_given(T& value, std::string_view name) {
  if constexpr (has_given_flags_v<T>) for_each_given_flags(value, [&](GivenFlags& flags) { flags.insert(name); });
}

template <class T>
bool Reflected<T>::record_ignored(T& value, std::string_view key) {
  if constexpr (has_given_flags_v<T>) {
    bool done = false;
    for_each_given_flags(value, [&](GivenFlags& flags) {
      if (!std::exchange(done, true)) flags.insert_ignored(key);
    });
    return true;
  } else {
    return false;
  }
}

template <class T>
void Reflected<T>::append_help(std::string& out, const T& defaults) {
  constexpr auto names = setting_names<T>();
  constexpr auto descriptions = field_descriptions<T>();
  constexpr auto groups = setting_groups<T>();
  out += '\n';
  out += help_heading<T>();
  out += ":\n";
  std::string_view group;
  for_each_setting(defaults, [&]<class F>(const F& field, std::size_t index) {
    if (groups[index] != group) {  // a group's settings under its own sub-heading
      group = groups[index];
      if (!group.empty()) out.append(" ").append(group).append(":\n");
    }
    append_help_line(out, names[index], kind_short<typename field_traits<F>::scalar>(), field_to_text(field),
                     descriptions[index]);
  });
}

template <class T>
nlohmann::ordered_json Reflected<T>::to_json(const T& value) {
  constexpr auto names = setting_names<T>();
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for_each_setting(value, [&]<class F>(const F& field, std::size_t index) {
    out[std::string(names[index])] = ::loom::json::field_to_json(field);
  });
  return out;
}

}  // namespace loom::detail
