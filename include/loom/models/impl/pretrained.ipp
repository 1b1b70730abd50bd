#pragma once
// Definitions of models/pretrained.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/pretrained.hpp>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_set>

namespace loom::models::detail {

LOOM_INLINE int64_t count_parameters(const torch::nn::Module& module, bool exclude_embeddings) {
  std::unordered_set<const c10::TensorImpl*> embeddings;
  if (exclude_embeddings)
    for (const auto& m : module.modules(/*include_self=*/false))
      if (dynamic_cast<const torch::nn::EmbeddingImpl*>(m.get()))
        for (const auto& p : m->parameters(/*recurse=*/false)) embeddings.insert(p.unsafeGetTensorImpl());
  int64_t n = 0;
  for (const auto& p : module.parameters())
    if (!embeddings.contains(p.unsafeGetTensorImpl())) n += p.numel();
  return n;
}

LOOM_INLINE void check_parameter_memory(int64_t parameters, double host_bytes, int processes, std::string_view where) {
  const double need = 4.0 * static_cast<double>(parameters), have = host_bytes / std::max(processes, 1);
  if (host_bytes <= 0 || need <= have) return;
  fail("{}: this config gives the model {} parameters, {:.1f} GB in float32 (a model is built in float32 before any "
       "conversion), more than the {:.1f} GB of host memory {}: choose a smaller config",
       where, parameters, need / 1e9, have / 1e9,
       processes > 1 ? fmt::format("each of this machine's {} processes has", processes)
                     : std::string("this machine has (MemTotal, or the cgroup's memory.max)"));
}

LOOM_INLINE torch::ScalarType weights_dtype(const torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    if (p.is_floating_point()) return p.scalar_type();
  return torch::kFloat32;
}

}  // namespace loom::models::detail
