#pragma once
// Definitions of distributed/checkpointed.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/distributed/checkpointed.hpp>

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace loom::dist {

namespace detail {
// Sets every wrapper's switch: on (outermost wrappers only) or off. Returns how many were
// switched on, or, switching off, how many had been on.
LOOM_INLINE int set_recompute(torch::nn::Module& module, bool on) {
  // The module itself is looked at apart: named_modules(include_self=true) needs it held by a
  // shared_ptr, and a model on the stack is not.
  std::vector<std::pair<std::string, Recomputable*>> found;
  if (auto* self = dynamic_cast<Recomputable*>(&module)) found.emplace_back("", self);
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    if (auto* r = dynamic_cast<Recomputable*>(item.value().get())) found.emplace_back(item.key(), r);
  int count = 0;
  std::vector<std::string> on_prefixes;  // pre-order: an outer wrapper comes before its inner ones
  for (const auto& entry : found) {  // not a structured binding: clang < 16 cannot capture one
    const auto& [name, r] = entry;
    const bool covered = std::any_of(on_prefixes.begin(), on_prefixes.end(), [&entry](const std::string& p) {
      return p.empty() || entry.first.starts_with(p + ".");
    });
    if (!on) count += r->loom_recompute ? 1 : 0;
    r->loom_recompute = on && !covered && !r->loom_never_recompute;
    if (r->loom_recompute) {
      ++count;
      on_prefixes.push_back(name);
    }
    // Wrappers wrapped directly (a Checkpointed in a FullShardUnit) are covered by this one.
    for (auto* w = r->wrapped(); w != nullptr; w = w->wrapped()) {
      if (!on) count += w->loom_recompute ? 1 : 0;
      w->loom_recompute = false;
    }
  }
  return count;
}
}  // namespace detail

LOOM_INLINE int enable_gradient_checkpointing(torch::nn::Module& module) { return detail::set_recompute(module, true); }
LOOM_INLINE int disable_gradient_checkpointing(torch::nn::Module& module) {
  return detail::set_recompute(module, false);
}

namespace detail {

LOOM_INLINE ForwardState ForwardState::capture(const std::vector<torch::Tensor>& inputs) {
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  for (const auto& x : inputs)
    if (x.defined() && x.is_cuda() && std::find(devices.begin(), devices.end(), x.device()) == devices.end())
      devices.push_back(x.device());
  return capture_on(devices);
}

LOOM_INLINE ForwardState ForwardState::capture_on(const std::vector<c10::Device>& devices) {
  ForwardState s;
  for (const auto& d : devices) {
    auto gen = at::globalContext().defaultGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    s.rng_.push_back({d, gen.get_state()});
  }
  std::vector<c10::DeviceType> types{c10::kCPU};
  if (devices.size() > 1) types.push_back(c10::kCUDA);
  for (const auto t : types)
    s.autocast_.push_back({t, at::autocast::is_autocast_enabled(t), at::autocast::get_autocast_dtype(t)});
  s.autocast_cache_ = at::autocast::is_autocast_cache_enabled();
  return s;
}

LOOM_INLINE void ForwardState::apply() const {
  for (const auto& r : rng_) {
    auto gen = at::globalContext().defaultGenerator(r.device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(r.state);
  }
  for (const auto& a : autocast_) {
    at::autocast::set_autocast_enabled(a.type, a.enabled);
    at::autocast::set_autocast_dtype(a.type, a.dtype);
  }
  at::autocast::set_autocast_cache_enabled(autocast_cache_);
}

LOOM_INLINE Replay::Replay(const ForwardState& saved) {
  std::vector<c10::Device> devices;
  for (const auto& r : saved.rng_) devices.push_back(r.device);
  current_ = ForwardState::capture_on(devices);
  saved.apply();
  // A scope of its own, as torch.autocast's: the cast cache is cleared when the outermost
  // scope ends.
  at::autocast::increment_nesting();
}

LOOM_INLINE Replay::~Replay() {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  current_.apply();
}

LOOM_INLINE torch::Tensor RecomputeFunction::forward(torch::autograd::AutogradContext* ctx,
                                                     c10::intrusive_ptr<RecomputeCall> call, at::TensorList inputs,
                                                     at::TensorList params) {
  // Function::apply runs this under no-grad: no graph, no activations kept.
  std::vector<torch::Tensor> xs(inputs.begin(), inputs.end());
  call->state = ForwardState::capture(xs);
  ctx->save_for_backward(xs);
  ctx->saved_data["inputs"] = static_cast<int64_t>(inputs.size());
  ctx->saved_data["params"] = static_cast<int64_t>(params.size());
  auto out = call->run(xs);
  ctx->saved_data["call"] = c10::IValue::make_capsule(std::move(call));
  return out;
}

LOOM_INLINE torch::autograd::variable_list RecomputeFunction::backward(torch::autograd::AutogradContext* ctx,
                                                                        torch::autograd::variable_list grad_outputs) {
  auto call = c10::static_intrusive_pointer_cast<RecomputeCall>(ctx->saved_data["call"].toCapsule());
  const auto n_inputs = static_cast<std::size_t>(ctx->saved_data["inputs"].toInt());
  const auto n_params = static_cast<std::size_t>(ctx->saved_data["params"].toInt());
  const auto saved = ctx->get_saved_variables();
  // Outputs of backward: one per argument of forward (the call, then each tensor).
  torch::autograd::variable_list grads(1 + n_inputs + n_params);
  std::vector<torch::Tensor> inputs, wrt;
  std::vector<std::size_t> where;
  for (std::size_t i = 0; i < n_inputs; ++i) {
    auto x = saved[i].defined() ? saved[i].detach() : saved[i];
    if (x.defined() && saved[i].requires_grad()) x.requires_grad_(true);
    if (x.defined() && x.requires_grad() && ctx->needs_input_grad(i)) {
      wrt.push_back(x);
      where.push_back(1 + i);
    }
    inputs.push_back(std::move(x));
  }
  for (std::size_t i = 0; i < n_params; ++i)
    if (ctx->needs_input_grad(n_inputs + i)) {
      wrt.push_back(call->params[i]);
      where.push_back(1 + n_inputs + i);
    }
  if (wrt.empty()) return grads;
  torch::Tensor out;
  {
    Replay replay(call->state);
    torch::AutoGradMode grad_mode(true);
    out = call->run(inputs);
  }
  if (!out.requires_grad()) return grads;
  auto computed = torch::autograd::grad({out}, wrt, {grad_outputs[0]}, /*retain_graph=*/false,
                                        /*create_graph=*/false, /*allow_unused=*/true);
  for (std::size_t k = 0; k < wrt.size(); ++k) grads[where[k]] = std::move(computed[k]);
  return grads;
}

}  // namespace detail

}  // namespace loom::dist
