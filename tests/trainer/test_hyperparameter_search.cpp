// hyperparameter_search: the trials a grid and a seeded random sampler draw, each trial's
// folder, seed and objective (checked against the same run made by hand), the direction,
// HF's default objective, the median pruner, and the `loom:` errors of a bad search.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_hyperparameter_search {

namespace {

using loom_test::Batch;
using Trainer = loom_test::Classifier<>;

// 6 steps of 8 rows at a constant rate, evaluated every 2 steps.
loom::TrainingArguments search_args(const std::string& name) {
  auto a = loom_test::quiet_args(name);
  a.per_device_train_batch_size = 8;
  a.max_steps = 6;
  a.lr_scheduler_type = "constant";
  a.eval_strategy = "steps";
  a.eval_steps = 2;
  a.logging_steps = 2;
  a.seed = 5;
  return a;
}

// A fresh Linear(4, 3): hyperparameter_search seeds torch before each call.
torch::nn::Linear model_init() { return torch::nn::Linear(4, 3); }

const auto train_data = loom_test::linear_data(64, 1);
const auto eval_data = loom_test::linear_data(32, 2);

}  // namespace

TEST_CASE("a grid search runs every combination in its own folder and seed, and picks the lowest eval loss") {
  const auto args = search_args("hp/grid");
  loom::HpSearch search;
  search.space = {loom::HpParam::choice("learning_rate", {"0.001", "0.3"}),
                  loom::HpParam::int_uniform("per_device_train_batch_size", 4, 5)};
  search.sampler = "grid";
  search.n_trials = 0;  // the whole grid
  search.pruner = "none";
  search.compute_objective = [](const loom::Metrics& m) { return m.get("eval_loss").value(); };
  const loom::BestRun best = loom::hyperparameter_search<Trainer>(args, search, model_init, train_data, eval_data);

  REQUIRE(best.run_summary.size() == 4);
  // Row-major: the last parameter varies fastest.
  CHECK(best.run_summary[0].hyperparameters.at("learning_rate") == "0.001");
  CHECK(best.run_summary[0].hyperparameters.at("per_device_train_batch_size") == "4");
  CHECK(best.run_summary[1].hyperparameters.at("per_device_train_batch_size") == "5");
  CHECK(best.run_summary[3].hyperparameters.at("learning_rate") == "0.3");
  double lowest = INFINITY;
  for (const auto& t : best.run_summary) {
    INFO("trial " << t.number);
    CHECK(t.output_dir == (std::filesystem::path(args.output_dir) / ("run-" + std::to_string(t.number))).string());
    CHECK(std::filesystem::exists(std::filesystem::path(t.output_dir) / "trainer_state.json"));
    CHECK(t.seed == args.seed + t.number);
    CHECK(t.global_step == 6);
    CHECK_FALSE(t.pruned);
    REQUIRE(t.intermediate.size() == 3);  // evaluations at steps 2, 4, 6
    CHECK(t.intermediate.back().first == 6);
    REQUIRE(t.objective.has_value());
    CHECK(*t.objective == t.intermediate.back().second);
    lowest = std::min(lowest, *t.objective);
  }
  CHECK(best.objective == lowest);
  CHECK(best.run_summary[std::stoul(best.run_id)].objective == lowest);
  // The larger rate learns this separable problem faster.
  CHECK(best.hyperparameters.at("learning_rate") == "0.3");

  // Trial 3 made by hand: the same arguments, seed and fresh model give the same eval loss.
  auto by_hand = search_args("hp/grid_by_hand");
  by_hand.learning_rate = 0.3;
  by_hand.per_device_train_batch_size = 5;
  by_hand.seed = args.seed + 3;
  torch::manual_seed(static_cast<uint64_t>(by_hand.seed));
  Trainer t(by_hand, model_init(), train_data, eval_data);
  (void)t.train();
  CHECK(t.evaluate().get("eval_loss").value() == *best.run_summary[3].objective);
}

TEST_CASE("a random search draws the same trials for the same seed, inside the bounds") {
  const auto args = search_args("hp/random");
  loom::HpSearch search;
  search.space = {loom::HpParam::log_uniform("learning_rate", 1e-4, 1e-1),
                  loom::HpParam::uniform("weight_decay", 0.0, 0.5),
                  loom::HpParam::int_uniform("gradient_accumulation_steps", 1, 3),
                  loom::HpParam::choice("lr_scheduler_type", {"linear", "cosine", "constant"})};
  search.n_trials = 12;
  search.seed = 3;
  auto draws = [&](uint64_t seed) {
    search.seed = seed;
    loom::detail::HpSearchRun run(args, search);
    std::vector<std::map<std::string, std::string>> out;
    for (int64_t n = 0; n < run.n_trials(); ++n) {
      const loom::TrainingArguments a = run.begin_trial(n);
      CHECK(a.learning_rate >= 1e-4);
      CHECK(a.learning_rate <= 1e-1);
      CHECK(a.weight_decay >= 0.0);
      CHECK(a.weight_decay <= 0.5);
      CHECK(a.gradient_accumulation_steps >= 1);
      CHECK(a.gradient_accumulation_steps <= 3);
      CHECK(std::to_string(a.gradient_accumulation_steps) == run.current().hyperparameters.at("gradient_accumulation_steps"));
      out.push_back(run.current().hyperparameters);
    }
    return out;
  };
  const auto first = draws(3), again = draws(3), other = draws(4);
  CHECK(first == again);
  CHECK(first != other);
  // Twelve draws spread over the space: several distinct scheduler names and step counts.
  std::set<std::string> schedules, accumulations;
  for (const auto& h : first) {
    schedules.insert(h.at("lr_scheduler_type"));
    accumulations.insert(h.at("gradient_accumulation_steps"));
  }
  CHECK(schedules.size() >= 2);
  CHECK(accumulations.size() >= 2);
}

TEST_CASE("maximize with HF's default objective: the sum of the metrics other than the loss") {
  CHECK(loom::default_compute_objective({{"eval_loss", 0.5}, {"epoch", 2.0}, {"eval_runtime", 1.5},
                                         {"eval_samples_per_second", 40.0}, {"eval_steps_per_second", 4.0}}) == 0.5);
  CHECK(loom::default_compute_objective({{"eval_loss", 0.5}, {"eval_accuracy", 0.75}, {"eval_f1", 0.125},
                                         {"epoch", 2.0}}) == 0.875);

  auto args = search_args("hp/maximize");
  loom::HpSearch search;
  search.space = {loom::HpParam::choice("learning_rate", {"0.3", "1e-5"})};
  search.sampler = "grid";
  search.direction = "maximize";
  search.pruner = "none";
  const auto best = loom::hyperparameter_search<Trainer>(args, search, model_init, train_data, eval_data);
  REQUIRE(best.run_summary.size() == 2);
  for (const auto& t : best.run_summary) REQUIRE(t.objective.has_value());
  // The objective is eval_accuracy (Classifier reports it): the best run has the higher one.
  CHECK(best.objective == std::max(*best.run_summary[0].objective, *best.run_summary[1].objective));
  CHECK(best.objective <= 1.0);
  CHECK(best.run_id == "0");
}

TEST_CASE("the median pruner stops a trial worse than the completed ones at the same step") {
  auto args = search_args("hp/prune");
  loom::HpSearch search;
  search.space = {loom::HpParam::choice("learning_rate", {"0.3", "1e-7"})};
  search.sampler = "grid";
  search.direction = "maximize";  // the objective is eval_accuracy
  search.n_startup_trials = 1;
  const auto best = loom::hyperparameter_search<Trainer>(args, search, model_init, train_data, eval_data);
  REQUIRE(best.run_summary.size() == 2);
  CHECK_FALSE(best.run_summary[0].pruned);
  CHECK(best.run_summary[0].global_step == 6);
  // 1e-7 barely moves the weights: its accuracy at step 2 is below trial 0's, so it stops there.
  CHECK(best.run_summary[1].pruned);
  CHECK(best.run_summary[1].global_step == 2);
  CHECK(best.run_id == "0");

  // Without the pruner (or before n_warmup_steps) both run to the end.
  search.n_warmup_steps = 100;
  const auto unpruned = loom::hyperparameter_search<Trainer>(args, search, model_init, train_data, eval_data);
  CHECK_FALSE(unpruned.run_summary[1].pruned);
  CHECK(unpruned.run_summary[1].global_step == 6);
}

TEST_CASE("a bad search is a loom: error before any trial trains") {
  const auto args = search_args("hp/errors");
  auto error = [&](loom::HpSearch s) {
    return loom_test::error_of([&] { loom::detail::HpSearchRun run(args, std::move(s)); });
  };
  loom::HpSearch s;
  s.space = {loom::HpParam::choice("learnig_rate", {"0.1"})};
  CHECK(error(s).find("loom: hyperparameter_search: the search space: unknown argument --learnig_rate") == 0);
  CHECK(error(s).find("learning_rate") != std::string::npos);  // the nearest name
  s.space = {loom::HpParam::choice("learning_rate", {"fast"})};
  CHECK(error(s).find("--learning_rate expects a number, got 'fast'") != std::string::npos);
  s.space = {loom::HpParam::log_uniform("learning_rate", 0.0, 1.0)};
  CHECK(error(s) == "loom: hyperparameter_search: 'learning_rate' is log-uniform and needs low > 0, got 0");
  s.space = {loom::HpParam::uniform("learning_rate", 1e-3, 1e-1)};
  s.sampler = "grid";
  CHECK(error(s).find("the grid sampler needs choices or an integer range for 'learning_rate'") != std::string::npos);
  s.sampler = "bayes";
  CHECK(error(s) == "loom: hyperparameter_search: sampler must be \"random\" or \"grid\", got \"bayes\"");
  s.sampler = "random";
  s.direction = "down";
  CHECK(error(s).find("direction must be \"minimize\" or \"maximize\"") != std::string::npos);
  s.direction = "minimize";
  s.space = {loom::HpParam::choice("output_dir", {"x"})};
  CHECK(error(s).find("output_dir cannot be searched") != std::string::npos);
  s.space = {};
  CHECK(error(s) == "loom: hyperparameter_search: the search space is empty");
}

}  // namespace trainer_test_hyperparameter_search
