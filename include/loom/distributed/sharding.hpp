#pragma once
// ShardingImpl<Tag>: what a sharding policy of ShardingCatalog (policy/tags.hpp) runs and
// whether it can run with the given arguments and world (CUTLASS's can_implement). Each
// specialization lives in its engine's file (no_shard.hpp, bucket_engine.hpp, full_shard.hpp);
// the primary template fails loudly, and the ShardingEngine concept states what a
// specialization provides. impl/engine.ipp folds over the catalog, so these are reached only
// through make_engine / check_sharding (engine.hpp) and compile once with the engines.
//
// A new sharding policy: its tag and catalog entry in policy/tags.hpp, its engine file here
// with its ShardingImpl, and that file's #include in impl/engine.ipp.

#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>
#include <loom/policy/tags.hpp>

#include <concepts>
#include <memory>
#include <string_view>

namespace loom::dist {

// engine.hpp's types, declared: in header-only mode engine.hpp includes the engines (and so
// this file) at its end, so this file must not include it back.
class Comm;
class Engine;
struct EngineOptions;

/// Specialized per sharding tag, in its engine's file.
template <class Tag>
struct ShardingImpl {
  static_assert(dependent_false_v<Tag>, "loom: no ShardingImpl for this sharding tag; specialize it in its engine's "
                                      "file and include that file from loom/distributed/impl/engine.ipp");
};

/// What a sharding policy provides: its engine, and its own start-up checks (a loom::Error
/// when it cannot run with `args` in `world`; a warning for a flag that has no effect).
template <class S>
concept ShardingEngine = requires(std::shared_ptr<Comm> comm, const EngineOptions& options,
                                  const TrainingArguments& args, const World& world) {
  { S::make_engine(comm, options) } -> std::same_as<std::unique_ptr<Engine>>;
  S::can_implement(args, world);
};

/// A policy without FullShard's units (`policy`: its --sharding name) refuses the flags that
/// choose them: part of its can_implement.
inline void check_no_units(const TrainingArguments& args, std::string_view policy) {
  check(!args.fsdp_transformer_layer_cls_to_wrap && args.fsdp_min_num_params == 0,
        "--fsdp_transformer_layer_cls_to_wrap / --fsdp_min_num_params choose --sharding {}'s units; --sharding {} "
        "has none", sharding::FullShard::name, policy);
}

}  // namespace loom::dist
