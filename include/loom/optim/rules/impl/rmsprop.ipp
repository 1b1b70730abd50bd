#pragma once
// Definitions of optim/rules/rmsprop.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/rules/rmsprop.hpp>

#include <torch/torch.h>

#include <vector>

namespace loom::optim {

LOOM_INLINE void RMSprop::read_args(OptimizerOptions& o, const TrainingArguments&, const OptimArgs& optim_args) {
  for (const auto& [key, v] : optim_args) {
    if (key == "momentum") o.momentum = v;
    else if (key == "alpha") o.alpha = v;
    else if (key == "eps") o.eps = v;
    else if (key == "centered") o.centered = v != 0.0;
  }
}

LOOM_INLINE ParamState RMSprop::initial_state(const torch::Tensor& p, const OptimizerOptions& o) {
  ParamState st = {{"square_avg", zeros_like_param(p)}};
  if (o.momentum > 0) st.emplace_back("momentum_buffer", zeros_like_param(p));
  if (o.centered) st.emplace_back("grad_avg", zeros_like_param(p));
  st.emplace_back("step", step_count(p));
  return st;
}

LOOM_INLINE void RMSprop::step(GroupStep& s) {
  // torch.optim.RMSprop.
  const auto& o = s.options;
  auto& grads = s.grads;
  auto square_avg = s.state_of("square_avg");
  if (s.weight_decay != 0.0) grads = at::_foreach_add(grads, s.params, s.weight_decay);
  at::_foreach_mul_(square_avg, o.alpha);
  at::_foreach_addcmul_(square_avg, grads, grads, 1.0 - o.alpha);
  std::vector<torch::Tensor> avg;
  if (o.centered) {
    auto grad_avg = s.state_of("grad_avg");
    at::_foreach_lerp_(grad_avg, grads, 1.0 - o.alpha);
    avg = at::_foreach_addcmul(square_avg, grad_avg, grad_avg, -1.0);
    at::_foreach_sqrt_(avg);
  } else {
    avg = at::_foreach_sqrt(square_avg);
  }
  at::_foreach_add_(avg, o.eps);
  if (o.momentum > 0) {
    auto bufs = s.state_of("momentum_buffer");
    at::_foreach_mul_(bufs, o.momentum);
    at::_foreach_addcdiv_(bufs, grads, avg);
    at::_foreach_add_(s.params, bufs, -s.lr);
  } else {
    at::_foreach_addcdiv_(s.params, grads, avg, -s.lr);
  }
}

}  // namespace loom::optim
