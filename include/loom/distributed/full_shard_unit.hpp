#pragma once
// loom::FullShardUnit<Block>: marks a block as one FullShard unit (distributed/full_shard.hpp
// describes the engine). Name-transparent: the block's parameters, buffers and children are
// registered under the wrapper, so parameter names are the same with or without it, and
// under any other sharding policy it only forwards. This header is what a model includes;
// it knows the engine only through UnitRuntime.

#include <torch/torch.h>

#include <type_traits>
#include <utility>

namespace loom::dist {

/// What the FullShard engine does around a unit's forward (the wrapper calls it).
class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;
  virtual void pre_forward(int unit) = 0;
  virtual torch::Tensor post_forward(int unit, torch::Tensor out) = 0;
};

/// The non-template part of every FullShardUnit, found by the engine with dynamic_cast.
class FullShardUnitBase {
 public:
  virtual ~FullShardUnitBase() = default;
  UnitRuntime* loom_runtime = nullptr;  ///< set while a FullShard engine owns the unit
  int loom_unit = -1;                   ///< the unit's index in that engine
};

/// A block sharded as one unit under FullShard; `Inner` is a torch module holder.
template <class Inner>
class FullShardUnitImpl : public torch::nn::Module, public FullShardUnitBase {
 public:
  explicit FullShardUnitImpl(Inner inner) : inner_(std::move(inner)) {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
  }
  /// The block's forward, with the unit's parameters gathered around it under FullShard.
  template <class... Args>
  auto forward(Args&&... args) {
    using R = decltype(inner_->forward(std::forward<Args>(args)...));
    if constexpr (std::is_same_v<R, torch::Tensor>) {
      if (loom_runtime == nullptr) return inner_->forward(std::forward<Args>(args)...);
      loom_runtime->pre_forward(loom_unit);
      auto out = inner_->forward(std::forward<Args>(args)...);
      return loom_runtime->post_forward(loom_unit, std::move(out));
    } else {
      static_assert(std::is_same_v<R, torch::Tensor>,
                    "loom: a FullShardUnit's block must return one torch::Tensor from forward");
    }
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }
  /// The wrapped block.
  Inner& inner() { return inner_; }

 private:
  Inner inner_;
};

/// Module holder of FullShardUnitImpl<Inner>.
template <class Inner>
class FullShardUnit : public torch::nn::ModuleHolder<FullShardUnitImpl<Inner>> {
 public:
  using torch::nn::ModuleHolder<FullShardUnitImpl<Inner>>::ModuleHolder;
};

/// Wraps `block` as a FullShard unit.
template <class Inner>
FullShardUnit<Inner> full_shard_unit(Inner block) {
  return FullShardUnit<Inner>(std::move(block));
}

}  // namespace loom::dist

namespace loom {
using dist::full_shard_unit;
using dist::FullShardUnit;
}  // namespace loom
