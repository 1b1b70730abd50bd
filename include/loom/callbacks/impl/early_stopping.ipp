#pragma once
// Definitions of callbacks/early_stopping.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/early_stopping.hpp>
#include <loom/config/error.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/log.hpp>
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

LOOM_INLINE void EarlyStopping::on_train_begin(const TrainingArguments& args, TrainerState&, TrainerControl&) const {
  if (!args.metric_for_best_model || args.metric_for_best_model->empty())
    throw Error("EarlyStopping requires --metric_for_best_model (e.g. --metric_for_best_model loss)");
  if (args.eval_strategy == "no")
    throw Error("EarlyStopping requires evaluation: --eval_strategy is \"no\"; set it to steps or epoch");
}

LOOM_INLINE void EarlyStopping::on_evaluate(const TrainingArguments& args, TrainerState& state,
                                            TrainerControl& control, const Metrics& metrics) {
  if (!args.metric_for_best_model) return;
  const std::string name = metric_key(*args.metric_for_best_model);
  const std::optional<double> value = metrics.get(name);
  if (!value) {
    if (!warned_)
      log_message(LogLevel::warning, "EarlyStopping found no {} in the evaluation metrics; early stopping is disabled",
                  name);
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

LOOM_INLINE nlohmann::json EarlyStopping::state() const {
  return {{"args", {{"early_stopping_patience", patience}, {"early_stopping_threshold", threshold}}},
          {"attributes",
           {{"early_stopping_patience_counter", counter_},
            {"early_stopping_best_metric", best_ ? nlohmann::json(*best_) : nlohmann::json(nullptr)}}}};
}

LOOM_INLINE void EarlyStopping::load_state(const nlohmann::json& j) {
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

LOOM_INLINE std::string EarlyStopping::metric_key(std::string_view metric) {
  return metric.starts_with("eval_") ? std::string(metric) : "eval_" + std::string(metric);
}

LOOM_INLINE bool EarlyStopping::greater_is_better(const TrainingArguments& args) {
  return args.greater_is_better.value_or(
      !(args.metric_for_best_model && std::string_view(*args.metric_for_best_model).ends_with("loss")));
}

}  // namespace loom
