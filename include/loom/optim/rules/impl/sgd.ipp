#pragma once
// Definitions of optim/rules/sgd.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/optim/rules/sgd.hpp>

#include <torch/torch.h>

#include <string_view>
#include <vector>

namespace loom::optim {

LOOM_INLINE void SGD::read_args(OptimizerOptions& o, const TrainingArguments&, const OptimArgs& optim_args) {
  for (const auto& [key, v] : optim_args) {
    if (key == "momentum") o.momentum = v;
    else if (key == "dampening") o.dampening = v;
    else if (key == "nesterov") o.nesterov = v != 0.0;
  }
}

LOOM_INLINE void SGD::validate(const OptimizerOptions& o, const std::vector<ParamGroup>&) {
  // The rule of the catalog entry, which --optim_args is checked by too (config/optim_args).
  const std::string_view problem = loom::optimizer::SGD::check_args([&](std::string_view key) {
    return key == "momentum" ? o.momentum : key == "dampening" ? o.dampening : o.nesterov ? 1.0 : 0.0;
  });
  check(problem.empty(), "SGD's options: {}", problem);
}

LOOM_INLINE ParamState SGD::initial_state(const torch::Tensor& p, const OptimizerOptions& o) {
  if (o.momentum == 0.0) return {};
  return {{"momentum_buffer", zeros_like_param(p)}};
}

LOOM_INLINE void SGD::step(GroupStep& s) {
  // torch.optim.SGD: L2 decay into a copy of the gradient; momentum buffers start as the
  // first gradient; Nesterov looks ahead along the buffer.
  const auto& o = s.options;
  auto& grads = s.grads;
  if (s.weight_decay != 0.0) grads = at::_foreach_add(grads, s.params, s.weight_decay);
  if (o.momentum != 0.0) {
    std::vector<torch::Tensor> bufs, old_grads;
    for (std::size_t k = 0; k < s.slots.size(); ++k) {
      auto& st = s.state[s.slots[k]];
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
    auto all_bufs = s.state_of("momentum_buffer");
    grads = o.nesterov ? at::_foreach_add(grads, all_bufs, o.momentum) : all_bufs;
  }
  at::_foreach_add_(s.params, grads, -s.lr);
}

}  // namespace loom::optim
