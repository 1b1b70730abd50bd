#pragma once
// The activation functions transformers' config files name (hidden_act,
// activation_function) that loom's models support, computed as transformers computes them.
// A module resolves its config's name once, in its constructor (activation_fn), and its
// forward calls the function it got.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::models {

/// The names activation_fn() knows: gelu (exact erf), gelu_new (the tanh approximation
/// written out, as HF's NewGELUActivation), gelu_pytorch_tanh, relu, silu, swish.
inline constexpr std::string_view known_activations = "gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish";

/// An activation function, x -> ACT2FN[name](x).
using ActivationFn = torch::Tensor (*)(const torch::Tensor& x);

/// True when activation_fn() knows `name` (configs check their names with it).
LOOM_INLINE bool is_known_activation(std::string_view name);

/// transformers' ACT2FN[name] as a function; an unknown `name` is a loom::Error.
LOOM_INLINE ActivationFn activation_fn(std::string_view name);

/// transformers' ACT2FN[name](x); `name` must be known. A module resolves the name once
/// with activation_fn() instead.
LOOM_INLINE torch::Tensor activation(std::string_view name, const torch::Tensor& x);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/activations.ipp>
#endif
