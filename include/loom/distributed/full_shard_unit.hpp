#pragma once
// loom::FullShardUnit<Block>: marks a block as one FullShard unit (distributed/full_shard.hpp
// describes the engine). Name-transparent: the block's parameters, buffers and children are
// registered under the wrapper, so parameter names are the same with or without it, and
// under any other sharding policy it only forwards. This header is what a model includes;
// it knows the engine only through UnitRuntime. A unit is also Recomputable: its switch
// (off by default) turns on gradient checkpointing for the block.

#include <loom/core/error.hpp>
#include <loom/distributed/checkpointed.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace loom::dist {

namespace detail {
/// "loom::models::LlamaDecoderLayerImpl" -> "LlamaDecoderLayer": the last name of a demangled
/// type, without template arguments or an Impl suffix (HF's class names).
inline std::string class_name(std::string full) {
  if (const auto angle = full.find('<'); angle != std::string::npos) full.resize(angle);
  if (const auto colon = full.rfind("::"); colon != std::string::npos) full.erase(0, colon + 2);
  if (full.size() > 4 && full.ends_with("Impl")) full.resize(full.size() - 4);
  return full;
}
}  // namespace detail

/// What the FullShard engine does around a unit's forward (the wrapper calls it).
class UnitRuntime {
 public:
  virtual ~UnitRuntime() = default;
  virtual void pre_forward(int unit) = 0;
  /// Each tensor argument of the unit's forward, after pre_forward: the engine may hook its
  /// gradient (the end of the unit's backward).
  virtual void watch_input(int unit, const torch::Tensor& input) = 0;
  /// The unit's outputs: the engine hooks each that requires grad (the start of the unit's
  /// backward) and releases the parameters.
  virtual void post_forward(int unit, const std::vector<torch::Tensor>& outputs) = 0;
};

/// The non-template part of every FullShardUnit, found by the engine with dynamic_cast.
class FullShardUnitBase {
 public:
  virtual ~FullShardUnitBase() = default;
  /// The wrapped block's class name without namespaces or an Impl suffix ("LlamaDecoderLayer",
  /// "Linear"), or the HF class name the block gives (`hf_class_name()`: "Qwen3DecoderLayer"):
  /// what --fsdp_transformer_layer_cls_to_wrap names.
  [[nodiscard]] virtual std::string block_class() const = 0;
  /// The wrapped block (whose parameters the wrapper registers as its own).
  [[nodiscard]] virtual const torch::nn::Module& block() const = 0;
  UnitRuntime* loom_runtime = nullptr;  ///< set while a FullShard engine owns the unit
  int loom_unit = -1;                   ///< the unit's index in that engine
};

/// A block sharded as one unit under FullShard; `Inner` is a torch module holder. Its
/// activations are recomputed in backward once enable_gradient_checkpointing switched it on
/// (distributed/checkpointed.hpp).
template <class Inner>
class FullShardUnitImpl : public detail::TransparentWrapper<Inner>, public FullShardUnitBase {
 public:
  explicit FullShardUnitImpl(Inner inner) : detail::TransparentWrapper<Inner>(std::move(inner)) {}
  [[nodiscard]] const torch::nn::Module& block() const override { return *this->inner().ptr(); }
  [[nodiscard]] std::string block_class() const override {
    // A block that serves several HF classes (the Llama architecture's families) names its own.
    if constexpr (requires(const typename Inner::ContainedType& b) { std::string(b.hf_class_name()); })
      return std::string(this->inner()->hf_class_name());
    else return detail::class_name(c10::demangle(typeid(typename Inner::ContainedType).name()));
  }
  /// The block's forward, with the unit's parameters gathered around it under FullShard.
  template <class... Args>
  auto forward(Args&&... args) {
    using R = decltype(this->inner()->forward(std::forward<Args>(args)...));
    if constexpr (std::is_same_v<R, torch::Tensor>) {
      if (loom_runtime == nullptr) return this->run_block(std::forward<Args>(args)...);
      // Recomputed, the block runs again in backward after the engine's pre-backward hook
      // (registered on the output by post_forward) gathered the parameters again.
      loom_runtime->pre_forward(loom_unit);
      (
          [&] {
            if constexpr (detail::is_tensor_v<Args>) loom_runtime->watch_input(loom_unit, args);
          }(),
          ...);
      auto out = this->run_block(std::forward<Args>(args)...);
      loom_runtime->post_forward(loom_unit, {out});
      return out;
    } else {
      static_assert(std::is_same_v<R, torch::Tensor>,
                    "loom: a FullShardUnit's block must return one torch::Tensor from forward");
    }
  }
  /// `fn()` with the unit's parameters gathered under FullShard, for code that reads the
  /// block's parameters itself instead of calling its forward (an LM head inside a fused loss):
  /// `inputs` are the tensors fn computes from, `outputs(result)` the tensors backward reaches
  /// the unit through. Under any other policy, or when the unit is not chosen, only fn().
  template <class Fn, class Outputs>
  auto scope(const std::vector<torch::Tensor>& inputs, Fn&& fn, Outputs&& outputs) {
    if (loom_runtime == nullptr) return fn();
    loom_runtime->pre_forward(loom_unit);
    for (const auto& x : inputs) loom_runtime->watch_input(loom_unit, x);
    auto result = fn();
    loom_runtime->post_forward(loom_unit, outputs(result));
    return result;
  }
};

/// A FullShardUnit of a model and whether the wrap policy makes it a unit.
struct UnitCandidate {
  std::string name;            ///< its module name in the model
  FullShardUnitBase* wrapper;  ///< the unit's runtime side
  torch::nn::Module* module;   ///< the wrapper as a module
  bool chosen = false;         ///< a unit under the policy (else it only forwards)
};

/// The FullShardUnits of `module` in pre-order (a unit before the units inside it), each
/// chosen by HF's auto-wrap policies: by the wrapped block's class (`wrap_classes`,
/// transformer_layer_cls_to_wrap; a class no unit wraps is a loom::Error), or by size
/// (`min_num_params` > 0, size_based_auto_wrap_policy: innermost first, a unit whose parameters
/// outside the units chosen inside it reach it); without either, every one. Each parameter
/// belongs to the innermost chosen unit around it.
inline std::vector<UnitCandidate> unit_candidates(const torch::nn::Module& module, const std::vector<std::string>& wrap_classes,
                                                  int64_t min_num_params) {
  std::vector<UnitCandidate> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true))
    if (auto* w = dynamic_cast<FullShardUnitBase*>(item.value().get()))
      out.push_back({item.key(), w, item.value().get(), wrap_classes.empty() && min_num_params == 0});
  if (!wrap_classes.empty()) {
    std::set<std::string> seen;
    for (auto& c : out) {
      const auto cls = c.wrapper->block_class();
      seen.insert(cls);
      c.chosen = std::find(wrap_classes.begin(), wrap_classes.end(), cls) != wrap_classes.end();
    }
    std::string known;
    for (const auto& s : seen) known += (known.empty() ? "" : ", ") + s;
    for (const auto& cls : wrap_classes)
      check(seen.contains(cls), "--fsdp_transformer_layer_cls_to_wrap {}: no FullShardUnit of the model wraps a {} "
            "(the units wrap: {})", cls, cls, known.empty() ? std::string("none") : known);
  } else if (min_num_params > 0) {
    std::set<const void*> claimed;  // parameters of the units chosen so far (inner ones first)
    for (std::size_t i = out.size(); i-- > 0;) {
      int64_t own = 0;
      const auto params = out[i].module->parameters(true);
      for (const auto& p : params)
        if (!claimed.contains(p.unsafeGetTensorImpl())) own += p.numel();
      if (own < min_num_params) continue;
      out[i].chosen = true;
      for (const auto& p : params) claimed.insert(p.unsafeGetTensorImpl());
    }
  }
  return out;
}

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
