#pragma once
// Definitions of optim/optimizer.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

LOOM_INLINE Algorithm algorithm_from_name(std::string_view name) {
  if (name == "adamw_torch_fused") return Algorithm::adamw_fused;
  if (name == "adamw_torch") return Algorithm::adamw_foreach;
  if (name == "sgd") return Algorithm::sgd;
  throw Error("--optim '" + std::string(name) + "' is not one of adamw_torch_fused, adamw_torch, sgd");
}

LOOM_INLINE Optimizer::Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options)
    : groups_(std::move(groups)), options_(options) {
  state_.resize(groups_.size());
}

LOOM_INLINE void Optimizer::step(double lr, const torch::Tensor& found_inf) {
  if (found_inf.defined() && options_.algorithm != Algorithm::adamw_fused && found_inf.item<float>() != 0.0f) return;
  ++steps_;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    step_group(g, lr, options_.algorithm == Algorithm::adamw_fused ? found_inf : torch::Tensor());
}

LOOM_INLINE void Optimizer::zero_grad() {
  for (auto& group : groups_)
    for (auto& p : group.params) p.mutable_grad() = torch::Tensor();
}

LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    const auto& st = state_[g];
    for (std::size_t i = 0; i < st.exp_avg.size(); ++i) {
      const auto& name = groups_[g].names.at(i);
      out.emplace_back("exp_avg." + name, st.exp_avg[i]);
      out.emplace_back("exp_avg_sq." + name, st.exp_avg_sq[i]);
      out.emplace_back("step." + name, st.step[i]);
    }
  }
  return out;
}

LOOM_INLINE nlohmann::json Optimizer::state_meta() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : groups_) groups.push_back({{"weight_decay", g.weight_decay}, {"params", g.names}});
  return {{"steps", steps_}, {"betas", {options_.beta1, options_.beta2}}, {"eps", options_.eps},
          {"algorithm", static_cast<int>(options_.algorithm)}, {"param_groups", groups}};
}

LOOM_INLINE void Optimizer::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                        const nlohmann::json& meta) {
  steps_ = meta.at("steps").get<int64_t>();
  if (tensors.empty()) return;
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  std::string problems;
  torch::NoGradGuard no_grad;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    ensure_state(g);
    auto& st = state_[g];
    for (std::size_t i = 0; i < st.exp_avg.size(); ++i) {
      const auto& name = groups_[g].names.at(i);
      for (auto [key, dst] : {std::pair{"exp_avg." + name, &st.exp_avg[i]},
                              std::pair{"exp_avg_sq." + name, &st.exp_avg_sq[i]},
                              std::pair{"step." + name, &st.step[i]}}) {
        auto it = by_name.find(key);
        if (it == by_name.end()) {
          problems += (problems.empty() ? "missing " : "; missing ") + key;
        } else if (it->second.sizes() != dst->sizes()) {
          problems += (problems.empty() ? "" : "; ") + std::string("shape of ") + key + " differs";
        } else {
          dst->copy_(it->second);
          by_name.erase(it);
        }
      }
    }
  }
  for (const auto& [key, t] : by_name) problems += (problems.empty() ? "unexpected " : "; unexpected ") + key;
  check(problems.empty(), "the optimizer state does not match the model: {}", problems);
}

LOOM_INLINE std::vector<torch::Tensor> Optimizer::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

LOOM_INLINE void Optimizer::ensure_state(std::size_t g) {
  auto& st = state_[g];
  if (!st.exp_avg.empty() || options_.algorithm == Algorithm::sgd) return;
  for (const auto& p : groups_[g].params) {
    st.exp_avg.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    st.exp_avg_sq.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    st.step.push_back(torch::zeros({}, p.options().dtype(torch::kFloat)));
  }
}

LOOM_INLINE void Optimizer::step_group(std::size_t g, double lr, const torch::Tensor& found_inf) {
  auto& group = groups_[g];
  std::vector<torch::Tensor> params, grads;
  std::vector<std::size_t> slots;
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const auto& grad = group.params[i].grad();
    if (!grad.defined()) continue;
    params.push_back(group.params[i].detach());
    grads.push_back(grad);
    slots.push_back(i);
  }
  if (params.empty()) return;
  torch::NoGradGuard no_grad;
  if (options_.algorithm == Algorithm::sgd) {
    if (group.weight_decay != 0.0) at::_foreach_add_(grads, params, group.weight_decay);
    at::_foreach_add_(params, grads, -lr);
    return;
  }
  ensure_state(g);
  auto& st = state_[g];
  std::vector<torch::Tensor> m, v, steps;
  for (auto i : slots) {
    m.push_back(st.exp_avg[i]);
    v.push_back(st.exp_avg_sq[i]);
    steps.push_back(st.step[i]);
  }
  if (options_.algorithm == Algorithm::adamw_fused) {
    at::_foreach_add_(steps, 1.0);
    std::optional<torch::Tensor> inf;
    if (found_inf.defined()) inf = found_inf.reshape({});
    at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                      options_.beta2, group.weight_decay, options_.eps, /*amsgrad=*/false,
                      /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/inf);
    // As torch.optim.AdamW(fused=True): a skipped step does not count.
    if (inf) at::_foreach_sub_(steps, std::vector<torch::Tensor>(steps.size(), *inf));
    return;
  }
  // adamw_foreach: torch.optim.AdamW's multi-tensor path, with a host step count.
  at::_foreach_add_(steps, 1.0);
  const double t = static_cast<double>(steps_);
  if (group.weight_decay != 0.0) at::_foreach_mul_(params, 1.0 - lr * group.weight_decay);
  at::_foreach_lerp_(m, grads, 1.0 - options_.beta1);
  at::_foreach_mul_(v, options_.beta2);
  at::_foreach_addcmul_(v, grads, grads, 1.0 - options_.beta2);
  const double bias1 = 1.0 - std::pow(options_.beta1, t);
  const double bias2_sqrt = std::sqrt(1.0 - std::pow(options_.beta2, t));
  auto denom = at::_foreach_sqrt(v);
  at::_foreach_div_(denom, bias2_sqrt);
  at::_foreach_add_(denom, options_.eps);
  at::_foreach_addcdiv_(params, m, denom, -lr / bias1);
}

LOOM_INLINE torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return torch::zeros({});
  torch::NoGradGuard no_grad;
  auto norms = at::_foreach_norm(grads, 2);
  auto total = torch::linalg_vector_norm(torch::stack(norms), 2);
  if (max_norm > 0) {
    auto coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

}  // namespace loom::optim
