#pragma once
// Definitions of optim/optimizer.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/optim_args.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

LOOM_INLINE OptimizerOptions options_from_args(const TrainingArguments& args) {
  OptimizerOptions o;
  o.algorithm = algorithm_from_name(args.optim);
  find_rule(o.algorithm)->read_args(o, args, parse_optim_args(args.optim, args.optim_args.value_or("")));
  return o;
}

LOOM_INLINE Optimizer make_optimizer(const TrainingArguments& args, const torch::nn::Module& model) {
  Optimizer opt(decay_groups(model, args.weight_decay), options_from_args(args));
  opt.set_base_lr(args.learning_rate);
  return opt;
}

LOOM_INLINE bool is_param_shaped(std::string_view kind) {
  return kind != "step" && kind != "exp_avg_sq_row" && kind != "exp_avg_sq_col";
}

LOOM_INLINE Optimizer::Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options)
    : groups_(std::move(groups)), options_(options) {
  check(options_.algorithm != Algorithm::torch, "Algorithm::torch is for Optimizer::wrap(a torch::optim::Optimizer)");
  rule_ = find_rule(options_.algorithm);
  check(rule_ != nullptr, "OptimizerOptions::algorithm {} is no rule of optim/catalog.hpp",
        static_cast<int>(options_.algorithm));
  if (rule_->validate != nullptr) rule_->validate(options_, groups_);
  state_.resize(groups_.size());
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    check(groups_[g].names.size() == groups_[g].params.size(),
          "parameter group {} has {} parameters but {} names", g, groups_[g].params.size(), groups_[g].names.size());
    state_[g].resize(groups_[g].params.size());
  }
}

LOOM_INLINE Optimizer Optimizer::wrap(std::unique_ptr<torch::optim::Optimizer> optimizer) {
  check(optimizer != nullptr, "Optimizer::wrap needs a torch::optim::Optimizer, got null");
  std::vector<ParamGroup> groups;
  for (std::size_t g = 0; g < optimizer->param_groups().size(); ++g) {
    auto& group = optimizer->param_groups()[g];
    ParamGroup pg;
    pg.params = group.params();
    for (std::size_t i = 0; i < pg.params.size(); ++i) pg.names.push_back(fmt::format("{}.{}", g, i));
    pg.lr = group.options().get_lr();
    groups.push_back(std::move(pg));
  }
  Optimizer out(std::move(groups), OptimizerOptions{});
  out.options_.algorithm = Algorithm::torch;
  out.rule_ = nullptr;
  out.wrapped_ = std::shared_ptr<torch::optim::Optimizer>(std::move(optimizer));
  return out;
}

LOOM_INLINE double Optimizer::group_lr(std::size_t g, double lr) const {
  const auto& own = groups_[g].lr;
  if (!own) return lr;
  if (!base_lr_) return *own;
  return *base_lr_ > 0 ? *own * (lr / *base_lr_) : 0.0;
}

LOOM_INLINE void Optimizer::step(double lr, const torch::Tensor& found_inf) {
  const bool device_skip = rule_ != nullptr && rule_->skips_on_device;
  if (found_inf.defined() && !device_skip && found_inf.item<float>() != 0.0f) return;
  ++steps_;
  if (wrapped_) {
    auto& groups = wrapped_->param_groups();
    for (std::size_t g = 0; g < groups.size() && g < groups_.size(); ++g) groups[g].options().set_lr(group_lr(g, lr));
    wrapped_->step();
    return;
  }
  for (std::size_t g = 0; g < groups_.size(); ++g)
    step_group(g, group_lr(g, lr), device_skip ? found_inf : torch::Tensor());
}

LOOM_INLINE void Optimizer::zero_grad() {
  if (wrapped_) {
    wrapped_->zero_grad(/*set_to_none=*/true);
    return;
  }
  for (auto& group : groups_)
    for (auto& p : group.params) p.mutable_grad() = torch::Tensor();
}

LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (std::size_t i = 0; i < state_[g].size(); ++i)
      for (const auto& [kind, t] : state_[g][i]) out.emplace_back(kind + "." + groups_[g].names.at(i), t);
  return out;
}

LOOM_INLINE nlohmann::json Optimizer::state_meta() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const auto& g : groups_) {
    nlohmann::json j = {{"weight_decay", g.weight_decay}, {"params", g.names}};
    if (g.lr) j["lr"] = *g.lr;
    groups.push_back(std::move(j));
  }
  return {{"steps", steps_}, {"betas", {options_.beta1, options_.beta2}}, {"eps", options_.eps},
          {"algorithm", static_cast<int>(options_.algorithm)}, {"optim", std::string(algorithm_name(options_.algorithm))},
          {"param_groups", groups}};
}

LOOM_INLINE void Optimizer::load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                        const nlohmann::json& meta) {
  if (meta.contains("algorithm") && meta["algorithm"].is_number_integer()) {
    const auto saved = meta["algorithm"].get<int>();
    const auto saved_name = algorithm_name(static_cast<Algorithm>(saved));
    check(saved == static_cast<int>(options_.algorithm),
          "the checkpoint's optimizer is {} but this run's is {}; resume with the same --optim (or create_optimizer)",
          saved_name.empty() ? std::to_string(saved) : std::string(saved_name), algorithm_name(options_.algorithm));
  }
  steps_ = meta.at("steps").get<int64_t>();
  if (tensors.empty()) return;
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  std::string problems;
  auto problem = [&](const std::string& what) { problems += (problems.empty() ? "" : "; ") + what; };
  torch::NoGradGuard no_grad;
  const bool lazy = rule_ != nullptr && rule_->lazy_state;  // SGD: torch's momentum buffers start at the first gradient
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    for (std::size_t i = 0; i < groups_[g].params.size(); ++i) {
      const auto& name = groups_[g].names.at(i);
      auto st = initial_state(groups_[g].params[i]);
      if (lazy && (st.empty() || by_name.count(st.front().first + "." + name) == 0)) continue;
      for (auto& [kind, dst] : st) {
        const std::string key = kind + "." + name;
        auto it = by_name.find(key);
        if (it == by_name.end()) {
          problem("missing " + key);
        } else if (it->second.sizes() != dst.sizes()) {
          problem("shape of " + key + " differs");
          by_name.erase(it);
        } else {
          dst.copy_(it->second);
          by_name.erase(it);
        }
      }
      state_[g][i] = std::move(st);
    }
  }
  for (const auto& [key, t] : by_name) problem("unexpected " + key);
  check(problems.empty(), "the optimizer state does not match the model: {}", problems);
}

LOOM_INLINE std::vector<torch::Tensor> Optimizer::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : groups_) out.insert(out.end(), g.params.begin(), g.params.end());
  return out;
}

LOOM_INLINE ParamState Optimizer::initial_state(const torch::Tensor& p) const {
  return rule_ != nullptr ? rule_->initial_state(p, options_) : ParamState{};
}

LOOM_INLINE void Optimizer::ensure_state(std::size_t g) {
  for (std::size_t i = 0; i < groups_[g].params.size(); ++i)
    if (state_[g][i].empty()) state_[g][i] = initial_state(groups_[g].params[i]);
}

LOOM_INLINE void Optimizer::step_group(std::size_t g, double lr, const torch::Tensor& found_inf) {
  const auto& group = groups_[g];
  GroupStep s{.options = options_,
              .state = state_[g],
              .lr = lr,
              .weight_decay = group.weight_decay,
              .t = steps_,
              .found_inf = found_inf};
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const auto& grad = group.params[i].grad();
    if (!grad.defined()) continue;
    s.params.push_back(group.params[i].detach());
    s.grads.push_back(grad);
    s.slots.push_back(i);
  }
  if (s.params.empty()) return;
  torch::NoGradGuard no_grad;
  if (!rule_->lazy_state) ensure_state(g);
  s.steps = s.state_of("step");
  if (!s.steps.empty()) at::_foreach_add_(s.steps, 1.0);
  rule_->step(s);
}

LOOM_INLINE torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                                         const std::vector<std::vector<std::size_t>>& fused) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return torch::zeros({});
  torch::NoGradGuard no_grad;
  // The tensors normed: each gradient, or a fused group's concatenation in its first member's place.
  std::vector<torch::Tensor> normed;
  std::vector<std::ptrdiff_t> group_of(params.size(), -1);
  for (std::size_t g = 0; g < fused.size(); ++g)
    for (const auto i : fused[g]) group_of[i] = static_cast<std::ptrdiff_t>(g);
  std::vector<bool> done(fused.size(), false);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& grad = params[i].grad();
    if (!grad.defined()) continue;
    const auto g = group_of[i];
    if (g < 0) {
      normed.push_back(grad);
      continue;
    }
    if (done[static_cast<std::size_t>(g)]) continue;
    done[static_cast<std::size_t>(g)] = true;
    std::vector<torch::Tensor> parts;
    for (const auto k : fused[static_cast<std::size_t>(g)])
      if (params[k].grad().defined()) parts.push_back(params[k].grad().reshape({-1}));
    if (parts.size() == fused[static_cast<std::size_t>(g)].size()) {
      normed.push_back(torch::cat(parts));
    } else {  // a member without a gradient: each one that has one on its own
      for (const auto k : fused[static_cast<std::size_t>(g)])
        if (params[k].grad().defined()) normed.push_back(params[k].grad());
    }
  }
  auto norms = at::_foreach_norm(normed, 2);
  auto total = torch::linalg_vector_norm(torch::stack(norms), 2);
  if (max_norm > 0) {
    auto coef = torch::clamp_max(max_norm / (total + 1e-6), 1.0);
    at::_foreach_mul_(grads, coef);
  }
  return total;
}

}  // namespace loom::optim
