#pragma once
// Definitions of models/pretrained.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/pretrained.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_set>

namespace loom::models::detail {

LOOM_INLINE int64_t count_parameters(const torch::nn::Module& module, bool exclude_embeddings) {
  std::unordered_set<const c10::TensorImpl*> embeddings;
  if (exclude_embeddings)
    for (const auto& m : module.modules(/*include_self=*/false)) {
      // An embedding wrapped as a FullShard unit: the wrapper holds its parameters.
      const auto* unit = dynamic_cast<const dist::FullShardUnitBase*>(m.get());
      if (dynamic_cast<const torch::nn::EmbeddingImpl*>(unit != nullptr ? &unit->block() : m.get()))
        for (const auto& p : m->parameters(/*recurse=*/false)) embeddings.insert(p.unsafeGetTensorImpl());
    }
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

LOOM_INLINE uint64_t draw_init_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

LOOM_INLINE at::Generator parameter_generator(uint64_t seed, const std::string& name) {
  // FNV-1a of the name, mixed with the model's seed by splitmix64's finalizer.
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : name) h = (h ^ c) * 0x100000001b3ULL;
  uint64_t z = seed ^ h;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return at::make_generator<at::CPUGeneratorImpl>(z);
}

LOOM_INLINE KeepCpuGeneratorState::KeepCpuGeneratorState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  state_ = gen.get_state();
}

LOOM_INLINE KeepCpuGeneratorState::~KeepCpuGeneratorState() {
  auto gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state_);
}

}  // namespace loom::models::detail
