// --offload_optimizer's and --offload_param's start-up checks: each sharding policy answers in
// its own can_implement; validate() checks that the two come together.
#include <doctest/doctest.h>

#include <loom/config/validate.hpp>

#include <loom/distributed/engine.hpp>
#include <loom/policy/tags.hpp>

#include <string>
#include <string_view>

namespace offload_test {

// The loom: line check_sharding gives for policy `name` with --offload_optimizer (and
// --offload_param), "" when none.
std::string refusal(std::string_view name, int world_size, bool offload_param = false) {
  loom::TrainingArguments args;
  args.offload_optimizer = true;
  args.offload_param = offload_param;
  loom::dist::World world;
  world.size = world_size;
  try {
    loom::dist::check_sharding(name, args, world);
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace offload_test

TEST_CASE("--offload_optimizer runs under the policies with a sharded optimizer and is refused under the others") {
  using offload_test::refusal;
  for (const auto name : {loom::sharding::ZeRO1::name, loom::sharding::ZeRO2::name, loom::sharding::FullShard::name}) {
    CAPTURE(name);
    CHECK(refusal(name, 1).empty());
    CHECK(refusal(name, 2).empty());
  }
  const auto ddp = refusal(loom::sharding::DDP::name, 2);
  CHECK(ddp.rfind("loom: --offload_optimizer needs a sharded optimizer, and --sharding ddp keeps the whole optimizer", 0) == 0);
  const auto no = refusal(loom::sharding::NoShard::name, 1);
  CHECK(no.rfind("loom: --offload_optimizer needs a sharded optimizer, and --sharding no has none", 0) == 0);
}

TEST_CASE("--offload_param runs under FullShard only, and with --offload_optimizer") {
  using offload_test::refusal;
  CHECK(refusal(loom::sharding::FullShard::name, 1, true).empty());
  CHECK(refusal(loom::sharding::FullShard::name, 2, true).empty());
  for (const auto name : {loom::sharding::ZeRO1::name, loom::sharding::ZeRO2::name}) {
    CAPTURE(name);
    CHECK(refusal(name, 2, true).rfind("loom: --offload_param needs --sharding full_shard: under --sharding " +
                                           std::string(name) + " every rank keeps every parameter", 0) == 0);
  }
  CHECK(refusal(loom::sharding::NoShard::name, 1, true).find("--offload") != std::string::npos);
  loom::TrainingArguments args;
  args.offload_param = true;
  CHECK_THROWS_WITH_AS(loom::validate(args), doctest::Contains("loom: --offload_param keeps the parameter shards in host "
                                                               "memory, where only an offloaded optimizer can step them; "
                                                               "add --offload_optimizer"),
                       loom::Error);
  args.offload_optimizer = true;
  CHECK_NOTHROW(loom::validate(args));
}
