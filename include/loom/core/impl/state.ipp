#pragma once
// Definitions of core/state.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

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

LOOM_INLINE TrainerState TrainerState::from_json(const nlohmann::json& j) {
  TrainerState s;
  auto opt = [&](const char* key, auto& field) {
    if (j.contains(key) && !j[key].is_null()) field = j[key].get<std::decay_t<decltype(*field)>>();
  };
  auto req = [&](const char* key, auto& field) {
    if (!j.contains(key)) throw Error(std::string("trainer_state.json has no field '") + key + "'");
    field = j[key].get<std::decay_t<decltype(field)>>();
  };
  req("epoch", s.epoch);
  req("global_step", s.global_step);
  req("max_steps", s.max_steps);
  if (j.contains("logging_steps")) s.logging_steps = j["logging_steps"].get<int64_t>();
  if (j.contains("eval_steps")) s.eval_steps = j["eval_steps"].get<int64_t>();
  if (j.contains("save_steps")) s.save_steps = j["save_steps"].get<int64_t>();
  if (j.contains("train_batch_size") && !j["train_batch_size"].is_null())
    s.train_batch_size = j["train_batch_size"].get<int64_t>();
  if (j.contains("num_train_epochs")) s.num_train_epochs = j["num_train_epochs"].get<int64_t>();
  if (j.contains("num_input_tokens_seen"))
    s.num_input_tokens_seen = j["num_input_tokens_seen"].get<int64_t>();
  if (j.contains("total_flos")) s.total_flos = j["total_flos"].get<double>();
  if (j.contains("log_history"))
    for (const auto& e : j["log_history"]) s.log_history.push_back(nlohmann::ordered_json(e));
  opt("best_metric", s.best_metric);
  opt("best_global_step", s.best_global_step);
  opt("best_model_checkpoint", s.best_model_checkpoint);
  if (j.contains("stateful_callbacks"))
    s.stateful_callbacks = nlohmann::ordered_json(j["stateful_callbacks"]);
  return s;
}

LOOM_INLINE void TrainerState::save(const std::filesystem::path& path) const {
  std::ofstream out(path);
  if (!out) throw Error("cannot write " + path.string());
  out << to_json().dump(2) << '\n';
  if (!out) throw Error("cannot write " + path.string());
}

LOOM_INLINE TrainerState TrainerState::load(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path.string());
  try {
    return from_json(nlohmann::json::parse(in));
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + " is not a valid trainer_state.json: " + e.what());
  } catch (const Error& e) {
    throw Error(path.string() + ": " + std::string(e.what()).substr(6));  // drop the inner "loom: "
  }
}

LOOM_INLINE nlohmann::ordered_json TrainerControl::state() const {
  nlohmann::ordered_json args = {{"should_training_stop", should_training_stop},
                                 {"should_epoch_stop", should_epoch_stop},
                                 {"should_save", should_save},
                                 {"should_evaluate", should_evaluate},
                                 {"should_log", should_log}};
  return {{"args", args}, {"attributes", nlohmann::ordered_json::object()}};
}

LOOM_INLINE TrainerControl TrainerControl::from_state(const nlohmann::json& j) {
  TrainerControl c;
  const nlohmann::json* args = j.is_object() && j.contains("args") ? &j["args"] : nullptr;
  if (!args || !args->is_object())
    throw Error("trainer_state.json: stateful_callbacks.TrainerControl has no \"args\" object");
  for (auto [name, flag] : {std::pair{"should_training_stop", &c.should_training_stop},
                            std::pair{"should_epoch_stop", &c.should_epoch_stop}, std::pair{"should_save", &c.should_save},
                            std::pair{"should_evaluate", &c.should_evaluate}, std::pair{"should_log", &c.should_log}}) {
    if (!args->contains(name) || !(*args)[name].is_boolean())
      throw Error(std::string("trainer_state.json: stateful_callbacks.TrainerControl.args.") + name +
                  " is missing or not a boolean");
    *flag = (*args)[name].get<bool>();
  }
  return c;
}

}  // namespace loom
