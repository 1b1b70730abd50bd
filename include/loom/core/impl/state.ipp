#pragma once
// Definitions of core/state.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/json.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <type_traits>
#include <utility>

namespace loom {

LOOM_INLINE void TrainerState::append_log(const Metrics& logs) {
  auto entry = logs.to_json();
  entry["step"] = global_step;
  log_history.push_back(std::move(entry));
}

LOOM_INLINE nlohmann::ordered_json TrainerState::to_json() const {
  nlohmann::ordered_json j;
  j["best_global_step"] = best_global_step ? nlohmann::ordered_json(*best_global_step) : nullptr;
  j["best_metric"] = best_metric ? nlohmann::ordered_json(*best_metric) : nullptr;
  j["best_model_checkpoint"] =
      best_model_checkpoint ? nlohmann::ordered_json(*best_model_checkpoint) : nullptr;
  j["epoch"] = epoch;
  j["eval_steps"] = eval_steps;
  j["global_step"] = global_step;
  j["is_hyper_param_search"] = is_hyper_param_search;
  j["is_local_process_zero"] = is_local_process_zero;
  j["is_world_process_zero"] = is_world_process_zero;
  j["log_history"] = log_history;
  j["logging_steps"] = logging_steps;
  j["max_steps"] = max_steps;
  j["num_input_tokens_seen"] = num_input_tokens_seen;
  j["num_train_epochs"] = num_train_epochs;
  j["save_steps"] = save_steps;
  j["stateful_callbacks"] = stateful_callbacks;
  j["total_flos"] = total_flos;
  j["train_batch_size"] = train_batch_size;
  j["trial_name"] = nullptr;
  j["trial_params"] = nullptr;
  return j;
}

LOOM_INLINE TrainerState TrainerState::from_json(const nlohmann::json& j, const std::string& where) {
  // Required: what a resume needs. Optional (absent or null): the rest, as HF writes them.
  const json::Fields f(j, where);
  TrainerState s;
  s.epoch = f.number("epoch", 0.0);
  s.global_step = f.integer("global_step", 0);
  s.max_steps = f.integer("max_steps", 0);
  s.logging_steps = f.optional_integer("logging_steps", 0).value_or(s.logging_steps);
  s.eval_steps = f.optional_integer("eval_steps", 0).value_or(s.eval_steps);
  s.save_steps = f.optional_integer("save_steps", 0).value_or(s.save_steps);
  s.train_batch_size = f.optional_integer("train_batch_size", 0).value_or(s.train_batch_size);
  s.num_train_epochs = f.optional_integer("num_train_epochs", 0).value_or(s.num_train_epochs);
  s.num_input_tokens_seen = f.optional_integer("num_input_tokens_seen", 0).value_or(0);
  s.total_flos = f.optional_number("total_flos", 0.0).value_or(0.0);
  if (f.has("log_history")) {
    for (const auto& e : f.array("log_history")) {
      if (!e.is_object()) f.fail("log_history", "must hold JSON objects, got " + e.dump());
      s.log_history.push_back(nlohmann::ordered_json(e));
    }
  }
  s.best_metric = f.optional_number("best_metric");
  s.best_global_step = f.optional_integer("best_global_step", 0);
  s.best_model_checkpoint = f.optional_string("best_model_checkpoint");
  if (f.has("stateful_callbacks")) s.stateful_callbacks = nlohmann::ordered_json(f.object("stateful_callbacks"));
  return s;
}

LOOM_INLINE void TrainerState::save(const std::filesystem::path& path) const {
  std::ofstream out(path);
  if (!out) throw Error("cannot write " + path.string());
  out << to_json().dump(2) << '\n';
  if (!out) throw Error("cannot write " + path.string());
}

LOOM_INLINE TrainerState TrainerState::load(const std::filesystem::path& path) {
  return from_json(json::read_file(path), path.string());
}

namespace detail {
// TrainerControl's flags under HF's names, in HF's order (TrainerControl.state()).
inline constexpr std::pair<const char*, bool TrainerControl::*> kControlFlags[] = {
    {"should_training_stop", &TrainerControl::should_training_stop},
    {"should_epoch_stop", &TrainerControl::should_epoch_stop},
    {"should_save", &TrainerControl::should_save},
    {"should_evaluate", &TrainerControl::should_evaluate},
    {"should_log", &TrainerControl::should_log}};
}  // namespace detail

LOOM_INLINE nlohmann::ordered_json TrainerControl::state() const {
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  for (const auto& [name, flag] : detail::kControlFlags) args[name] = this->*flag;
  return {{"args", args}, {"attributes", nlohmann::ordered_json::object()}};
}

LOOM_INLINE TrainerControl TrainerControl::from_state(const nlohmann::json& j) {
  TrainerControl c;
  const nlohmann::json* args = j.is_object() && j.contains("args") ? &j["args"] : nullptr;
  if (!args || !args->is_object())
    throw Error("trainer_state.json: stateful_callbacks.TrainerControl has no \"args\" object");
  for (const auto& [name, flag] : detail::kControlFlags) {
    if (!args->contains(name) || !(*args)[name].is_boolean())
      throw Error(std::string("trainer_state.json: stateful_callbacks.TrainerControl.args.") + name +
                  " is missing or not a boolean");
    c.*flag = (*args)[name].get<bool>();
  }
  return c;
}

}  // namespace loom
