#pragma once
// The runtime selector: maps command-line choices onto a fixed set of instantiations, so a
// program can pick a strategy with a flag without losing compile-time dispatch.
//
//   template <class Sharding, class Precision>
//   struct MyTrainer : loom::Trainer<MyTrainer<Sharding, Precision>, Net, Sharding, Precision> {...};
//   loom::select_policies(args, [&]<class Sharding, class Precision>() {
//     MyTrainer<Sharding, Precision> t(args, ...);
//     t.train();
//   });
//
// --sharding picks a member of ShardingCatalog by name (auto, the default: ddp when
// WORLD_SIZE > 1, else no); the precision flag that is set (--bf16, --fp16) picks its member
// of PrecisionCatalog, none the default (precision::FP32). Every combination is instantiated
// (each is a whole Trainer: a program that needs one should name its types).
// select_precision is the one-dimensional form for programs that do not shard.

#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>
#include <loom/policy/catalog.hpp>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom {

/// Calls `f.template operator()<Precision>()` with the precision tag the arguments name.
template <class F>
decltype(auto) select_precision(const TrainingArguments& args, F&& f) {
  const auto set = detail::precision_flags_set(args);
  check(set.size() <= 1, "--{} and --{} are both set; choose one", set.size() > 1 ? set[0] : "",
        set.size() > 1 ? set[1] : "");
  using Default = std::tuple_element_t<0, PrecisionCatalog>;
  const std::string_view chosen = set.empty() ? Default::facts.name : set[0];
  // Every member but the chosen one returns through the same type: the default's call.
  using Result = decltype(std::forward<F>(f).template operator()<Default>());
  if constexpr (std::is_void_v<Result>) {
    visit_member<PrecisionCatalog>(chosen, [&]<class P>() { std::forward<F>(f).template operator()<P>(); });
  } else {
    std::optional<Result> result;
    visit_member<PrecisionCatalog>(chosen, [&]<class P>() { result.emplace(std::forward<F>(f).template operator()<P>()); });
    return Result(std::move(*result));  // by value: a decltype(auto) return of *result would dangle
  }
}

/// The --sharding a program runs: `auto` (the default) is ddp when torchrun started several
/// processes (WORLD_SIZE > 1), as HF's Trainer then trains under DDP, and no otherwise.
inline std::string resolved_sharding(const TrainingArguments& args) {
  if (args.sharding != detail::kAutoSharding) return args.sharding;
  return std::string(dist::world_from_env().size > 1 ? sharding::DDP::name : sharding::NoShard::name);
}

/// Calls `f.template operator()<Sharding, Precision>()` with the tags the arguments name.
template <class F>
decltype(auto) select_policies(const TrainingArguments& args, F&& f) {
  const std::string s = resolved_sharding(args);
  using Default = std::tuple_element_t<0, ShardingCatalog>;
  auto with_sharding = [&]<class Sharding>() -> decltype(auto) {
    return select_precision(args, [&]<class Precision>() -> decltype(auto) {
      return std::forward<F>(f).template operator()<Sharding, Precision>();
    });
  };
  using Result = decltype(with_sharding.template operator()<Default>());
  auto unknown = [&] {
    fail("--sharding {} is not one of {}|{}", s, joined_names<ShardingCatalog>("|"), detail::kAutoSharding);
  };
  if constexpr (std::is_void_v<Result>) {
    if (!visit_member<ShardingCatalog>(s, [&]<class S>() { with_sharding.template operator()<S>(); })) unknown();
  } else {
    std::optional<Result> result;
    if (!visit_member<ShardingCatalog>(s, [&]<class S>() { result.emplace(with_sharding.template operator()<S>()); }))
      unknown();
    return Result(std::move(*result));  // by value: a decltype(auto) return of *result would dangle
  }
}

}  // namespace loom
