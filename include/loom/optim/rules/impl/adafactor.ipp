#pragma once
// Definitions of optim/rules/adafactor.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/optim/rules/adafactor.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

namespace loom::optim {

LOOM_INLINE void Adafactor::read_args(OptimizerOptions& o, const TrainingArguments&, const OptimArgs& optim_args) {
  for (const auto& [key, v] : optim_args) {
    if (key == "beta1") o.adafactor_beta1 = v;
    else if (key == "decay_rate") o.decay_rate = v;
    else if (key == "clip_threshold") o.clip_threshold = v;
  }
}

LOOM_INLINE void Adafactor::validate(const OptimizerOptions& o, const std::vector<ParamGroup>& groups) {
  check(!(o.relative_step && std::any_of(groups.begin(), groups.end(), [](const auto& g) { return g.lr; })),
        "Adafactor's relative_step computes the learning rate; a group cannot also set its own lr (as HF)");
}

LOOM_INLINE ParamState Adafactor::initial_state(const torch::Tensor& p, const OptimizerOptions& o) {
  // HF keeps Adafactor's state in float32 (the gradient's dtype after its upcast).
  const auto f32 = p.options().dtype(torch::kFloat);
  ParamState st;
  if (o.adafactor_beta1) st.emplace_back("exp_avg", torch::zeros(p.sizes(), f32));
  if (p.dim() >= 2) {
    auto row = p.sizes().vec(), col = p.sizes().vec();
    row.pop_back();
    col.erase(col.end() - 2);
    st.emplace_back("exp_avg_sq_row", torch::zeros(row, f32));
    st.emplace_back("exp_avg_sq_col", torch::zeros(col, f32));
  } else {
    st.emplace_back("exp_avg_sq", torch::zeros(p.sizes(), f32));
  }
  st.emplace_back("step", step_count(p));
  return st;
}

LOOM_INLINE void Adafactor::step(GroupStep& s) {
  // transformers.optimization.Adafactor, one tensor at a time; the step count is the host's (the
  // "step" tensors were counted by Optimizer).
  const auto& o = s.options;
  const double wd = s.weight_decay;
  const double t = static_cast<double>(s.t);
  double rel_step = s.lr;
  if (o.relative_step) rel_step = std::min(o.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  const double beta2t = 1.0 - std::pow(t, o.decay_rate);
  auto rms = [](const torch::Tensor& x) { return x.norm(2) / std::sqrt(static_cast<double>(x.numel())); };
  for (std::size_t k = 0; k < s.slots.size(); ++k) {
    auto& st = s.state[s.slots[k]];
    auto find = [&](std::string_view kind) -> torch::Tensor& {
      for (auto& [name, tensor] : st)
        if (name == kind) return tensor;
      fail("Adafactor state {} is missing", kind);
    };
    const torch::Tensor grad = s.grads[k].to(torch::kFloat);
    const torch::Tensor& param = s.params[k];
    torch::Tensor p = param.scalar_type() == torch::kFloat ? param : param.to(torch::kFloat);
    // The step size: lr, or the relative step, times max(eps2, RMS(p)) with scale_parameter.
    torch::Tensor lr_t;
    if (o.scale_parameter) lr_t = torch::clamp_min(rms(p), o.adafactor_eps[1]) * rel_step;
    auto update = grad.square().add_(o.adafactor_eps[0]);
    if (p.dim() >= 2) {
      auto& row = find("exp_avg_sq_row");
      auto& col = find("exp_avg_sq_col");
      row.mul_(beta2t).add_(update.mean(-1), 1.0 - beta2t);
      col.mul_(beta2t).add_(update.mean(-2), 1.0 - beta2t);
      auto r = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);
      auto c = col.unsqueeze(-2).rsqrt();
      update = r.mul(c).mul_(grad);
    } else {
      auto& v = find("exp_avg_sq");
      v.mul_(beta2t).add_(update, 1.0 - beta2t);
      update = v.rsqrt().mul_(grad);
    }
    update.div_((rms(update) / o.clip_threshold).clamp_(1.0));
    if (lr_t.defined()) update.mul_(lr_t);
    else update.mul_(rel_step);
    if (o.adafactor_beta1) {
      auto& m = find("exp_avg");
      m.mul_(*o.adafactor_beta1).add_(update, 1.0 - *o.adafactor_beta1);
      update = m;
    }
    if (wd != 0.0) {
      if (lr_t.defined()) p.sub_(p * (lr_t * wd));
      else p.add_(p, -wd * rel_step);
    }
    p.sub_(update);
    if (!p.is_same(param)) param.copy_(p);
  }
}

}  // namespace loom::optim
