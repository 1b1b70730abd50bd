#pragma once
// Index orders. The training order of epoch e is torch::randperm(N) drawn from a CPU
// generator seeded with seed + e: the order accelerate's seedable sampler (what HF Trainer
// uses) produces, so one seed gives the same batches in loom and in Python.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>

namespace loom::data {

/// The permutation of [0, n) for `epoch` under `seed` (randperm from a generator seeded seed + epoch).
inline torch::Tensor seeded_permutation(int64_t n, int64_t seed, int64_t epoch) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed + epoch));
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
}

/// Seeded random order, reshuffled each epoch.
struct RandomSampler {
  int64_t seed = 42;  ///< base seed (data_seed when given, else seed)
  /// The order of `n` indices in `epoch`.
  [[nodiscard]] torch::Tensor order(int64_t n, int64_t epoch) const { return seeded_permutation(n, seed, epoch); }
};

/// 0, 1, ..., n-1 every epoch (evaluation).
struct SequentialSampler {
  /// The order of `n` indices (any epoch).
  [[nodiscard]] torch::Tensor order(int64_t n, int64_t /*epoch*/) const {
    return torch::arange(n, torch::TensorOptions().dtype(torch::kLong));
  }
};

}  // namespace loom::data
