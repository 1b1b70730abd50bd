#pragma once
// Definitions of optim/rule.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>
#include <vector>

namespace loom::optim {

LOOM_INLINE std::vector<torch::Tensor> GroupStep::state_of(std::string_view kind) const {
  std::vector<torch::Tensor> out;
  for (auto i : slots)
    for (const auto& [k, t] : state[i])
      if (k == kind) out.push_back(t);
  return out;
}

LOOM_INLINE torch::Tensor zeros_like_param(const torch::Tensor& p) {
  return torch::zeros_like(p, torch::MemoryFormat::Preserve);
}

LOOM_INLINE torch::Tensor step_count(const torch::Tensor& p) {
  return torch::zeros({}, p.options().dtype(torch::kFloat));
}

}  // namespace loom::optim
