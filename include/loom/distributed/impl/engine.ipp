#pragma once
// make_engine and check_sharding: a fold over ShardingCatalog, the only place that includes
// every engine (each with its ShardingImpl).

#include <loom/core/error.hpp>
#include <loom/distributed/bucket_engine.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/full_shard.hpp>
#include <loom/distributed/no_shard.hpp>
#include <loom/distributed/sharding.hpp>
#include <loom/policy/catalog.hpp>

#include <map>
#include <vector>

namespace loom::dist {

namespace detail {
// Calls f.template operator()<ShardingImpl<Tag>>() for the catalog member called `name`.
template <class F>
void with_sharding_impl(std::string_view name, F&& f) {
  const bool found = visit_member<ShardingCatalog>(name, [&]<class Tag>() {
    static_assert(ShardingEngine<ShardingImpl<Tag>>,
                  "loom: a sharding policy's ShardingImpl needs make_engine(comm, options) and "
                  "can_implement(args, world)");
    f.template operator()<ShardingImpl<Tag>>();
  });
  check(found, "--sharding {} is not one of {}", name, joined_names<ShardingCatalog>("|"));
}
}  // namespace detail

namespace detail {
// The torch dtype of each ShardingDtypeCatalog member (no primary definition: a new member
// needs its own).
template <class Tag>
struct ScalarTypeOf;
template <>
struct ScalarTypeOf<sharding_dtype::Float32> {
  static constexpr torch::ScalarType value = torch::kFloat;
};
template <>
struct ScalarTypeOf<sharding_dtype::BFloat16> {
  static constexpr torch::ScalarType value = torch::kBFloat16;
};
}  // namespace detail

LOOM_INLINE torch::ScalarType sharding_dtype(std::string_view name) {
  torch::ScalarType dtype = torch::kFloat;
  const bool found = visit_member<ShardingDtypeCatalog>(name, [&]<class Tag>() { dtype = detail::ScalarTypeOf<Tag>::value; });
  check(found, "a sharding dtype must be one of {}, got '{}'", joined_names<ShardingDtypeCatalog>("|"), name);
  return dtype;
}

LOOM_INLINE std::unique_ptr<Engine> make_engine(std::string_view sharding, std::shared_ptr<Comm> comm,
                                                const EngineOptions& options) {
  std::unique_ptr<Engine> engine;
  detail::with_sharding_impl(sharding, [&]<class Impl>() { engine = Impl::make_engine(std::move(comm), options); });
  return engine;
}

LOOM_INLINE void check_sharding(std::string_view sharding, const TrainingArguments& args, const World& world) {
  detail::with_sharding_impl(sharding, [&]<class Impl>() { Impl::can_implement(args, world); });
}

LOOM_INLINE void broadcast_buffers(Comm& comm, torch::nn::Module& module) {
  std::map<c10::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& b : module.buffers(/*recurse=*/true))
    if (b.defined() && b.numel() > 0) by_dtype[b.scalar_type()].push_back(b);
  for (auto& [dtype, buffers] : by_dtype) {
    std::vector<torch::Tensor> flat;
    for (const auto& b : buffers) flat.push_back(b.detach().reshape({-1}));
    auto all = torch::cat(flat);
    comm.broadcast({all}, 0, "the buffer broadcast (ddp_broadcast_buffers)").wait();
    int64_t at = 0;
    torch::NoGradGuard no_grad;
    for (auto& b : buffers) {
      b.detach().copy_(all.narrow(0, at, b.numel()).view(b.sizes()));
      at += b.numel();
    }
  }
}

}  // namespace loom::dist
