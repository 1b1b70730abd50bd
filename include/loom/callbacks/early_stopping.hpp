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

#include <loom/config/error.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
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
  void on_train_begin(const TrainingArguments& args, TrainerState&, TrainerControl&) const {
    if (!args.metric_for_best_model || args.metric_for_best_model->empty())
      throw Error("EarlyStopping requires --metric_for_best_model (e.g. --metric_for_best_model loss)");
    if (args.eval_strategy == "no")
      throw Error("EarlyStopping requires evaluation: --eval_strategy is \"no\"; set it to steps or epoch");
  }

  /// Compares the metric with the best so far, updates the counter, and may stop training.
  void on_evaluate(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
                   const Metrics& metrics) {
    if (!args.metric_for_best_model) return;
    const std::string name = metric_key(*args.metric_for_best_model);
    const std::optional<double> value = metrics.get(name);
    if (!value) {
      if (!warned_)
        std::fprintf(stderr,
                     "loom: warning: EarlyStopping found no %s in the evaluation metrics; early stopping is "
                     "disabled\n",
                     name.c_str());
      warned_ = true;
      return;
    }
    const bool greater = greater_is_better(args);
    auto better = [&](double a, double b) { return greater ? a > b : a < b; };
    const std::optional<double> best = state.best_metric ? state.best_metric : best_;
    if (!best || (better(*value, *best) && std::abs(*value - *best) > threshold))
      counter_ = 0;
    else
      ++counter_;
    if (!best_ || better(*value, *best_)) best_ = *value;
    if (counter_ >= patience) control.should_training_stop = true;
  }

  /// Evaluations in a row without improvement (HF's early_stopping_patience_counter).
  [[nodiscard]] int64_t patience_counter() const { return counter_; }
  /// The callback's own best value of the metric (used when state.best_metric is unset).
  [[nodiscard]] std::optional<double> best_metric() const { return best_; }

  /// HF's ExportableState: {"args": {patience, threshold}, "attributes": {counter, best}}.
  [[nodiscard]] nlohmann::json state() const {
    return {{"args", {{"early_stopping_patience", patience}, {"early_stopping_threshold", threshold}}},
            {"attributes",
             {{"early_stopping_patience_counter", counter_},
              {"early_stopping_best_metric", best_ ? nlohmann::json(*best_) : nlohmann::json(nullptr)}}}};
  }
  /// Restores what state() wrote (or HF's EarlyStoppingCallback state); loom::Error if malformed.
  void load_state(const nlohmann::json& j) {
    try {
      const auto& a = j.at("args");
      const auto& at = j.at("attributes");
      patience = a.at("early_stopping_patience").get<int64_t>();
      const auto& th = a.value("early_stopping_threshold", nlohmann::json(0.0));
      threshold = th.is_null() ? 0.0 : th.get<double>();
      counter_ = at.at("early_stopping_patience_counter").get<int64_t>();
      const auto best = at.value("early_stopping_best_metric", nlohmann::json(nullptr));
      best_ = best.is_null() ? std::nullopt : std::optional<double>(best.get<double>());
    } catch (const nlohmann::json::exception& e) {
      throw Error(std::string("invalid EarlyStopping state: ") + e.what());
    }
  }

  /// The key looked up in the evaluation metrics: metric_for_best_model with the eval_ prefix.
  [[nodiscard]] static std::string metric_key(std::string_view metric) {
    return metric.starts_with("eval_") ? std::string(metric) : "eval_" + std::string(metric);
  }
  /// args.greater_is_better, defaulting as HF: true unless the metric name ends with "loss".
  [[nodiscard]] static bool greater_is_better(const TrainingArguments& args) {
    return args.greater_is_better.value_or(
        !(args.metric_for_best_model && std::string_view(*args.metric_for_best_model).ends_with("loss")));
  }

 private:
  int64_t counter_ = 0;
  std::optional<double> best_;
  bool warned_ = false;
};

}  // namespace loom
