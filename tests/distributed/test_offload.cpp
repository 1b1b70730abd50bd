// --offload_optimizer's start-up checks: each sharding policy answers in its own can_implement.
#include <doctest/doctest.h>

#include <loom/distributed/engine.hpp>
#include <loom/policy/tags.hpp>

#include <string>
#include <string_view>

namespace offload_test {

// The loom: line check_sharding gives for policy `name` with --offload_optimizer, "" when none.
std::string refusal(std::string_view name, int world_size) {
  loom::TrainingArguments args;
  args.offload_optimizer = true;
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
