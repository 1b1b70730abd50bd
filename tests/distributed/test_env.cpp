// The launch environment (torchrun's variables) and the per-rank slices of the data order.
#include <doctest/doctest.h>

#include <loom/data/dataloader.hpp>
#include <loom/distributed/env.hpp>

#include <map>
#include <set>
#include <string>

namespace {

struct Batch {
  torch::Tensor x;
};

loom::dist::World world_of(const std::map<std::string, std::string>& env) {
  return loom::dist::world_from_env([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

const std::map<std::string, std::string> kTorchrun{{"RANK", "3"},        {"WORLD_SIZE", "4"},
                                                   {"LOCAL_RANK", "1"},  {"LOCAL_WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};

}  // namespace

TEST_CASE("no launch variables: one process") {
  const auto w = world_of({});
  CHECK(w.size == 1);
  CHECK(w.rank == 0);
  CHECK_FALSE(w.launched);
  CHECK(w.is_main());
}

TEST_CASE("torchrun's variables describe the world; the agent store and restart count are read") {
  auto env = kTorchrun;
  auto w = world_of(env);
  CHECK(w.launched);
  CHECK(w.rank == 3);
  CHECK(w.size == 4);
  CHECK(w.local_rank == 1);
  CHECK(w.local_size == 2);
  CHECK(w.master_addr == "10.0.0.1");
  CHECK(w.master_port == 29500);
  CHECK_FALSE(w.agent_store);
  CHECK_FALSE(w.is_main());
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "2";
  w = world_of(env);
  CHECK(w.agent_store);
  CHECK(w.restart_count == 2);
}

TEST_CASE("several nodes; which processes log at --log_level (HF's should_log)") {
  // Rank 3 of 4, local rank 1 of 2: node 1's second process.
  auto w = world_of(kTorchrun);
  CHECK(w.several_nodes());
  CHECK_FALSE(w.logs(true));
  CHECK_FALSE(w.logs(false));
  // Rank 2, node 1's local main: logs with log_on_each_node only.
  auto env = kTorchrun;
  env["RANK"] = "2";
  env["LOCAL_RANK"] = "0";
  w = world_of(env);
  CHECK(w.logs(true));
  CHECK_FALSE(w.logs(false));
  env["RANK"] = "0";  // rank 0 logs either way
  w = world_of(env);
  CHECK(w.logs(true));
  CHECK(w.logs(false));
  env["LOCAL_WORLD_SIZE"] = "4";  // one node of 4
  CHECK_FALSE(world_of(env).several_nodes());
  CHECK_FALSE(world_of({}).several_nodes());
}

TEST_CASE("partial or contradictory launch variables are loom: errors naming the variable") {
  auto partial = kTorchrun;
  partial.erase("MASTER_PORT");
  partial.erase("LOCAL_RANK");
  CHECK_THROWS_WITH(world_of(partial), doctest::Contains("LOCAL_RANK, MASTER_PORT missing"));
  CHECK_THROWS_WITH(world_of({{"RANK", "0"}}), doctest::Contains("loom: the launch environment is incomplete"));
  // torchrun's variables with one of them changed
  auto with = [](const std::string& name, const std::string& value) {
    auto env = kTorchrun;
    env[name] = value;
    return env;
  };
  CHECK_THROWS_WITH(world_of(with("RANK", "4")), doctest::Contains("RANK=4 is out of range [0, 3]"));
  CHECK_THROWS_WITH(world_of(with("WORLD_SIZE", "four")), doctest::Contains("WORLD_SIZE=\"four\" is not an integer"));
  CHECK_THROWS_WITH(world_of(with("MASTER_PORT", "70000")), doctest::Contains("MASTER_PORT=70000 is out of range"));
  CHECK_THROWS_WITH(world_of(with("LOCAL_RANK", "2")), doctest::Contains("LOCAL_RANK=2 is out of range [0, 1]"));
  CHECK_THROWS_WITH(world_of(with("TORCHELASTIC_USE_AGENT_STORE", "yes")), doctest::Contains("is not True or False"));
}

TEST_CASE("W ranks with batch b read, step by step, the examples one process reads with batch W*b") {
  const int64_t n = 40;
  const loom::data::AnyDataset<Batch> data(loom::data::TensorDataset<Batch>({torch::arange(n)}));
  for (int64_t world : {2, 4}) {
    const int64_t b = 3;
    loom::data::DataLoader<Batch> one(data, b * world, false, loom::data::RandomSampler{5});
    std::vector<loom::data::DataLoader<Batch>> ranks;
    for (int64_t r = 0; r < world; ++r)
      ranks.emplace_back(data, b, false, loom::data::RandomSampler{5}, loom::data::Shard{r, world});
    for (int64_t epoch : {0, 1}) {
      one.set_epoch(epoch);
      for (auto& l : ranks) {
        l.set_epoch(epoch);
        CHECK(l.size() == one.size());  // every rank the same number of steps
      }
      std::set<int64_t> seen;
      for (int64_t i = 0; i < one.size(); ++i) {
        const auto want = one.batch(i).x;
        std::vector<torch::Tensor> parts;
        for (auto& l : ranks) parts.push_back(l.batch(i).x);
        const auto got = torch::cat(parts);
        CHECK(got.size(0) == world * b);  // the last step is filled cyclically from the start
        CHECK(torch::equal(got.narrow(0, 0, want.size(0)), want));
        for (int64_t k = 0; k < got.size(0); ++k) seen.insert(got[k].item<int64_t>());
      }
      CHECK(static_cast<int64_t>(seen.size()) == n);
    }
    // drop_last keeps only steps where every rank has a full batch.
    loom::data::DataLoader<Batch> dropping(data, b, true, loom::data::RandomSampler{5}, loom::data::Shard{1, world});
    CHECK(dropping.size() == (n / b) / world);
  }
  CHECK_THROWS_WITH((loom::data::DataLoader<Batch>(data, 2, false, loom::data::RandomSampler{5},
                                                   loom::data::Shard{2, 2})),
                    doctest::Contains("bad DataLoader shard 2 of 2"));
}
