// The bodies of trainer/hyperparameter_search.hpp's non-template functions.
#pragma once

#include <loom/trainer/hyperparameter_search.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <span>

namespace loom {

LOOM_INLINE HpParam HpParam::choice(std::string name, std::vector<std::string> values) {
  HpParam p;
  p.name = std::move(name);
  p.kind = Kind::choice;
  p.choices = std::move(values);
  return p;
}

LOOM_INLINE HpParam HpParam::uniform(std::string name, double low, double high) {
  HpParam p;
  p.name = std::move(name);
  p.kind = Kind::uniform;
  p.low = low;
  p.high = high;
  return p;
}

LOOM_INLINE HpParam HpParam::log_uniform(std::string name, double low, double high) {
  HpParam p = uniform(std::move(name), low, high);
  p.kind = Kind::log_uniform;
  return p;
}

LOOM_INLINE HpParam HpParam::int_uniform(std::string name, int64_t low, int64_t high) {
  HpParam p = uniform(std::move(name), static_cast<double>(low), static_cast<double>(high));
  p.kind = Kind::int_uniform;
  return p;
}

LOOM_INLINE double default_compute_objective(const Metrics& metrics) {
  std::optional<double> loss;
  double sum = 0.0;
  bool others = false;
  for (const auto& [name, value] : metrics) {
    if (name == "eval_loss") {
      loss = value;
      continue;
    }
    const bool speed = name.ends_with("_runtime") || name.ends_with("_per_second");
    if (name == "epoch" || speed) continue;
    sum += value;
    others = true;
  }
  if (others) return sum;
  check(loss.has_value(), "hyperparameter_search: the evaluation metrics hold no eval_loss and no other metric "
                          "to use as the objective; pass HpSearch::compute_objective");
  return *loss;
}

namespace detail {

namespace {

// The number of values of a grid axis (choice or int_uniform), or 0 for a continuous one.
int64_t grid_axis_size(const HpParam& p) {
  if (p.kind == HpParam::Kind::choice) return static_cast<int64_t>(p.choices.size());
  if (p.kind == HpParam::Kind::int_uniform) return static_cast<int64_t>(p.high - p.low) + 1;
  return 0;
}

// A value as command-line text: integers without a point, reals in their shortest exact form.
std::string number_text(double v, bool integer) {
  return integer ? fmt::format("{}", static_cast<int64_t>(v)) : fmt::format("{}", v);
}

}  // namespace

LOOM_INLINE HpSearchRun::HpSearchRun(const TrainingArguments& args, HpSearch search)
    : args_(args), search_(std::move(search)) {
  check(search_.direction == "minimize" || search_.direction == "maximize",
        "hyperparameter_search: direction must be \"minimize\" or \"maximize\", got \"{}\"", search_.direction);
  check(search_.sampler == "random" || search_.sampler == "grid",
        "hyperparameter_search: sampler must be \"random\" or \"grid\", got \"{}\"", search_.sampler);
  check(search_.pruner == "median" || search_.pruner == "none",
        "hyperparameter_search: pruner must be \"median\" or \"none\", got \"{}\"", search_.pruner);
  check(!search_.space.empty(), "hyperparameter_search: the search space is empty");
  check(search_.n_trials >= 0, "hyperparameter_search: n_trials must be >= 0, got {}", search_.n_trials);
  check(search_.n_startup_trials >= 0 && search_.n_warmup_steps >= 0,
        "hyperparameter_search: n_startup_trials and n_warmup_steps must be >= 0");
  for (std::size_t i = 0; i < search_.space.size(); ++i) {
    const HpParam& p = search_.space[i];
    for (std::size_t j = 0; j < i; ++j)
      check(search_.space[j].name != p.name, "hyperparameter_search: '{}' appears twice in the search space", p.name);
    check(p.name != "output_dir", "hyperparameter_search: output_dir cannot be searched (each trial writes to "
                                  "output_dir/run-<number>)");
    if (p.kind == HpParam::Kind::choice) {
      check(!p.choices.empty(), "hyperparameter_search: '{}' has no choices", p.name);
      continue;
    }
    check(std::isfinite(p.low) && std::isfinite(p.high) && p.low <= p.high,
          "hyperparameter_search: '{}' needs finite bounds with low <= high, got [{}, {}]", p.name, p.low, p.high);
    check(p.kind != HpParam::Kind::log_uniform || p.low > 0.0,
          "hyperparameter_search: '{}' is log-uniform and needs low > 0, got {}", p.name, p.low);
    check(p.kind != HpParam::Kind::int_uniform || p.high - p.low < 1e9,
          "hyperparameter_search: '{}' spans more than 1e9 integers", p.name);
  }
  if (search_.sampler == "grid") {
    int64_t size = 1;
    for (const HpParam& p : search_.space) {
      const int64_t axis = grid_axis_size(p);
      check(axis > 0, "hyperparameter_search: the grid sampler needs choices or an integer range for '{}', "
                      "which is continuous", p.name);
      check(size <= (int64_t{1} << 40) / axis, "hyperparameter_search: the grid has more than 2^40 points");
      size *= axis;
    }
    n_trials_ = search_.n_trials == 0 ? size : std::min(search_.n_trials, size);
  } else {
    check(search_.n_trials > 0, "hyperparameter_search: the random sampler needs n_trials > 0");
    n_trials_ = search_.n_trials;
  }
  // Every value a trial can get, checked before the first trial trains (each choice, each
  // bound): a value the parser refuses stops the search at once, not after hours of trials.
  for (const HpParam& p : search_.space) {
    const bool integer = p.kind == HpParam::Kind::int_uniform;
    const std::vector<std::string> texts =
        p.kind == HpParam::Kind::choice ? p.choices
                                        : std::vector<std::string>{number_text(p.low, integer), number_text(p.high, integer)};
    for (const std::string& text : texts) (void)apply({p.name}, {text}, -1);
  }
}

LOOM_INLINE TrainingArguments HpSearchRun::apply(const std::vector<std::string>& names,
                                                 const std::vector<std::string>& values, int64_t number) const {
  std::vector<std::string> flags;
  for (std::size_t k = 0; k < names.size(); ++k) {
    flags.push_back("--" + names[k]);
    flags.push_back(values[k]);
  }
  try {
    return std::get<0>(try_parse_args(std::span<const std::string>(flags), std::tuple<TrainingArguments>{args_}).values);
  } catch (const Error& e) {
    std::string_view why = e.what();
    if (why.starts_with("loom: ")) why.remove_prefix(6);
    if (number < 0) fail("hyperparameter_search: the search space: {}", why);
    fail("hyperparameter_search: trial {}: {}", number, why);
  }
}

LOOM_INLINE std::vector<std::string> HpSearchRun::draw(int64_t number) {
  std::vector<std::string> values;
  if (search_.sampler == "grid") {
    // Row-major over the space's order: the last parameter varies fastest.
    int64_t rest = number;
    values.resize(search_.space.size());
    for (std::size_t k = search_.space.size(); k-- > 0;) {
      const HpParam& p = search_.space[k];
      const int64_t axis = grid_axis_size(p);
      const int64_t i = rest % axis;
      rest /= axis;
      values[k] = p.kind == HpParam::Kind::choice ? p.choices[static_cast<std::size_t>(i)]
                                                  : number_text(p.low + static_cast<double>(i), true);
    }
    return values;
  }
  // Random: one 64-bit draw per parameter from a generator seeded by (seed, trial number), so
  // trial n's values do not depend on how many trials ran before it.
  std::mt19937_64 gen(search_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(number) + 1);
  const auto unit = [&] { return static_cast<double>(gen() >> 11) * 0x1.0p-53; };  // [0, 1)
  for (const HpParam& p : search_.space) {
    switch (p.kind) {
      case HpParam::Kind::choice:
        values.push_back(p.choices[static_cast<std::size_t>(gen() % p.choices.size())]);
        break;
      case HpParam::Kind::uniform:
        values.push_back(number_text(p.low + unit() * (p.high - p.low), false));
        break;
      case HpParam::Kind::log_uniform:
        values.push_back(number_text(std::exp(std::log(p.low) + unit() * (std::log(p.high) - std::log(p.low))), false));
        break;
      case HpParam::Kind::int_uniform: {
        const auto span = static_cast<uint64_t>(p.high - p.low) + 1;
        values.push_back(number_text(p.low + static_cast<double>(gen() % span), true));
        break;
      }
    }
  }
  return values;
}

LOOM_INLINE TrainingArguments HpSearchRun::begin_trial(int64_t number) {
  const std::vector<std::string> values = draw(number);
  TrialResult trial;
  trial.number = number;
  std::vector<std::string> names;
  bool sets_seed = false;
  for (std::size_t k = 0; k < values.size(); ++k) {
    names.push_back(search_.space[k].name);
    trial.hyperparameters[names.back()] = values[k];
    sets_seed = sets_seed || names.back() == "seed";
  }
  TrainingArguments a = apply(names, values, number);
  a.output_dir = (std::filesystem::path(args_.output_dir) / fmt::format("run-{}", number)).string();
  if (search_.seed_per_trial && !sets_seed) a.seed = args_.seed + number;
  if (args_.run_name && !args_.run_name->empty()) a.run_name = fmt::format("{}-run-{}", *args_.run_name, number);
  trial.output_dir = a.output_dir;
  trial.seed = a.seed;
  trials_.push_back(std::move(trial));
  return a;
}

LOOM_INLINE bool HpSearchRun::better(double a, double b) const {
  return search_.direction == "minimize" ? a < b : a > b;
}

LOOM_INLINE void HpSearchRun::report(int64_t global_step, const Metrics& metrics) {
  TrialResult& t = trials_.back();
  const double objective =
      search_.compute_objective ? search_.compute_objective(metrics) : default_compute_objective(metrics);
  t.objective = objective;
  t.intermediate.emplace_back(global_step, objective);
}

LOOM_INLINE bool HpSearchRun::should_prune(int64_t global_step) const {
  if (search_.pruner != "median" || global_step < search_.n_warmup_steps) return false;
  const TrialResult& t = trials_.back();
  if (t.intermediate.empty()) return false;
  // The completed trials' objectives reported at this step.
  std::vector<double> others;
  int64_t completed = 0;
  for (std::size_t i = 0; i + 1 < trials_.size(); ++i) {
    if (trials_[i].pruned) continue;
    ++completed;
    for (const auto& [step, value] : trials_[i].intermediate)
      if (step == global_step) others.push_back(value);
  }
  if (completed < search_.n_startup_trials || others.empty()) return false;
  std::sort(others.begin(), others.end());
  const std::size_t n = others.size();
  const double median = n % 2 == 1 ? others[n / 2] : 0.5 * (others[n / 2 - 1] + others[n / 2]);
  double best = t.intermediate.front().second;
  for (const auto& [step, value] : t.intermediate)
    if (better(value, best)) best = value;
  return better(median, best);
}

LOOM_INLINE void HpSearchRun::end_trial(int64_t global_step) { trials_.back().global_step = global_step; }

LOOM_INLINE std::shared_ptr<TrainerCallback> HpSearchRun::reporter() {
  struct Reporter final : TrainerCallback {
    explicit Reporter(HpSearchRun& run) : run_(&run) {}
    void on_evaluate(const Args&, TrainerState& state, TrainerControl& control, const CallbackArgs& kw) override {
      if (kw.metrics == nullptr) return;
      run_->report(state.global_step, *kw.metrics);
      // Only a trial still training can be stopped (an evaluation after train() cannot).
      if (control.should_training_stop || state.global_step >= state.max_steps) return;
      if (run_->should_prune(state.global_step)) {
        run_->trials_.back().pruned = true;
        control.should_training_stop = true;
      }
    }
    HpSearchRun* run_;
  };
  return std::make_shared<Reporter>(*this);
}

LOOM_INLINE BestRun HpSearchRun::best() const {
  const TrialResult* best = nullptr;
  for (const TrialResult& t : trials_)
    if (!t.pruned && t.objective && (best == nullptr || better(*t.objective, *best->objective))) best = &t;
  check(best != nullptr, "hyperparameter_search: no trial completed ({} ran, every one was pruned)", trials_.size());
  BestRun out;
  out.run_id = std::to_string(best->number);
  out.objective = *best->objective;
  out.hyperparameters = best->hyperparameters;
  out.run_summary = trials_;
  return out;
}

}  // namespace detail
}  // namespace loom
