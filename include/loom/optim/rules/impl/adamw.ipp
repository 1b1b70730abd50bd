#pragma once
// Definitions of optim/rules/adamw.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/rules/adamw.hpp>

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <vector>

namespace loom::optim {

LOOM_INLINE void AdamW::read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs&) {
  o.beta1 = args.adam_beta1;
  o.beta2 = args.adam_beta2;
  o.eps = args.adam_epsilon;
}

LOOM_INLINE ParamState AdamW::initial_state(const torch::Tensor& p, const OptimizerOptions&) {
  return {{"exp_avg", zeros_like_param(p)}, {"exp_avg_sq", zeros_like_param(p)}, {"step", step_count(p)}};
}

LOOM_INLINE void AdamWFused::step(GroupStep& s) {
  const auto& o = s.options;
  std::optional<torch::Tensor> inf;
  if (s.found_inf.defined()) inf = s.found_inf.reshape({});
  auto m = s.state_of("exp_avg"), v = s.state_of("exp_avg_sq");
  at::_fused_adamw_(s.params, s.grads, m, v, /*max_exp_avg_sqs=*/{}, s.steps, s.lr, o.beta1, o.beta2, s.weight_decay,
                    o.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/inf);
  // As torch.optim.AdamW(fused=True): a skipped step does not count.
  if (inf) at::_foreach_sub_(s.steps, std::vector<torch::Tensor>(s.steps.size(), *inf));
}

LOOM_INLINE void AdamWForeach::step(GroupStep& s) {
  // torch.optim.AdamW's multi-tensor path, with a host step count.
  const auto& o = s.options;
  const double lr = s.lr, wd = s.weight_decay, t = static_cast<double>(s.t);
  auto m = s.state_of("exp_avg"), v = s.state_of("exp_avg_sq");
  if (wd != 0.0) at::_foreach_mul_(s.params, 1.0 - lr * wd);
  at::_foreach_lerp_(m, s.grads, 1.0 - o.beta1);
  at::_foreach_mul_(v, o.beta2);
  at::_foreach_addcmul_(v, s.grads, s.grads, 1.0 - o.beta2);
  const double bias1 = 1.0 - std::pow(o.beta1, t);
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
  auto denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, bias2_sqrt);
  at::_foreach_add_(denom, o.eps);
  at::_foreach_addcdiv_(s.params, m, denom, -lr / bias1);
}

}  // namespace loom::optim
