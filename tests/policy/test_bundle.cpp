// Policy bundle: order independence and defaults (compile-time facts, checked at run time
// so the test reports them). Rejections are in tests/compile_fail/.
#include <loom/policy/bundle.hpp>

#include <doctest/doctest.h>

#include <type_traits>

namespace {
struct Cb {};
}  // namespace

TEST_CASE("families not named get their defaults") {
  using B = loom::PolicyBundle<>;
  CHECK(std::is_same_v<B::sharding, loom::sharding::NoShard>);
  CHECK(std::is_same_v<B::precision, loom::precision::FP32>);
  CHECK(std::is_same_v<B::schedule, loom::schedule::FromArgs>);
  CHECK(std::is_same_v<B::callbacks, loom::Callbacks<>>);
}

TEST_CASE("policies are order-independent") {
  using A = loom::PolicyBundle<loom::schedule::Cosine, loom::Callbacks<Cb>, loom::precision::FP32>;
  using B = loom::PolicyBundle<loom::precision::FP32, loom::schedule::Cosine, loom::Callbacks<Cb>>;
  CHECK(std::is_same_v<A::schedule, B::schedule>);
  CHECK(std::is_same_v<A::schedule, loom::schedule::Cosine>);
  CHECK(std::is_same_v<A::callbacks, loom::Callbacks<Cb>>);
  CHECK(std::is_same_v<A::callbacks, B::callbacks>);
  CHECK(std::is_same_v<A::sharding, loom::sharding::NoShard>);
}

TEST_CASE("the Policy concept accepts tags and rejects other types") {
  CHECK(loom::Policy<loom::schedule::Linear>);
  CHECK(loom::Policy<loom::Callbacks<>>);
  CHECK_FALSE(loom::Policy<int>);
  CHECK_FALSE(loom::Policy<Cb>);
}
