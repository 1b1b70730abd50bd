#pragma once
// The activation functions transformers' config files name (hidden_act,
// activation_function) that loom's models support, computed as transformers computes them.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::models {

/// The names activation() knows: gelu (exact erf), gelu_new (the tanh approximation written
/// out, as HF's NewGELUActivation), gelu_pytorch_tanh, relu, silu, swish.
inline constexpr std::string_view known_activations = "gelu, gelu_new, gelu_pytorch_tanh, relu, silu, swish";

/// True when activation() knows `name`.
LOOM_INLINE bool is_known_activation(std::string_view name);

/// transformers' ACT2FN[name](x); `name` must be known.
LOOM_INLINE torch::Tensor activation(std::string_view name, const torch::Tensor& x);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/activations.ipp>
#endif
