#pragma once
// TrainerState and TrainerControl: the two objects every callback event receives.
// Field names follow transformers.TrainerState / TrainerControl so that
// trainer_state.json reads the same in both worlds.

#include <loom/config/error.hpp>
#include <loom/core/metrics.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace loom {

/// Progress of a run; serialized as trainer_state.json with HF's field names.
struct TrainerState {
  double epoch = 0.0;                 ///< fractional epoch reached
  int64_t global_step = 0;            ///< optimizer steps taken
  int64_t max_steps = 0;              ///< optimizer steps planned
  int64_t logging_steps = 500;        ///< resolved logging interval (steps)
  int64_t eval_steps = 500;           ///< resolved evaluation interval (steps)
  int64_t save_steps = 500;           ///< resolved save interval (steps)
  int64_t train_batch_size = 0;       ///< per-device training batch size
  int64_t num_train_epochs = 0;       ///< epochs planned
  int64_t num_input_tokens_seen = 0;  ///< tokens consumed so far (when counted)
  double total_flos = 0.0;            ///< floating-point operations so far (when known)
  std::vector<nlohmann::ordered_json> log_history;    ///< every log() and evaluate() entry
  std::optional<double> best_metric;                  ///< best metric_for_best_model value
  std::optional<int64_t> best_global_step;            ///< step where best_metric was seen
  std::optional<std::string> best_model_checkpoint;   ///< folder of the best checkpoint
  bool is_local_process_zero = true;   ///< main process of this node
  bool is_world_process_zero = true;   ///< main process of the whole run
  bool is_hyper_param_search = false;  ///< always false in loom
  nlohmann::ordered_json stateful_callbacks = nlohmann::ordered_json::object();  ///< callback states

  /// Appends `logs` plus the current step to log_history, as HF's Trainer.log does.
  void append_log(const Metrics& logs) {
    auto entry = logs.to_json();
    entry["step"] = global_step;
    log_history.push_back(std::move(entry));
  }

  /// trainer_state.json content.
  [[nodiscard]] nlohmann::ordered_json to_json() const {
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

  /// Reads trainer_state.json content written by loom or by HF's Trainer.
  static TrainerState from_json(const nlohmann::json& j) {
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

  /// Writes trainer_state.json (indent 2, as HF) to `path`.
  void save(const std::filesystem::path& path) const {
    std::ofstream out(path);
    if (!out) throw Error("cannot write " + path.string());
    out << to_json().dump(2) << '\n';
    if (!out) throw Error("cannot write " + path.string());
  }

  /// Reads trainer_state.json from `path`.
  static TrainerState load(const std::filesystem::path& path) {
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
};

/// Flags callbacks set to steer the loop; reset exactly where HF's CallbackHandler resets them.
struct TrainerControl {
  bool should_training_stop = false;  ///< stop after this step (reset at on_train_begin)
  bool should_epoch_stop = false;     ///< end this epoch (reset at on_epoch_begin)
  bool should_save = false;           ///< save a checkpoint now (reset at on_step_begin, on_save)
  bool should_evaluate = false;       ///< evaluate now (reset at on_step_begin, on_evaluate)
  bool should_log = false;            ///< log now (reset at on_step_begin, on_log)
};

}  // namespace loom
