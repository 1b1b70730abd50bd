#pragma once
#include <loom/core/error.hpp>
#include <loom/accelerate/optimizer_step.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace loom {

LOOM_INLINE void OptimizerStep::reset(optim::Optimizer full, schedule::LRSchedulerBase& scheduler,
                                      const std::vector<torch::Tensor>& model_order,
                                      const std::vector<std::vector<torch::Tensor>>& fused) {
  scheduler_ = &scheduler;
  state_bytes_ = {};
  skipped_ = 0;
  skip_pending_ = false;
  pieces_.clear();
  params_.clear();
  fused_.clear();
  host_.clear();
  optimizer_.reset();
  // Groups with their own lr follow the schedule's factor, lr / base_lr (torch's LambdaLR).
  full.set_base_lr(scheduler.base_lr());
  const bool own_lr = std::any_of(full.groups().begin(), full.groups().end(), [](const auto& g) { return g.lr; });
  check(!own_lr || scheduler.base_lr() > 0,
        "a parameter group has its own lr but --learning_rate is {}: the schedule scales each group's lr by "
        "lr / --learning_rate, so --learning_rate must be positive", scheduler.base_lr());
  if (!engine_->shards_optimizer()) {
    optimizer_.emplace(std::move(full));
    auto stepped = optimizer_->parameters();
    std::unordered_set<const c10::TensorImpl*> in_optimizer;
    for (const auto& p : stepped) in_optimizer.insert(p.unsafeGetTensorImpl());
    for (const auto& p : model_order)
      if (in_optimizer.erase(p.unsafeGetTensorImpl()) > 0) params_.push_back(p);
    for (const auto& p : stepped)
      if (in_optimizer.count(p.unsafeGetTensorImpl()) > 0) params_.push_back(p);
    // A fused group counts when the optimizer steps all its members (a frozen base does not).
    std::unordered_map<const c10::TensorImpl*, std::size_t> index;
    for (std::size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].unsafeGetTensorImpl(), i);
    for (const auto& group : fused) {
      std::vector<std::size_t> at;
      for (const auto& p : group)
        if (const auto it = index.find(p.unsafeGetTensorImpl()); it != index.end()) at.push_back(it->second);
      if (!group.empty() && at.size() == group.size()) fused_.push_back(std::move(at));
    }
    return;
  }
  check(full.wrapped() == nullptr,
        "create_optimizer returned a wrapped torch::optim::Optimizer, but this sharding policy (ZeRO-1, ZeRO-2 or "
        "FullShard) steps each rank's flat pieces of the parameters and a torch optimizer keeps its state by whole "
        "parameter; return a loom optimizer (--optim) or use --sharding ddp");
  check(full.steps_pieces(),
        "--optim {} cannot run under this sharding policy (ZeRO-1, ZeRO-2 or FullShard): its factored second moments "
        "need each matrix whole and the policy steps flat pieces of the parameters; use --sharding ddp or another "
        "--optim", optim::algorithm_name(full.options().algorithm));
  std::vector<optim::ParamGroup> groups;
  for (const auto& g : full.groups()) {
    optim::ParamGroup sharded{{}, {}, g.weight_decay, g.lr};
    for (std::size_t i = 0; i < g.params.size(); ++i) {
      auto piece = engine_->piece_of(g.params[i], g.names.at(i));
      if (!piece) continue;
      check(offload_ || !piece->on_host, "parameter {} lives in host memory (--offload_param) and only an offloaded "
            "optimizer steps it there: add --offload_optimizer", piece->name);
      // What unscale and clip see, with the device gradient: for a host piece an alias, since
      // the optimizer's handle of it carries the host gradient.
      torch::Tensor p = piece->on_host ? piece->param.detach() : piece->param;
      p.mutable_grad() = piece->grad;
      params_.push_back(p);
      if (offload_) p = host_copy(p, piece->on_host ? piece->param : torch::Tensor());
      sharded.params.push_back(p);
      sharded.names.push_back(piece->name);
      pieces_.push_back(*piece);
    }
    groups.push_back(std::move(sharded));
  }
  optimizer_.emplace(std::move(groups), full.options());
  optimizer_->set_base_lr(scheduler.base_lr());
}

LOOM_INLINE torch::Tensor OptimizerStep::host_copy(const torch::Tensor& piece, const torch::Tensor& on_host) {
  // Separate host storage even when the device is the CPU, so a CPU run takes the same path.
  const auto opts = piece.options().device(torch::kCPU).pinned_memory(device_.is_cuda());
  const bool in_place = on_host.defined();
  HostCopy h{piece, in_place ? on_host : torch::empty(piece.sizes(), opts), torch::empty(piece.sizes(), opts), in_place};
  if (!in_place) h.host.copy_(piece.detach());
  h.host.mutable_grad() = h.grad;
  host_.push_back(h);
  return h.host;
}

LOOM_INLINE torch::Tensor OptimizerStep::clip(const std::vector<torch::Tensor>& params, const torch::Tensor& found_inf,
                                              double max_grad_norm) {
  if (engine_->grads_sharded() && found_inf.defined()) {
    torch::Tensor inf = found_inf;  // the same storage: the sum lands in found_inf
    engine_->all_reduce(inf, "the fp16 overflow all-reduce");
    // The sum counts the ranks that overflowed (0..N); the fused optimizers skip only on
    // exactly 1, so two ranks overflowing would otherwise apply inf gradients.
    inf.clamp_max_(1.0);
  }
  if (!engine_->grads_sharded())
    // (fused_ indexes params_: other parameters are normed tensor by tensor.)
    return optim::clip_grad_norm(params, max_grad_norm, &params == &params_ ? fused_ : decltype(fused_){});
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  torch::Tensor sq = grads.empty() ? torch::zeros({1}, torch::TensorOptions().device(device_))
                                   : torch::stack(at::_foreach_norm(grads, 2)).square().sum().reshape({1});
  engine_->all_reduce(sq, "the gradient-norm all-reduce");
  auto total = sq.sqrt().reshape({});
  if (!grads.empty() && max_grad_norm > 0)
    at::_foreach_mul_(grads, torch::clamp_max(max_grad_norm / (total + 1e-6), 1.0));
  return total;
}

LOOM_INLINE void OptimizerStep::settle_skip() {
  if (!skip_pending_) return;
  if (skip_event_) skip_event_->synchronize();
  skip_pending_ = false;
  if (skip_flag_host_.item<float>() == 0.0f) scheduler_->step();
  else ++skipped_;
}

LOOM_INLINE void OptimizerStep::step(double lr, const torch::Tensor& found_inf) {
  if (host_.empty()) {
    optimizer_->step(lr, found_inf);
    engine_->after_step();
    return;
  }
  // Offloaded: the gradients and the current values down, the step on the host, the values up.
  torch::NoGradGuard no_grad;
  const bool cuda = device_.is_cuda();
  for (auto& h : host_) {
    const auto& g = h.device.grad();  // undefined: no rank used it (the engine hid it), not stepped
    h.host.mutable_grad() = g.defined() ? h.grad : torch::Tensor();
    if (!g.defined()) continue;
    h.grad.copy_(g, cuda);
    if (!h.in_place) h.host.copy_(h.device, cuda);
  }
  torch::Tensor inf;
  if (found_inf.defined()) {
    if (!host_inf_.defined())
      host_inf_ = torch::empty(found_inf.sizes(), found_inf.options().device(torch::kCPU).pinned_memory(cuda));
    host_inf_.copy_(found_inf, cuda);
    inf = host_inf_;
  }
  if (cuda) {  // the copies above are queued on the current stream: wait for them once
    c10::Event copied(device_.type());
    copied.record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    copied.synchronize();
  }
  optimizer_->step(lr, inf);
  // Pinned sources: the host next writes them after the next step's wait, so they outlive the copies.
  for (auto& h : host_)
    if (!h.in_place && h.host.grad().defined()) h.device.copy_(h.host, cuda);
  engine_->after_step();
}

LOOM_INLINE void OptimizerStep::after_update(const torch::Tensor& inf) {
  if (!inf.defined()) {
    scheduler_->step();
    return;
  }
  if (!skip_flag_host_.defined())
    skip_flag_host_ = torch::empty({1}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(device_.is_cuda()));
  skip_flag_host_.copy_(inf.reshape({1}), /*non_blocking=*/device_.is_cuda());
  if (device_.is_cuda()) {
    skip_event_.emplace(device_.type());
    skip_event_->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }
  skip_pending_ = true;
}

LOOM_INLINE void OptimizerStep::finish() {
  if (state_bytes_.total() == 0) {
    state_bytes_ = engine_->state_bytes();
    state_bytes_.optimizer = 0;
    double state = 0;
    for (const auto& [name, t] : optimizer_->state_tensors()) state += static_cast<double>(t.nbytes());
    if (host_.empty()) {
      state_bytes_.optimizer = state;
    } else {
      state_bytes_.host += state;  // beside the engine's host shards (--offload_param)
      for (const auto& h : host_) state_bytes_.host += static_cast<double>(h.grad.nbytes() + (h.in_place ? 0 : h.host.nbytes()));
    }
  }
  if (engine_owns_grads_) engine_->zero_grad();
  else optimizer_->zero_grad();
}

}  // namespace loom
