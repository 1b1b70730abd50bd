#pragma once
// What TRL's trainers keep between logs (their _metrics[mode]): values recorded at each step
// of training or evaluation, each logged as its mean beside the Trainer's own entries, then
// cleared. Shared by the methods of this folder.

#include <loom/core/metrics.hpp>

#include <map>
#include <string>
#include <vector>

namespace loom::methods::detail {

/// Values recorded per mode (training, evaluation) since the last log.
class LoggedMetrics {
 public:
  /// Records one value of `name` (logged as the mean of those recorded).
  void append(bool training, const std::string& name, double value) { of(training)[name].push_back(value); }
  /// Sets `name` to one value (a running total, such as num_tokens).
  void set(bool training, const std::string& name, double value) { of(training)[name] = {value}; }
  /// `logs` with each recorded metric's mean beside them (prefixed with eval_ when not
  /// `training`, as TRL's log); the mode's records are cleared.
  [[nodiscard]] Metrics merged(const Metrics& logs, bool training) {
    Metrics entry = logs;
    auto& recorded = of(training);
    for (const auto& [name, values] : recorded) {
      double sum = 0;
      for (double v : values) sum += v;
      entry.set((training ? "" : "eval_") + name, values.empty() ? 0.0 : sum / static_cast<double>(values.size()));
    }
    recorded.clear();
    return entry;
  }

 private:
  std::map<std::string, std::vector<double>>& of(bool training) { return metrics_[training ? 0 : 1]; }
  std::map<std::string, std::vector<double>> metrics_[2];
};

}  // namespace loom::methods::detail
