#pragma once
// Definitions of optim/rules/lion.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/rules/lion.hpp>

#include <torch/torch.h>

namespace loom::optim {

LOOM_INLINE void Lion::read_args(OptimizerOptions& o, const TrainingArguments&, const OptimArgs& optim_args) {
  o.beta2 = 0.99;
  for (const auto& [key, v] : optim_args) {
    if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
  }
}

LOOM_INLINE ParamState Lion::initial_state(const torch::Tensor& p, const OptimizerOptions&) {
  return {{"exp_avg", zeros_like_param(p)}};
}

LOOM_INLINE void Lion::step(GroupStep& s) {
  // Lion: decoupled decay, then a step of size lr along the sign of the interpolated moment.
  const auto& o = s.options;
  const double lr = s.lr, wd = s.weight_decay;
  auto m = s.state_of("exp_avg");
  if (wd != 0.0) at::_foreach_mul_(s.params, 1.0 - lr * wd);
  auto update = at::_foreach_lerp(m, s.grads, 1.0 - o.beta1);
  at::_foreach_sign_(update);
  at::_foreach_add_(s.params, update, -lr);
  at::_foreach_lerp_(m, s.grads, 1.0 - o.beta2);
}

}  // namespace loom::optim
