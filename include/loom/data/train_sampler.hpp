#pragma once
// The training sampler the arguments choose (--train_sampling_strategy: a seeded shuffle,
// sequential, or HF's LengthGroupedSampler) and the example lengths that group_by_length reads
// (--length_column_name). The Trainer and the Accelerator build their training loaders on these.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/sampler.hpp>

#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

/// Each example's length for group_by_length: the dataset's lengths() when it has one, else
/// its `column` field (HF's length_column_name), read over the whole dataset.
template <Dataset D>
std::vector<int64_t> example_lengths(const D& dataset, const std::string& column) {
  std::vector<int64_t> out;
  const auto assign_from = [&out](const torch::Tensor& lengths) {
    const auto host = lengths.to(torch::kCPU, torch::kLong).reshape({-1}).contiguous();
    out.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  };
  if constexpr (requires { { dataset.lengths() } -> std::convertible_to<torch::Tensor>; }) {
    assign_from(dataset.lengths());  // a tensor of lengths (TokenSequenceDataset's)
  } else if constexpr (requires { dataset.lengths(); }) {
    for (auto len : dataset.lengths()) out.push_back(static_cast<int64_t>(len));
  } else {
    const int64_t n = dataset.size();
    std::vector<int64_t> all(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    const auto batch = fetch(dataset, all);
    const torch::Tensor* field = field_named(batch, column);
    check(field != nullptr && field->defined(),
          "--train_sampling_strategy group_by_length needs each example's length: a lengths() member of the "
          "training dataset, or a field named {} (--length_column_name)", column);
    assign_from(*field);
  }
  check(static_cast<int64_t>(out.size()) == dataset.size(), "group_by_length: {} lengths for {} examples",
        out.size(), dataset.size());
  return out;
}

/// The training sampler `args` name: seeded shuffle (--data_seed, else --seed), sequential, or
/// HF's LengthGroupedSampler over per_device_train_batch_size x gradient_accumulation_steps on
/// `lengths` (each example's length) for group_by_length.
LOOM_INLINE Sampler train_sampler(const TrainingArguments& args, std::shared_ptr<const std::vector<int64_t>> lengths);

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/train_sampler.ipp>
#endif
