#pragma once
// Activation recomputation, HF's --gradient_checkpointing: a recomputed block keeps only its
// inputs from the forward pass and runs its forward again during backward, so its
// intermediate activations live for one block's backward instead of the whole step.
//
// One implementation serves two name-transparent wrappers: loom::FullShardUnit<Block>
// (distributed/full_shard_unit.hpp; GPT-2's and BERT's blocks are units), whose recompute
// switch is off until enable_gradient_checkpointing turns it on, and loom::Checkpointed<Block>
// below, for a block that is no FullShard unit, which recomputes from construction. Both find
// the switch through the non-template base Recomputable.
//
// What a recomputed forward does (the semantics of torch.utils.checkpoint with
// preserve_rng_state=True; libtorch has no such module):
//   forward   the block runs under no-grad; the node keeps the tensor arguments, the state of
//             the CPU generator and of the default generator of every CUDA device among the
//             arguments, and the autocast state;
//   backward  those states are set again (and restored afterwards), the forward runs again
//             with grad on from the kept arguments (detached, requiring grad as the originals),
//             and the incoming gradient is differentiated back to the arguments and the
//             block's parameters.
// One difference from PyTorch's reentrant form: the block's parameters are inputs of the
// autograd node, so their gradients return through the outer backward and are accumulated
// once by their own AccumulateGrad (with its hooks: DDP's buckets, ZeRO-2's and FullShard's
// reduce-scatters), and they get gradients even when no argument requires grad (as in
// PyTorch's non-reentrant form). In evaluation or under no-grad the wrappers only forward.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <functional>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::dist {

/// The recompute switch of a wrapper that can recompute its block (found with dynamic_cast).
class Recomputable {
 public:
  virtual ~Recomputable() = default;
  bool loom_recompute = false;  ///< recompute the block's activations in backward
  /// enable_gradient_checkpointing passes this wrapper by (a unit around an embedding or an LM
  /// head: HF checkpoints the decoder layers only).
  bool loom_never_recompute = false;
  /// The wrapper this one wraps directly, if any: it is not in the module tree (a wrapper
  /// registers its block's members, not the block), so enable_gradient_checkpointing asks.
  virtual Recomputable* wrapped() { return nullptr; }
};

/// Switches recomputation on in every FullShardUnit and Checkpointed of `module` (itself
/// included) and returns how many; a wrapper inside a switched one is switched off, since the
/// outer recomputation already covers it. HF's gradient_checkpointing_enable.
LOOM_INLINE int enable_gradient_checkpointing(torch::nn::Module& module);
/// Switches recomputation off in every wrapper of `module` and returns how many were on.
LOOM_INLINE int disable_gradient_checkpointing(torch::nn::Module& module);

namespace detail {

/// The states a recomputation must see as the first forward saw them: the RNG states of the
/// CPU generator and the arguments' CUDA generators, and autocast per device type.
class ForwardState {
 public:
  /// The current states, for a forward whose tensor arguments are `inputs`.
  LOOM_INLINE static ForwardState capture(const std::vector<torch::Tensor>& inputs);

 private:
  struct Rng {
    c10::Device device;
    at::Tensor state;
  };
  struct Autocast {
    c10::DeviceType type;
    bool enabled;
    at::ScalarType dtype;
  };
  // The states of the default generators of `devices` (the CPU first) and of autocast.
  LOOM_INLINE static ForwardState capture_on(const std::vector<c10::Device>& devices);
  LOOM_INLINE void apply() const;
  std::vector<Rng> rng_;
  std::vector<Autocast> autocast_;
  bool autocast_cache_ = true;
  friend class Replay;
};

/// Sets the states a ForwardState captured for its lifetime, then puts back the ones it found.
class Replay {
 public:
  LOOM_INLINE explicit Replay(const ForwardState& saved);
  LOOM_INLINE ~Replay();
  Replay(const Replay&) = delete;
  Replay& operator=(const Replay&) = delete;

 private:
  ForwardState current_;
};

/// A recomputable forward: the block with its non-tensor arguments bound, the parameters it
/// differentiates, and the state to replay.
struct RecomputeCall : torch::CustomClassHolder {
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> run;  ///< the forward of the tensor arguments
  std::vector<torch::Tensor> params;                                    ///< the block's parameters
  ForwardState state;                                                   ///< set in forward
};

/// The autograd node of a recomputed forward.
struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  LOOM_INLINE static torch::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<RecomputeCall> call,
                                           at::TensorList inputs, at::TensorList params);
  LOOM_INLINE static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                              torch::autograd::variable_list grad_outputs);
};

template <class T>
inline constexpr bool is_tensor_v = std::is_same_v<std::remove_cvref_t<T>, torch::Tensor>;

// The place of a tensor argument among the defined tensor arguments (the recomputation passes
// the kept copies there; an undefined one, an optional mask, stays undefined: autograd takes
// no undefined inputs); other arguments are bound by value.
struct TensorSlot {
  static constexpr std::size_t undefined = static_cast<std::size_t>(-1);
  std::size_t index;
};
template <class T>
auto bind_argument(T&& arg, std::size_t& tensors) {
  if constexpr (is_tensor_v<T>) return TensorSlot{arg.defined() ? tensors++ : TensorSlot::undefined};
  else return std::decay_t<T>(std::forward<T>(arg));
}
inline const torch::Tensor& bound_argument(TensorSlot slot, const std::vector<torch::Tensor>& xs) {
  static const torch::Tensor none;
  return slot.index == TensorSlot::undefined ? none : xs[slot.index];
}
template <class T>
const T& bound_argument(const T& value, const std::vector<torch::Tensor>&) {
  return value;
}

/// `inner->forward(args...)`, recomputed in backward when `recompute` is on and the forward
/// records a graph.
template <class Inner, class... Args>
torch::Tensor forward_block(bool recompute, Inner& inner, Args&&... args) {
  static_assert(std::is_same_v<decltype(inner->forward(std::forward<Args>(args)...)), torch::Tensor>,
                "loom: a recomputed block must return one torch::Tensor from forward");
  if (!recompute || !torch::GradMode::is_enabled()) return inner->forward(std::forward<Args>(args)...);
  std::vector<torch::Tensor> inputs;
  (
      [&] {
        if constexpr (is_tensor_v<Args>)
          if (args.defined()) inputs.push_back(args);
      }(),
      ...);
  std::size_t tensors = 0;
  // Braced initialization binds the arguments left to right, so the slots count in order.
  auto bound = std::make_shared<std::tuple<decltype(bind_argument(std::forward<Args>(args), tensors))...>>(
      std::tuple<decltype(bind_argument(std::forward<Args>(args), tensors))...>{
          bind_argument(std::forward<Args>(args), tensors)...});
  auto call = c10::make_intrusive<RecomputeCall>();
  call->run = [inner, bound](const std::vector<torch::Tensor>& xs) mutable {
    return std::apply([&](const auto&... a) { return inner->forward(bound_argument(a, xs)...); }, *bound);
  };
  for (const auto& p : inner->parameters(/*recurse=*/true))
    if (p.requires_grad()) call->params.push_back(p);
  const std::vector<torch::Tensor> params = call->params;
  return RecomputeFunction::apply(std::move(call), at::TensorList(inputs), at::TensorList(params));
}

/// The name-transparent part of a block wrapper: the block's parameters, buffers and children
/// are registered under the wrapper, so names are the same with or without it.
template <class Inner>
class TransparentWrapper : public torch::nn::Module, public Recomputable {
 public:
  explicit TransparentWrapper(Inner inner) : inner_(std::move(inner)) {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false)) register_parameter(p.key(), p.value());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& c : inner_->named_children()) register_module(c.key(), c.value());
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }
  /// The wrapped block.
  Inner& inner() { return inner_; }
  const Inner& inner() const { return inner_; }
  /// The block, when it is itself a wrapper.
  Recomputable* wrapped() override { return dynamic_cast<Recomputable*>(inner_.ptr().get()); }

 protected:
  /// The block's forward, recomputed in backward when the switch is on and in training.
  template <class... Args>
  torch::Tensor run_block(Args&&... args) {
    return forward_block(loom_recompute && is_training(), inner_, std::forward<Args>(args)...);
  }

 private:
  Inner inner_;
};

}  // namespace detail

/// A block whose activations are recomputed in backward (on from construction; the switch is
/// `loom_recompute`); `Inner` is a torch module holder whose forward returns one tensor.
template <class Inner>
class CheckpointedImpl : public detail::TransparentWrapper<Inner> {
 public:
  explicit CheckpointedImpl(Inner inner) : detail::TransparentWrapper<Inner>(std::move(inner)) {
    this->loom_recompute = true;
  }
  /// The block's forward; in training with grad on, only its tensor arguments are kept.
  template <class... Args>
  torch::Tensor forward(Args&&... args) {
    return this->run_block(std::forward<Args>(args)...);
  }
};

/// Module holder of CheckpointedImpl<Inner>.
template <class Inner>
class Checkpointed : public torch::nn::ModuleHolder<CheckpointedImpl<Inner>> {
 public:
  using torch::nn::ModuleHolder<CheckpointedImpl<Inner>>::ModuleHolder;
};

/// Wraps `block` so that its activations are recomputed in backward.
template <class Inner>
Checkpointed<Inner> checkpointed(Inner block) {
  return Checkpointed<Inner>(std::move(block));
}

}  // namespace loom::dist

namespace loom {
using dist::Checkpointed;
using dist::checkpointed;
using dist::disable_gradient_checkpointing;
using dist::enable_gradient_checkpointing;
}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/distributed/impl/checkpointed.ipp>
#endif
