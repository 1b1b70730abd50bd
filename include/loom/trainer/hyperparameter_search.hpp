#pragma once
// hyperparameter_search: HF's Trainer.hyperparameter_search with loom's own two samplers
// (random and grid) and a median pruner, no backend to install.
//
//   loom::HpSearch search;
//   search.space = {loom::HpParam::log_uniform("learning_rate", 1e-4, 1e-1),
//                   loom::HpParam::choice("per_device_train_batch_size", {"16", "32"})};
//   search.n_trials = 8;
//   loom::BestRun best = loom::hyperparameter_search<MyTrainer>(args, search, model_init, train, eval);
//
// Each trial: a copy of `args` with the trial's values applied as if given on the command
// line (same parsing, same `loom:` errors), output_dir/run-<number> as its output folder, the
// seed `seed + number` (unless the space sets `seed`, or seed_per_trial is false, as in HF),
// a fresh model from model_init() (seeded first, as HF's train() does), a Trainer built
// in place, train(), and evaluate() if training never evaluated. The trial's objective is
// the last one reported: HF's compute_objective of every evaluation's metrics (default: the
// eval loss when the metrics hold nothing else, the sum of the other metrics otherwise).
// The pruner stops a trial (control.should_training_stop) whose best objective so far is
// worse than the median of the completed trials' objectives at the same step, as optuna's
// MedianPruner. Every rank draws the same trials and sees the same (all-reduced) metrics,
// so a multi-process search agrees without talking.

#include <loom/config/inline.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/trainer/trainer_callback.hpp>

#include <concepts>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

/// One hyperparameter: a TrainingArguments field and the values it may take.
struct HpParam {
  enum class Kind { choice, uniform, log_uniform, int_uniform };
  std::string name;                  ///< the field (flag) name, e.g. "learning_rate"
  Kind kind = Kind::choice;
  std::vector<std::string> choices;  ///< Kind::choice: the values, as command-line text
  double low = 0.0;                  ///< uniform / log_uniform / int_uniform: bounds (inclusive)
  double high = 0.0;

  /// One of `values` (each as it would be written on the command line).
  static HpParam choice(std::string name, std::vector<std::string> values);
  /// Uniform in [low, high].
  static HpParam uniform(std::string name, double low, double high);
  /// Log-uniform in [low, high] (both > 0): the usual space for learning rates.
  static HpParam log_uniform(std::string name, double low, double high);
  /// An integer uniform in [low, high].
  static HpParam int_uniform(std::string name, int64_t low, int64_t high);
};

/// How to search.
struct HpSearch {
  std::vector<HpParam> space;                ///< what varies (HF's hp_space)
  int64_t n_trials = 20;                     ///< trials to run (grid: at most the grid's size; 0: all of it)
  std::string direction = "minimize";        ///< "minimize" or "maximize" the objective
  std::string sampler = "random";            ///< "random" (seeded by `seed`) or "grid" (every combination, in order)
  uint64_t seed = 0;                         ///< the random sampler's seed
  bool seed_per_trial = true;                ///< trial n trains with --seed + n (false: all with --seed, as HF)
  std::string pruner = "median";             ///< "median" or "none"
  int64_t n_startup_trials = 5;              ///< the pruner waits for this many completed trials
  int64_t n_warmup_steps = 0;                ///< and does not prune before this step
  /// The objective of a set of evaluation metrics (empty: HF's default_compute_objective).
  std::function<double(const Metrics&)> compute_objective;
};

/// One trial of a search.
struct TrialResult {
  int64_t number = 0;
  std::map<std::string, std::string> hyperparameters;  ///< name -> value as applied
  std::string output_dir;
  int64_t seed = 0;
  std::optional<double> objective;                     ///< the last reported objective
  std::vector<std::pair<int64_t, double>> intermediate;  ///< (global_step, objective) at each evaluation
  bool pruned = false;
  int64_t global_step = 0;                             ///< optimizer steps it trained
};

/// HF's BestRun: the best completed trial, and every trial in run_summary.
struct BestRun {
  std::string run_id;  ///< the trial number (its folder is output_dir/run-<run_id>)
  double objective = 0.0;
  std::map<std::string, std::string> hyperparameters;
  std::vector<TrialResult> run_summary;
};

/// HF's default_compute_objective: eval_loss when the metrics hold nothing but it, the
/// epoch and speed metrics (*_runtime, *_per_second); else the sum of the others.
[[nodiscard]] LOOM_INLINE double default_compute_objective(const Metrics& metrics);

namespace detail {

/// The search's checks, its trial values and its bookkeeping: the part of
/// hyperparameter_search that does not depend on the Trainer type.
class HpSearchRun {
 public:
  /// Checks `search` (`loom:` errors for a bad direction, sampler, pruner, bound or an
  /// empty choice) and plans the trials.
  LOOM_INLINE HpSearchRun(const TrainingArguments& args, HpSearch search);

  /// Number of trials to run.
  [[nodiscard]] int64_t n_trials() const { return n_trials_; }
  /// Trial `number`'s arguments (values applied through the command-line parser) and its
  /// record, appended to the summary.
  LOOM_INLINE TrainingArguments begin_trial(int64_t number);
  /// A run-time callback that records the objective of each evaluation and prunes.
  LOOM_INLINE std::shared_ptr<TrainerCallback> reporter();
  /// The current trial's objective from `metrics` (an evaluation after training).
  LOOM_INLINE void report(int64_t global_step, const Metrics& metrics);
  /// Whether the current trial reported anything yet.
  [[nodiscard]] bool reported() const { return current().objective.has_value(); }
  /// Closes the current trial after `global_step` steps.
  LOOM_INLINE void end_trial(int64_t global_step);
  /// The best completed trial; a `loom:` error when every trial was pruned.
  [[nodiscard]] LOOM_INLINE BestRun best() const;

  /// Whether the pruner stops the current trial now.
  [[nodiscard]] LOOM_INLINE bool should_prune(int64_t global_step) const;
  [[nodiscard]] const TrialResult& current() const { return trials_.back(); }

 private:
  [[nodiscard]] LOOM_INLINE bool better(double a, double b) const;
  [[nodiscard]] LOOM_INLINE std::vector<std::string> draw(int64_t number);
  // args_ with `values` applied to the fields `names` by the command-line parser; a refused
  // value is a `loom:` error naming the trial (number < 0: the space, checked up front).
  [[nodiscard]] LOOM_INLINE TrainingArguments apply(const std::vector<std::string>& names,
                                                    const std::vector<std::string>& values, int64_t number) const;

  TrainingArguments args_;
  HpSearch search_;
  int64_t n_trials_ = 0;
  std::vector<TrialResult> trials_;
};

}  // namespace detail

/// Runs `search` over Trainers of type `TrainerT`, each built as
/// `TrainerT(trial_args, model_init(), datasets...)` (model_init may instead take the trial's
/// `const TrialResult&`), and returns the best run. Trials run one after another in this
/// process; under torchrun every rank runs the same search.
template <class TrainerT, class ModelInit, class... Datasets>
BestRun hyperparameter_search(const TrainingArguments& args, HpSearch search, ModelInit&& model_init,
                              const Datasets&... datasets) {
  detail::HpSearchRun run(args, std::move(search));
  for (int64_t number = 0; number < run.n_trials(); ++number) {
    TrainingArguments trial_args = run.begin_trial(number);
    torch::manual_seed(static_cast<uint64_t>(trial_args.seed));  // the model's initialization, as HF's train()
    auto model = [&] {
      if constexpr (std::invocable<ModelInit&, const TrialResult&>)
        return model_init(run.current());
      else
        return model_init();
    }();
    TrainerT trainer(std::move(trial_args), std::move(model), datasets...);
    trainer.add_callback(run.reporter());
    (void)trainer.train();
    if (!run.reported()) (void)trainer.evaluate();  // HF: if no evaluation happened during training
    run.end_trial(trainer.state().global_step);
  }
  return run.best();
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/hyperparameter_search.ipp>
#endif
