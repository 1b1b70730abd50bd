#pragma once
// Optimizers stepped over all parameters at once with ATen's multi-tensor kernels:
//   adamw_torch_fused  at::_fused_adamw_ (one fused kernel per group and device)
//   adamw_torch        the _foreach_ formulation of torch.optim.AdamW(foreach=True)
//   sgd                _foreach_add_ (plain SGD, as torch.optim.SGD without momentum)
// The learning rate is a host double passed per step, so nothing here syncs with the device.

#include <loom/core/error.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::optim {

/// Which update rule an Optimizer applies.
enum class Algorithm { adamw_fused, adamw_foreach, sgd };

/// Algorithm for an HF `optim` name; unknown names are a loom::Error.
inline Algorithm algorithm_from_name(std::string_view name) {
  if (name == "adamw_torch_fused") return Algorithm::adamw_fused;
  if (name == "adamw_torch") return Algorithm::adamw_foreach;
  if (name == "sgd") return Algorithm::sgd;
  throw Error("--optim '" + std::string(name) + "' is not one of adamw_torch_fused, adamw_torch, sgd");
}

/// Hyper-parameters shared by every group.
struct OptimizerOptions {
  Algorithm algorithm = Algorithm::adamw_fused;  ///< update rule
  double beta1 = 0.9;                            ///< AdamW beta1
  double beta2 = 0.999;                          ///< AdamW beta2
  double eps = 1e-8;                             ///< AdamW epsilon
};

/// A multi-tensor optimizer over parameter groups.
class Optimizer {
 public:
  /// An optimizer over `groups`; state is created lazily on the first step.
  Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options)
      : groups_(std::move(groups)), options_(options) {
    state_.resize(groups_.size());
  }

  /// Applies one update with learning rate `lr` to every parameter that has a gradient.
  /// With `found_inf` (a device flag from the fp16 scaler) the update is skipped when it is
  /// nonzero: on the device for the fused kernel; the foreach and SGD paths read the flag
  /// on the host (one sync per step, documented in docs/semantics.md).
  void step(double lr, const torch::Tensor& found_inf = {}) {
    if (found_inf.defined() && options_.algorithm != Algorithm::adamw_fused && found_inf.item<float>() != 0.0f) return;
    ++steps_;
    for (std::size_t g = 0; g < groups_.size(); ++g)
      step_group(g, lr, options_.algorithm == Algorithm::adamw_fused ? found_inf : torch::Tensor());
  }

  /// Drops every gradient (set_to_none, as torch's default).
  void zero_grad() {
    for (auto& group : groups_)
      for (auto& p : group.params) p.mutable_grad() = torch::Tensor();
  }

  /// The parameter groups.
  [[nodiscard]] const std::vector<ParamGroup>& groups() const { return groups_; }
  /// Steps taken.
  [[nodiscard]] int64_t steps() const { return steps_; }
  /// The options.
  [[nodiscard]] const OptimizerOptions& options() const { return options_; }

  /// Optimizer state as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>",
  /// "step.<param>"), for checkpoints; empty before the first step and for SGD.
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const {
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
  /// Scalars of the state (steps taken, hyper-parameters) for checkpoints.
  [[nodiscard]] nlohmann::json state_meta() const {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : groups_) groups.push_back({{"weight_decay", g.weight_decay}, {"params", g.names}});
    return {{"steps", steps_}, {"betas", {options_.beta1, options_.beta2}}, {"eps", options_.eps},
            {"algorithm", static_cast<int>(options_.algorithm)}, {"param_groups", groups}};
  }
  /// Restores state_tensors() / state_meta() output; every moment must match a parameter by
  /// name and shape, else a loom::Error listing the mismatches.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const nlohmann::json& meta) {
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

  /// Every parameter of every group.
  [[nodiscard]] std::vector<torch::Tensor> parameters() const {
    std::vector<torch::Tensor> out;
    for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
    return out;
  }

 private:
  struct GroupState {
    std::vector<torch::Tensor> exp_avg, exp_avg_sq, step;
  };

  void ensure_state(std::size_t g) {
    auto& st = state_[g];
    if (!st.exp_avg.empty() || options_.algorithm == Algorithm::sgd) return;
    for (const auto& p : groups_[g].params) {
      st.exp_avg.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      st.exp_avg_sq.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      st.step.push_back(torch::zeros({}, p.options().dtype(torch::kFloat)));
    }
  }

  void step_group(std::size_t g, double lr, const torch::Tensor& found_inf) {
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

  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  std::vector<GroupState> state_;
  int64_t steps_ = 0;
};

/// Scales all gradients so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping as a device scalar (no host sync), like torch.nn.utils.clip_grad_norm_.
inline torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
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
