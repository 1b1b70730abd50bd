#pragma once
// EarlyStopping: HF's EarlyStoppingCallback. After each evaluation it reads
// metric_for_best_model (with the eval_ prefix) and counts the evaluations that did not
// improve on the best value by more than `threshold`; at `patience` such evaluations in a
// row it sets should_training_stop.
//
// "Best" is state.best_metric when the trainer has set it (HF's Trainer does when it saves
// the best checkpoint); otherwise the callback's own record, updated after each evaluation
// with HF's rule (replaced whenever strictly better, regardless of threshold). So it works
// with or without a trainer that tracks best_metric, and gives HF's counts either way.
// Differences from HF: a missing requirement is a loom::Error rather than an assert, and
// HF's warning about load_best_model_at_end is not printed.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

/// Stops training after `patience` evaluations without improvement of metric_for_best_model.
class EarlyStopping {
 public:
  /// Key of this callback's state in trainer_state.json's stateful_callbacks (HF's class name).
  static constexpr std::string_view name = "EarlyStoppingCallback";
  int64_t patience = 1;    ///< evaluations without improvement before stopping (HF's early_stopping_patience)
  double threshold = 0.0;  ///< least change that counts as improvement (HF's early_stopping_threshold)

  /// Checks that metric_for_best_model is set and evaluation is on; loom::Error otherwise.
  void on_train_begin(const TrainingArguments& args, TrainerState&, TrainerControl&) const;

  /// Compares the metric with the best so far, updates the counter, and may stop training.
  void on_evaluate(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
                   const Metrics& metrics);

  /// Evaluations in a row without improvement (HF's early_stopping_patience_counter).
  [[nodiscard]] int64_t patience_counter() const { return counter_; }
  /// The callback's own best value of the metric (used when state.best_metric is unset).
  [[nodiscard]] std::optional<double> best_metric() const { return best_; }

  /// HF's ExportableState: {"args": {patience, threshold}, "attributes": {counter, best}}.
  [[nodiscard]] nlohmann::json state() const;
  /// Restores what state() wrote (or HF's EarlyStoppingCallback state); loom::Error if malformed.
  void load_state(const nlohmann::json& j);

  /// The key looked up in the evaluation metrics: metric_for_best_model with the eval_ prefix.
  [[nodiscard]] static std::string metric_key(std::string_view metric);
  /// args.greater_is_better, defaulting as HF: true unless the metric name ends with "loss".
  [[nodiscard]] static bool greater_is_better(const TrainingArguments& args);

 private:
  int64_t counter_ = 0;
  std::optional<double> best_;
  bool warned_ = false;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/early_stopping.ipp>
#endif
