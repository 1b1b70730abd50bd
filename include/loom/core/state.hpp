#pragma once
// TrainerState and TrainerControl: the two objects every callback event receives.
// Field names follow transformers.TrainerState / TrainerControl so that
// trainer_state.json reads the same in both worlds.

#include <loom/config/error.hpp>
#include <loom/config/inline.hpp>
#include <loom/core/metrics.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
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
  void append_log(const Metrics& logs);

  /// trainer_state.json content.
  [[nodiscard]] nlohmann::ordered_json to_json() const;

  /// Reads trainer_state.json content written by loom or by HF's Trainer; a missing, mistyped
  /// or out-of-range field is "loom: <where>: field '<name>' ...".
  static TrainerState from_json(const nlohmann::json& j, const std::string& where = "trainer_state.json");

  /// Writes trainer_state.json (indent 2, as HF) to `path`.
  void save(const std::filesystem::path& path) const;

  /// Reads trainer_state.json from `path` (strictly: json::read_file, then from_json).
  static TrainerState load(const std::filesystem::path& path);
};

/// Flags callbacks set to steer the loop; reset exactly where HF's CallbackHandler resets them.
struct TrainerControl {
  bool should_training_stop = false;  ///< stop after this step (reset at on_train_begin)
  bool should_epoch_stop = false;     ///< end this epoch (reset at on_epoch_begin)
  bool should_save = false;           ///< save a checkpoint now (reset at on_step_begin, on_save)
  bool should_evaluate = false;       ///< evaluate now (reset at on_step_begin, on_evaluate)
  bool should_log = false;            ///< log now (reset at on_step_begin, on_log)

  /// The entry trainer_state.json keeps under stateful_callbacks["TrainerControl"], as HF's
  /// TrainerControl.state(): {"args": {flag: value...}, "attributes": {}}.
  [[nodiscard]] nlohmann::ordered_json state() const;
  /// The flags of a state() entry (HF's restore on resume); a missing or non-boolean flag
  /// is a loom::Error.
  static TrainerControl from_state(const nlohmann::json& j);
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/core/impl/state.ipp>
#endif
