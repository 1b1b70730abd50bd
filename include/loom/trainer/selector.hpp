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
//
// The same choice at run time instead, with one instantiation (the examples' way, and the
// cheaper build): name loom::sharding::FromArgs and loom::precision::FromArgs in the
// Trainer's type. select_policies suits code that must know the policies as types (a
// benchmark per combination, a test that compares them).

#include <loom/accelerate/startup.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/launcher_configs.hpp>
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

namespace detail {
// Calls g.template operator()<Tag>() for the member of Catalog called `name` and returns its
// result by value (each member's call returns the type the first one's does; returning a
// reference into the local optional would dangle). `unknown`, which must throw, runs when no
// member has that name.
template <class Catalog, class G, class Unknown>
decltype(auto) call_member(std::string_view name, G& g, Unknown&& unknown) {
  using Result = decltype(g.template operator()<std::tuple_element_t<0, Catalog>>());
  if constexpr (std::is_void_v<Result>) {
    if (!visit_member<Catalog>(name, [&]<class Tag>() { g.template operator()<Tag>(); })) unknown();
  } else {
    std::optional<Result> result;
    if (!visit_member<Catalog>(name, [&]<class Tag>() { result.emplace(g.template operator()<Tag>()); })) unknown();
    return Result(std::move(*result));
  }
}
}  // namespace detail

/// Calls `f.template operator()<Precision>()` with the precision tag the arguments name.
template <class F>
decltype(auto) select_precision(const TrainingArguments& args, F&& f) {
  const std::string_view chosen = detail::precision_member_chosen(args);
  return detail::call_member<PrecisionCatalog>(chosen, f, [&] { fail("no precision policy is called {}", chosen); });
}

/// Calls `f.template operator()<Sharding, Precision>()` with the tags the arguments name.
template <class F>
decltype(auto) select_policies(const TrainingArguments& args, F&& f) {
  const std::string s = resolved_sharding(args);
  auto with_sharding = [&]<class Sharding>() -> decltype(auto) {
    return select_precision(args, [&]<class Precision>() -> decltype(auto) {
      return std::forward<F>(f).template operator()<Sharding, Precision>();
    });
  };
  return detail::call_member<ShardingCatalog>(s, with_sharding, [&] {
    fail("--sharding {} is not one of {}|{}", s, joined_names<ShardingCatalog>("|"), detail::kAutoSharding);
  });
}

}  // namespace loom
