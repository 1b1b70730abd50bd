// The catalogs (policy/tags.hpp): each family's names come from one list, and each sharding,
// precision and optimizer name is written once under include/ (its catalog entry); every
// other place reads the catalog. Also what validation, --help and the selector read from it.
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/distributed/no_shard.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/trainer/selector.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace policy_test_catalog {

// Every `"name"` literal under include/loom, counted per name.
std::map<std::string, std::vector<std::string>> places_of(const std::vector<std::string_view>& names) {
  std::map<std::string, std::vector<std::string>> places;
  const auto root = loom_test::source_dir() / "include" / "loom";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".ipp")) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string body = text.str();
    for (std::string_view name : names) {
      const std::string quoted = "\"" + std::string(name) + "\"";
      for (auto at = body.find(quoted); at != std::string::npos; at = body.find(quoted, at + 1))
        places[std::string(name)].push_back(std::filesystem::relative(entry.path(), root).string());
    }
  }
  return places;
}

TEST_CASE("each sharding, precision and optimizer name is written once under include/") {
  std::vector<std::string_view> names;
  auto add = [&](const auto& list) { names.insert(names.end(), list.begin(), list.end()); };
  add(loom::catalog_names<loom::ShardingCatalog>);
  add(loom::catalog_names<loom::PrecisionCatalog>);
  add(loom::catalog_names<loom::OptimizerCatalog>);
  // NoShard's "no" is also a value of --eval_strategy, --save_strategy and friends, which are
  // no policies: its own entry is counted apart below.
  std::erase(names, loom::sharding::NoShard::name);
  REQUIRE(names.size() == 4 + 3 + 7);
  const auto places = places_of(names);
  for (std::string_view name : names) {
    INFO("name \"" << name << "\"");
    const auto it = places.find(std::string(name));
    REQUIRE(it != places.end());
    CHECK(it->second == std::vector<std::string>{"policy/tags.hpp"});
  }
  // "no" as a sharding name: in none of the files that choose or run a sharding policy (the
  // others compare other flags with "no": --eval_strategy, --include_num_input_tokens_seen).
  const auto no = places_of({loom::sharding::NoShard::name});
  if (no.contains("no"))
    for (const auto& file : no.at("no")) {
      INFO(file);
      CHECK(file.rfind("distributed/", 0) != 0);
      CHECK(file != "trainer/selector.hpp");
      CHECK(file != "accelerate/accelerator.hpp");
      CHECK(file != "accelerate/impl/accelerator.ipp");
    }
}

TEST_CASE("validation, --help and the selector read the catalogs") {
  CHECK(loom::joined_names<loom::ShardingCatalog>("|") == "no|ddp|zero1|zero2|full_shard");
  CHECK(loom::joined_names<loom::OptimizerCatalog>("|") == "adamw_torch_fused|adamw_torch|adafactor|sgd|adagrad|rmsprop|lion");
  CHECK(loom::catalog_names<loom::ScheduleCatalog>.size() == 14);
  CHECK(std::vector<std::string_view>(loom::detail::kShardings.begin(), loom::detail::kShardings.end()) ==
        std::vector<std::string_view>{"no", "ddp", "zero1", "zero2", "full_shard", "auto"});
  // --help's text for --sharding and --optim is made from the catalogs.
  std::string sharding_help, optim_help;
  for (const auto& h : loom::field_help(loom::HelpFor<loom::TrainingArguments>{})) {
    if (h.name == "sharding") sharding_help = h.help;
    if (h.name == "optim") optim_help = h.help;
  }
  CHECK(sharding_help.rfind("auto | no | ddp | zero1 | zero2 | full_shard (", 0) == 0);
  CHECK(optim_help == "adamw_torch_fused | adamw_torch | adafactor | sgd | adagrad | rmsprop | lion");
  // The selector picks each member by its name.
  loom::TrainingArguments args;
  loom::for_each_member<loom::ShardingCatalog>([&]<class Tag>() {
    args.sharding = std::string(Tag::name);
    CHECK(loom::select_policies(args, []<class S, class P>() { return std::string(S::name); }) == Tag::name);
  });
  args.sharding = "zero4";
  CHECK_THROWS_WITH_AS(loom::select_policies(args, []<class S, class P>() { return 0; }),
                       "loom: --sharding zero4 is not one of no|ddp|zero1|zero2|full_shard|auto", loom::Error);
}

TEST_CASE("a catalog's facts say what each policy shards") {
  using namespace loom::sharding;
  CHECK(!NoShard::facts.uses_comm);
  CHECK((DDP::facts.replicates_model && !DDP::facts.shards_optimizer_state));
  CHECK((ZeRO1::facts.shards_optimizer_state && !ZeRO1::facts.shards_gradients));
  CHECK((ZeRO2::facts.shards_gradients && !ZeRO2::facts.shards_parameters && ZeRO2::facts.replicates_model));
  CHECK((FullShard::facts.shards_parameters && !FullShard::facts.replicates_model));
  CHECK(loom::precision::FP16::facts.scales_loss);
  CHECK(!loom::precision::FP32::facts.has_flag);
  CHECK(loom::in_catalog<loom::ShardingCatalog, ZeRO2>);
  CHECK(!loom::in_catalog<loom::ShardingCatalog, loom::precision::BF16>);
}

TEST_CASE("refusals and the schedule rules read the catalogs' facts, not written-out names") {
  using loom::ShardingFacts;
  const auto sharded_optimizer = [](const ShardingFacts& f) { return f.shards_optimizer_state; };
  CHECK(loom::names_where<loom::ShardingCatalog>(sharded_optimizer) == "zero1, zero2 or full_shard");
  CHECK(loom::names_where<loom::ShardingCatalog>([](const ShardingFacts& f) { return f.uses_comm; }, "|", "|") ==
        "ddp|zero1|zero2|full_shard");
  CHECK(loom::names_where<loom::ShardingCatalog>([](const ShardingFacts& f) { return f.shards_parameters; }) ==
        "full_shard");
  CHECK(loom::names_where<loom::ShardingCatalog>([](const ShardingFacts&) { return false; }).empty());
  // A policy's refusal names the members that would do, as the catalog lists them.
  loom::TrainingArguments args;
  args.offload_optimizer = true;
  std::string refusal;
  try {
    loom::dist::ShardingImpl<loom::sharding::NoShard>::can_implement(args, loom::dist::World{});
  } catch (const loom::Error& e) {
    refusal = e.what();
  }
  CHECK(refusal.find("use --sharding " + loom::names_where<loom::ShardingCatalog>(sharded_optimizer) +
                     " (any of them also at one process)") != std::string::npos);
  // reduce_lr_on_plateau's tag says it steps on a metric: validation and finalize() read that.
  CHECK(loom::schedule_steps_on_metric(loom::schedule::ReduceLROnPlateau::name));
  CHECK_FALSE(loom::schedule_steps_on_metric(loom::schedule::Cosine::name));
  CHECK_FALSE(loom::schedule_steps_on_metric("not_a_schedule"));
}

}  // namespace policy_test_catalog
