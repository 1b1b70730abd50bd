#pragma once
// Index orders. The training order of epoch e is torch::randperm(N) drawn from a CPU
// generator seeded with seed + e: the order accelerate's seedable sampler (what HF Trainer
// uses) produces, so one seed gives the same batches in loom and in Python.

#include <loom/core/error.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <variant>
#include <vector>

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

/// HF's get_length_grouped_indices over `lengths` for `batch_size` (HF passes the per-device
/// batch times gradient_accumulation_steps): the permutation `perm` cut into megabatches of
/// mult * batch_size, mult = min(n / (4 * batch_size), 50) (at least 1), each sorted by length,
/// longest first (stable), then the first element of the megabatch holding the longest
/// sequence swapped with the first of the first megabatch, so the first batch is the longest.
inline torch::Tensor length_grouped_order(const std::vector<int64_t>& lengths, int64_t batch_size,
                                          const torch::Tensor& perm) {
  const auto n = static_cast<int64_t>(lengths.size());
  int64_t mult = std::min<int64_t>(n / (batch_size * 4), 50);
  if (mult == 0) mult = 1;
  const int64_t mega = mult * batch_size;
  auto order = perm.to(torch::kLong).contiguous().clone();
  int64_t* idx = order.data_ptr<int64_t>();
  const auto len = [&](int64_t i) { return lengths[static_cast<std::size_t>(i)]; };
  int64_t best_start = 0, best_len = -1;
  for (int64_t start = 0; start < n; start += mega) {
    const int64_t end = std::min(start + mega, n);
    std::stable_sort(idx + start, idx + end, [&](int64_t a, int64_t b) { return len(a) > len(b); });
    if (len(idx[start]) > best_len) {  // the first megabatch holding the longest (torch.argmax)
      best_len = len(idx[start]);
      best_start = start;
    }
  }
  if (n > 0) std::swap(idx[0], idx[best_start]);
  return order;
}

/// HF's LengthGroupedSampler (--train_sampling_strategy group_by_length): each epoch, the
/// seeded permutation of RandomSampler grouped by length_grouped_order. Under a Shard, every
/// rank reads the same order (rank r its batches r, r+W, ...), as with the random order.
struct LengthGroupedSampler {
  int64_t seed = 42;        ///< base seed (data_seed when given, else seed)
  int64_t batch_size = 1;   ///< per-device batch times gradient_accumulation_steps
  std::shared_ptr<const std::vector<int64_t>> lengths;  ///< each example's length
  /// The order of `n` indices in `epoch`.
  [[nodiscard]] torch::Tensor order(int64_t n, int64_t epoch) const {
    check(lengths && static_cast<int64_t>(lengths->size()) == n,
          "group_by_length: {} lengths for a dataset of {} examples", lengths ? lengths->size() : 0, n);
    return length_grouped_order(*lengths, batch_size, seeded_permutation(n, seed, epoch));
  }
};

/// The orders a DataLoader can read in.
using Sampler = std::variant<RandomSampler, SequentialSampler, LengthGroupedSampler>;

}  // namespace loom::data
