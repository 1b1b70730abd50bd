#pragma once
// Definitions of models/activations.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/activations.hpp>

#include <torch/torch.h>

#include <cmath>
#include <numbers>
#include <string_view>

namespace loom::models {

LOOM_INLINE bool is_known_activation(std::string_view name) {
  return name == "gelu" || name == "gelu_new" || name == "gelu_pytorch_tanh" || name == "relu" || name == "silu" ||
         name == "swish";
}

LOOM_INLINE torch::Tensor activation(std::string_view name, const torch::Tensor& x) {
  if (name == "gelu") return torch::gelu(x);
  if (name == "gelu_new") {
    // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), operation by operation in Python's
    // order of evaluation: x feeds three operations, and autograd sums their gradients in the
    // reverse of that order, so another order gives other rounding (C++ leaves the order of
    // operands unspecified, hence one statement each).
    auto half = 0.5 * x;
    auto inner = x + 0.044715 * torch::pow(x, 3.0);
    auto t = torch::tanh(std::sqrt(2.0 / std::numbers::pi) * inner);
    return half * (1.0 + t);
  }
  if (name == "gelu_pytorch_tanh") return torch::gelu(x, "tanh");
  if (name == "relu") return torch::relu(x);
  check(name == "silu" || name == "swish", "unknown activation \"{}\" (known: {})", name, known_activations);
  return torch::silu(x);
}

}  // namespace loom::models
