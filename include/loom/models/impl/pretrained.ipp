#pragma once
// Definitions of models/pretrained.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/models/pretrained.hpp>

#include <torch/torch.h>

#include <cstdint>
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

LOOM_INLINE torch::ScalarType weights_dtype(const torch::nn::Module& module) {
  for (const auto& p : module.parameters())
    if (p.is_floating_point()) return p.scalar_type();
  return torch::kFloat32;
}

}  // namespace loom::models::detail
