// The optimizer catalog (optim/catalog.hpp): each rule's --optim name selects it and round-trips
// through algorithm_from_name / algorithm_name, validate() accepts it (config/ keeps its own list
// of names for now), the checkpoint ids are the values old checkpoints hold, and what a rule
// says of flat pieces is what Optimizer::steps_pieces answers.
#include <loom/config/validate.hpp>
#include <loom/optim/catalog.hpp>
#include <loom/optim/optimizer.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

TEST_CASE("every rule of the catalog is chosen by its --optim name, in HF's order, and validate() accepts it") {
  std::vector<std::string_view> names;
  for (const auto& rule : loom::optim::kOptimizerRules) {
    INFO(rule.name);
    names.push_back(rule.name);
    CHECK(loom::optim::algorithm_from_name(rule.name) == rule.id);
    CHECK(loom::optim::algorithm_name(rule.id) == rule.name);
    loom::TrainingArguments args;
    args.optim = std::string(rule.name);
    CHECK_NOTHROW(loom::validate(args));
    const auto options = loom::optim::options_from_args(args);
    CHECK(options.algorithm == rule.id);
    loom::optim::ParamGroup group;
    group.params = {torch::zeros({2, 3}, torch::requires_grad())};
    group.names = {"w"};
    const loom::optim::Optimizer opt({group}, options);
    CHECK(opt.steps_pieces() == rule.steps_pieces);
    CHECK(opt.state_meta()["optim"] == std::string(rule.name));
  }
  CHECK(names == std::vector<std::string_view>{"adamw_torch_fused", "adamw_torch", "adafactor", "sgd", "adagrad",
                                               "rmsprop", "lion"});
  CHECK(loom_test::error_of([] { (void)loom::optim::algorithm_from_name("adam"); }) ==
        "loom: --optim 'adam' is not one of adamw_torch_fused, adamw_torch, adafactor, sgd, adagrad, rmsprop, lion");
}

TEST_CASE("the rules' checkpoint ids are the Algorithm values checkpoints were written with") {
  const std::vector<std::pair<std::string_view, int>> ids = {{"adamw_torch_fused", 0}, {"adamw_torch", 1}, {"sgd", 2},
                                                             {"adagrad", 3}, {"rmsprop", 4}, {"adafactor", 5},
                                                             {"lion", 6}};
  for (const auto& [name, id] : ids) {
    INFO(name);
    const auto* rule = loom::optim::find_rule(name);
    REQUIRE(rule != nullptr);
    CHECK(static_cast<int>(rule->id) == id);
  }
  CHECK(loom::optim::algorithm_name(static_cast<loom::optim::Algorithm>(7)) == "torch");
  CHECK(loom::optim::algorithm_name(static_cast<loom::optim::Algorithm>(99)).empty());
  loom::optim::OptimizerOptions options;
  options.algorithm = static_cast<loom::optim::Algorithm>(99);
  CHECK(loom_test::error_of([&] { loom::optim::Optimizer opt({}, options); }) ==
        "loom: OptimizerOptions::algorithm 99 is no rule of optim/catalog.hpp");
}
