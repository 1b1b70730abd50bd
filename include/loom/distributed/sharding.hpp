#pragma once
// ShardingImpl<Tag>: what each sharding tag means to the Trainer, as compile-time facts plus
// the engine it runs (dist::Engine, made by make_engine). The primary template fails loudly;
// the ShardingEngine concept states what a specialization provides, and the Trainer asserts
// it. A new strategy adds one tag (policy/tags.hpp), one engine file here, one
// specialization below and one case in make_engine (impl/engine.ipp).

#include <loom/config/meta.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/policy/tags.hpp>

#include <concepts>

namespace loom::dist {

/// Specialized per sharding tag.
template <class Tag>
struct ShardingImpl {
  static_assert(dependent_false_v<Tag>, "loom: no ShardingImpl for this sharding tag; add a specialization "
                                      "in loom/distributed/sharding.hpp");
};

/// What the Trainer reads from a sharding policy.
template <class S>
concept ShardingEngine = requires {
  { S::kind } -> std::convertible_to<EngineKind>;         // the engine make_engine builds
  { S::uses_comm } -> std::convertible_to<bool>;          // needs a process group
  { S::owns_grads } -> std::convertible_to<bool>;         // the engine zeroes gradients (not the optimizer)
  { S::forward_is_collective } -> std::convertible_to<bool>;  // every rank must run every forward
};

template <>
struct ShardingImpl<sharding::NoShard> {
  static constexpr EngineKind kind = EngineKind::none;
  static constexpr bool uses_comm = false;
  static constexpr bool owns_grads = false;  // autograd's gradients, set to none after a step
  static constexpr bool forward_is_collective = false;
};
template <>
struct ShardingImpl<sharding::DDP> {
  static constexpr EngineKind kind = EngineKind::ddp;
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  static constexpr bool forward_is_collective = false;
};
template <>
struct ShardingImpl<sharding::ZeRO1> {
  static constexpr EngineKind kind = EngineKind::zero1;
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  static constexpr bool forward_is_collective = false;
};
template <>
struct ShardingImpl<sharding::ZeRO2> {
  static constexpr EngineKind kind = EngineKind::zero2;
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  static constexpr bool forward_is_collective = false;
};
template <>
struct ShardingImpl<sharding::FullShard> {
  static constexpr EngineKind kind = EngineKind::full_shard;
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  static constexpr bool forward_is_collective = true;  // each forward gathers parameters
};

}  // namespace loom::dist
