#pragma once
// Definitions of optim/rules/adagrad.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/rules/adagrad.hpp>

#include <torch/torch.h>

namespace loom::optim {

LOOM_INLINE void Adagrad::read_args(OptimizerOptions& o, const TrainingArguments&, const OptimArgs& optim_args) {
  o.eps = 1e-10;
  for (const auto& [key, v] : optim_args) {
    if (key == "lr_decay") o.lr_decay = v;
    else if (key == "initial_accumulator_value") o.initial_accumulator_value = v;
    else if (key == "eps") o.eps = v;
  }
}

LOOM_INLINE ParamState Adagrad::initial_state(const torch::Tensor& p, const OptimizerOptions& o) {
  return {{"sum", torch::full_like(p, o.initial_accumulator_value)}, {"step", step_count(p)}};
}

LOOM_INLINE void Adagrad::step(GroupStep& s) {
  // torch.optim.Adagrad: clr = lr / (1 + (step - 1) * lr_decay), the step counted on the host.
  const auto& o = s.options;
  const double t = static_cast<double>(s.t);
  auto& grads = s.grads;
  auto sums = s.state_of("sum");
  if (s.weight_decay != 0.0) grads = at::_foreach_add(grads, s.params, s.weight_decay);
  at::_foreach_addcmul_(sums, grads, grads, 1.0);
  auto std_ = at::_foreach_sqrt(sums);
  at::_foreach_add_(std_, o.eps);
  at::_foreach_addcdiv_(s.params, grads, std_, -s.lr / (1.0 + (t - 1.0) * o.lr_decay));
}

}  // namespace loom::optim
