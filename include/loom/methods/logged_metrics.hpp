#pragma once
// What TRL's trainers keep between logs (their _metrics[mode]): values recorded at each step
// of training or evaluation, each logged as its mean beside the Trainer's own entries, then
// cleared. Shared by the methods of this folder.
//
// TRL reduces each step's values over the ranks at once (a collective inside compute_loss).
// loom records each rank's sums per step (RankSums) and reduces them when they are logged, in
// one collective every rank makes: in evaluation a rank may have no batch in the last round
// (loom does not repeat examples to even the ranks out), so it makes no compute_loss call
// there and a collective inside one would wait for it forever.

#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
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

/// How RankSums combines one column over the ranks.
enum class Combine : char { sum, min, max };

/// Each rank's per-step values (one vector a step of training or evaluation, the same columns
/// each), combined over the ranks step by step when reduced: the k-th recorded step of every
/// rank is one step (the ranks take their batches in rounds).
class RankSums {
 public:
  /// Records this rank's values of one step.
  void add(bool training, std::vector<double> values) { of(training).push_back(std::move(values)); }
  /// The steps recorded since the last reduce, each combined over the ranks by `combine`
  /// (one per column), in step order; cleared. Every rank calls it (one gather when several).
  template <class Accelerator>
  std::vector<std::vector<double>> reduce(Accelerator& acc, bool training, const std::vector<Combine>& combine) {
    auto& steps = of(training);
    const auto width = static_cast<int64_t>(combine.size());
    std::vector<std::vector<double>> out;
    if (acc.world().size == 1) {
      out.swap(steps);
      return out;
    }
    // Each step's values after its index, gathered from every rank in one collective.
    torch::Tensor local;
    if (!steps.empty()) {
      local = torch::empty({static_cast<int64_t>(steps.size()), width + 1}, torch::kDouble);
      for (std::size_t i = 0; i < steps.size(); ++i) {
        check(static_cast<int64_t>(steps[i].size()) == width, "RankSums: a step recorded {} values for {} columns",
              steps[i].size(), width);
        local[static_cast<int64_t>(i)][0] = static_cast<double>(i);
        for (int64_t c = 0; c < width; ++c) local[static_cast<int64_t>(i)][c + 1] = steps[i][static_cast<std::size_t>(c)];
      }
      local = local.to(acc.device());
    }
    steps.clear();
    const auto all = acc.gather_for_metrics(local);
    if (!all.defined() || all.numel() == 0) return out;
    const auto rows = all.to(torch::kCPU, torch::kDouble).contiguous();
    const auto* v = rows.template data_ptr<double>();
    std::map<int64_t, std::vector<double>> by_step;
    for (int64_t r = 0; r < rows.size(0); ++r) {
      const double* row = v + r * (width + 1);
      auto [it, fresh] = by_step.try_emplace(static_cast<int64_t>(row[0]), row + 1, row + 1 + width);
      if (fresh) continue;
      for (int64_t c = 0; c < width; ++c) {
        auto& x = it->second[static_cast<std::size_t>(c)];
        switch (combine[static_cast<std::size_t>(c)]) {
          case Combine::sum: x += row[c + 1]; break;
          case Combine::min: x = std::min(x, row[c + 1]); break;
          case Combine::max: x = std::max(x, row[c + 1]); break;
        }
      }
    }
    for (auto& [step, values] : by_step) out.push_back(std::move(values));
    return out;
  }

 private:
  std::vector<std::vector<double>>& of(bool training) { return steps_[training ? 0 : 1]; }
  std::vector<std::vector<double>> steps_[2];
};

}  // namespace loom::methods::detail
