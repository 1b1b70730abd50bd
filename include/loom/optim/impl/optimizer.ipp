#pragma once
// Definitions of optim/optimizer.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/optim_args.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

namespace detail {
// HF optim names, in Algorithm's order.
inline constexpr std::array<std::string_view, 8> kAlgorithmNames = {
    optimizer::AdamWTorchFused::name, optimizer::AdamWTorch::name, optimizer::SGD::name,  optimizer::Adagrad::name,
    optimizer::RMSprop::name,         optimizer::Adafactor::name,  optimizer::Lion::name, "torch"};
}  // namespace detail

LOOM_INLINE Algorithm algorithm_from_name(std::string_view name) {
  for (std::size_t i = 0; i + 1 < detail::kAlgorithmNames.size(); ++i)
    if (detail::kAlgorithmNames[i] == name) return static_cast<Algorithm>(i);
  fail("--optim '{}' is not one of {}", name, joined_names<OptimizerCatalog>(", "));
}

LOOM_INLINE std::string_view algorithm_name(Algorithm algorithm) {
  return detail::kAlgorithmNames.at(static_cast<std::size_t>(algorithm));
}

LOOM_INLINE OptimizerOptions options_from_args(const TrainingArguments& args) {
  OptimizerOptions o;
  o.algorithm = algorithm_from_name(args.optim);
  if (o.algorithm == Algorithm::adamw_fused || o.algorithm == Algorithm::adamw_foreach) {
    o.beta1 = args.adam_beta1;
    o.beta2 = args.adam_beta2;
    o.eps = args.adam_epsilon;
  }
  if (o.algorithm == Algorithm::adagrad) o.eps = 1e-10;
  if (o.algorithm == Algorithm::lion) o.beta2 = 0.99;
  for (const auto& [key, v] : parse_optim_args(args.optim, args.optim_args.value_or(""))) {
    if (key == "momentum") o.momentum = v;
    else if (key == "dampening") o.dampening = v;
    else if (key == "nesterov") o.nesterov = v != 0.0;
    else if (key == "lr_decay") o.lr_decay = v;
    else if (key == "eps") o.eps = v;
    else if (key == "initial_accumulator_value") o.initial_accumulator_value = v;
    else if (key == "alpha") o.alpha = v;
    else if (key == "centered") o.centered = v != 0.0;
    else if (key == "beta1" && o.algorithm == Algorithm::adafactor) o.adafactor_beta1 = v;
    else if (key == "beta1") o.beta1 = v;
    else if (key == "beta2") o.beta2 = v;
    else if (key == "decay_rate") o.decay_rate = v;
    else if (key == "clip_threshold") o.clip_threshold = v;
  }
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
  check(!options_.nesterov || (options_.momentum > 0 && options_.dampening == 0),
        "SGD's Nesterov momentum needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  check(!(options_.relative_step && std::any_of(groups_.begin(), groups_.end(), [](const auto& g) { return g.lr; })),
        "Adafactor's relative_step computes the learning rate; a group cannot also set its own lr (as HF)");
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
  if (found_inf.defined() && options_.algorithm != Algorithm::adamw_fused && found_inf.item<float>() != 0.0f) return;
  ++steps_;
  if (wrapped_) {
    auto& groups = wrapped_->param_groups();
    for (std::size_t g = 0; g < groups.size() && g < groups_.size(); ++g) groups[g].options().set_lr(group_lr(g, lr));
    wrapped_->step();
    return;
  }
  for (std::size_t g = 0; g < groups_.size(); ++g)
    step_group(g, group_lr(g, lr), options_.algorithm == Algorithm::adamw_fused ? found_inf : torch::Tensor());
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
    const bool known = saved >= 0 && saved < static_cast<int>(detail::kAlgorithmNames.size());
    check(saved == static_cast<int>(options_.algorithm),
          "the checkpoint's optimizer is {} but this run's is {}; resume with the same --optim (or create_optimizer)",
          known ? std::string(detail::kAlgorithmNames[static_cast<std::size_t>(saved)]) : std::to_string(saved),
          algorithm_name(options_.algorithm));
  }
  steps_ = meta.at("steps").get<int64_t>();
  if (tensors.empty()) return;
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  std::string problems;
  auto problem = [&](const std::string& what) { problems += (problems.empty() ? "" : "; ") + what; };
  torch::NoGradGuard no_grad;
  const bool lazy = options_.algorithm == Algorithm::sgd;  // torch's momentum buffers start at the first gradient
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

LOOM_INLINE Optimizer::ParamState Optimizer::initial_state(const torch::Tensor& p) const {
  const auto like = [&] { return torch::zeros_like(p, torch::MemoryFormat::Preserve); };
  const auto step = [&] { return torch::zeros({}, p.options().dtype(torch::kFloat)); };
  ParamState st;
  switch (options_.algorithm) {
    case Algorithm::adamw_fused:
    case Algorithm::adamw_foreach:
      st = {{"exp_avg", like()}, {"exp_avg_sq", like()}, {"step", step()}};
      break;
    case Algorithm::sgd:
      if (options_.momentum != 0.0) st = {{"momentum_buffer", like()}};
      break;
    case Algorithm::adagrad:
      st = {{"sum", torch::full_like(p, options_.initial_accumulator_value)},
            {"step", step()}};
      break;
    case Algorithm::rmsprop:
      st = {{"square_avg", like()}};
      if (options_.momentum > 0) st.emplace_back("momentum_buffer", like());
      if (options_.centered) st.emplace_back("grad_avg", like());
      st.emplace_back("step", step());
      break;
    case Algorithm::lion:
      st = {{"exp_avg", like()}};
      break;
    case Algorithm::adafactor: {
      // HF keeps Adafactor's state in float32 (the gradient's dtype after its upcast).
      const auto f32 = p.options().dtype(torch::kFloat);
      if (options_.adafactor_beta1) st.emplace_back("exp_avg", torch::zeros(p.sizes(), f32));
      if (p.dim() >= 2) {
        auto row = p.sizes().vec(), col = p.sizes().vec();
        row.pop_back();
        col.erase(col.end() - 2);
        st.emplace_back("exp_avg_sq_row", torch::zeros(row, f32));
        st.emplace_back("exp_avg_sq_col", torch::zeros(col, f32));
      } else {
        st.emplace_back("exp_avg_sq", torch::zeros(p.sizes(), f32));
      }
      st.emplace_back("step", step());
      break;
    }
    case Algorithm::torch:
      break;
  }
  return st;
}

LOOM_INLINE void Optimizer::ensure_state(std::size_t g) {
  for (std::size_t i = 0; i < groups_[g].params.size(); ++i)
    if (state_[g][i].empty()) state_[g][i] = initial_state(groups_[g].params[i]);
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
  const double wd = group.weight_decay;
  const auto& o = options_;
  // The state tensors of kind `kind` of the stepped parameters, in `slots` order.
  auto state_of = [&](std::string_view kind) {
    std::vector<torch::Tensor> out;
    for (auto i : slots)
      for (const auto& [k, t] : state_[g][i])
        if (k == kind) out.push_back(t);
    return out;
  };
  if (o.algorithm == Algorithm::sgd) {
    // torch.optim.SGD: L2 decay into a copy of the gradient; momentum buffers start as the
    // first gradient; Nesterov looks ahead along the buffer.
    if (wd != 0.0) grads = at::_foreach_add(grads, params, wd);
    if (o.momentum != 0.0) {
      std::vector<torch::Tensor> bufs, old_grads;
      for (std::size_t k = 0; k < slots.size(); ++k) {
        auto& st = state_[g][slots[k]];
        if (st.empty()) {
          st = {{"momentum_buffer", grads[k].detach().clone(torch::MemoryFormat::Preserve)}};
        } else {
          bufs.push_back(st.front().second);
          old_grads.push_back(grads[k]);
        }
      }
      if (!bufs.empty()) {
        at::_foreach_mul_(bufs, o.momentum);
        at::_foreach_add_(bufs, old_grads, 1.0 - o.dampening);
      }
      auto all_bufs = state_of("momentum_buffer");
      grads = o.nesterov ? at::_foreach_add(grads, all_bufs, o.momentum) : all_bufs;
    }
    at::_foreach_add_(params, grads, -lr);
    return;
  }
  ensure_state(g);
  if (o.algorithm == Algorithm::adafactor) {
    step_adafactor(g, lr, slots, params, grads);
    return;
  }
  auto steps = state_of("step");
  if (!steps.empty()) at::_foreach_add_(steps, 1.0);
  const double t = static_cast<double>(steps_);
  if (o.algorithm == Algorithm::adamw_fused) {
    std::optional<torch::Tensor> inf;
    if (found_inf.defined()) inf = found_inf.reshape({});
    auto m = state_of("exp_avg"), v = state_of("exp_avg_sq");
    at::_fused_adamw_(params, grads, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, o.beta1, o.beta2, wd, o.eps,
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt, /*found_inf=*/inf);
    // As torch.optim.AdamW(fused=True): a skipped step does not count.
    if (inf) at::_foreach_sub_(steps, std::vector<torch::Tensor>(steps.size(), *inf));
    return;
  }
  if (o.algorithm == Algorithm::adamw_foreach) {
    // torch.optim.AdamW's multi-tensor path, with a host step count.
    auto m = state_of("exp_avg"), v = state_of("exp_avg_sq");
    if (wd != 0.0) at::_foreach_mul_(params, 1.0 - lr * wd);
    at::_foreach_lerp_(m, grads, 1.0 - o.beta1);
    at::_foreach_mul_(v, o.beta2);
    at::_foreach_addcmul_(v, grads, grads, 1.0 - o.beta2);
    const double bias1 = 1.0 - std::pow(o.beta1, t);
    const double bias2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, t));
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, bias2_sqrt);
    at::_foreach_add_(denom, o.eps);
    at::_foreach_addcdiv_(params, m, denom, -lr / bias1);
    return;
  }
  if (o.algorithm == Algorithm::adagrad) {
    // torch.optim.Adagrad: clr = lr / (1 + (step - 1) * lr_decay), the step counted on the host.
    auto sums = state_of("sum");
    if (wd != 0.0) grads = at::_foreach_add(grads, params, wd);
    at::_foreach_addcmul_(sums, grads, grads, 1.0);
    auto std_ = at::_foreach_sqrt(sums);
    at::_foreach_add_(std_, o.eps);
    at::_foreach_addcdiv_(params, grads, std_, -lr / (1.0 + (t - 1.0) * o.lr_decay));
    return;
  }
  if (o.algorithm == Algorithm::rmsprop) {
    // torch.optim.RMSprop.
    auto square_avg = state_of("square_avg");
    if (wd != 0.0) grads = at::_foreach_add(grads, params, wd);
    at::_foreach_mul_(square_avg, o.alpha);
    at::_foreach_addcmul_(square_avg, grads, grads, 1.0 - o.alpha);
    std::vector<torch::Tensor> avg;
    if (o.centered) {
      auto grad_avg = state_of("grad_avg");
      at::_foreach_lerp_(grad_avg, grads, 1.0 - o.alpha);
      avg = at::_foreach_addcmul(square_avg, grad_avg, grad_avg, -1.0);
      at::_foreach_sqrt_(avg);
    } else {
      avg = at::_foreach_sqrt(square_avg);
    }
    at::_foreach_add_(avg, o.eps);
    if (o.momentum > 0) {
      auto bufs = state_of("momentum_buffer");
      at::_foreach_mul_(bufs, o.momentum);
      at::_foreach_addcdiv_(bufs, grads, avg);
      at::_foreach_add_(params, bufs, -lr);
    } else {
      at::_foreach_addcdiv_(params, grads, avg, -lr);
    }
    return;
  }
  // Lion: decoupled decay, then a step of size lr along the sign of the interpolated moment.
  auto m = state_of("exp_avg");
  if (wd != 0.0) at::_foreach_mul_(params, 1.0 - lr * wd);
  auto update = at::_foreach_lerp(m, grads, 1.0 - o.beta1);
  at::_foreach_sign_(update);
  at::_foreach_add_(params, update, -lr);
  at::_foreach_lerp_(m, grads, 1.0 - o.beta2);
}

LOOM_INLINE void Optimizer::step_adafactor(std::size_t g, double lr, const std::vector<std::size_t>& slots,
                                           const std::vector<torch::Tensor>& params,
                                           const std::vector<torch::Tensor>& grads) {
  // transformers.optimization.Adafactor, one tensor at a time; the step count is the host's.
  const auto& o = options_;
  const double wd = groups_[g].weight_decay;
  const double t = static_cast<double>(steps_);
  double rel_step = lr;
  if (o.relative_step) rel_step = std::min(o.warmup_init ? 1e-6 * t : 1e-2, 1.0 / std::sqrt(t));
  const double beta2t = 1.0 - std::pow(t, o.decay_rate);
  auto rms = [](const torch::Tensor& x) { return x.norm(2) / std::sqrt(static_cast<double>(x.numel())); };
  for (std::size_t k = 0; k < slots.size(); ++k) {
    auto& st = state_[g][slots[k]];
    auto find = [&](std::string_view kind) -> torch::Tensor& {
      for (auto& [name, tensor] : st)
        if (name == kind) return tensor;
      fail("Adafactor state {} is missing", kind);
    };
    find("step").add_(1.0);
    const torch::Tensor grad = grads[k].to(torch::kFloat);
    torch::Tensor p = params[k].scalar_type() == torch::kFloat ? params[k] : params[k].to(torch::kFloat);
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
    if (!p.is_same(params[k])) params[k].copy_(p);
  }
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
