#pragma once
// Definitions of models/activations.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/activations.hpp>

#include <torch/torch.h>

#include <cmath>
#include <numbers>
#include <string_view>
#include <utility>

namespace loom::models {

namespace detail {

// HF's NewGELUActivation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), operation by
// operation in Python's order of evaluation: x feeds three operations, and autograd sums
// their gradients in the reverse of that order, so another order gives other rounding (C++
// leaves the order of operands unspecified, hence one statement each).
LOOM_INLINE torch::Tensor gelu_new(const torch::Tensor& x) {
  auto half = 0.5 * x;
  auto inner = x + 0.044715 * torch::pow(x, 3.0);
  auto t = torch::tanh(std::sqrt(2.0 / std::numbers::pi) * inner);
  return half * (1.0 + t);
}

// ACT2FN's entries that loom supports, in known_activations' order.
inline constexpr std::pair<std::string_view, ActivationFn> activation_table[] = {
    {"gelu", [](const torch::Tensor& x) { return torch::gelu(x); }},
    {"gelu_new", &gelu_new},
    {"gelu_pytorch_tanh", [](const torch::Tensor& x) { return torch::gelu(x, "tanh"); }},
    {"relu", [](const torch::Tensor& x) { return torch::relu(x); }},
    {"silu", [](const torch::Tensor& x) { return torch::silu(x); }},
    {"swish", [](const torch::Tensor& x) { return torch::silu(x); }},
};

}  // namespace detail

LOOM_INLINE bool is_known_activation(std::string_view name) {
  for (const auto& [known, fn] : detail::activation_table)
    if (known == name) return true;
  return false;
}

LOOM_INLINE ActivationFn activation_fn(std::string_view name) {
  for (const auto& [known, fn] : detail::activation_table)
    if (known == name) return fn;
  fail("unknown activation \"{}\" (known: {})", name, known_activations);
}

LOOM_INLINE torch::Tensor activation(std::string_view name, const torch::Tensor& x) { return activation_fn(name)(x); }

}  // namespace loom::models
