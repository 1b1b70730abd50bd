#pragma once
// Definitions of data/train_sampler.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/data/train_sampler.hpp>

#include <utility>

namespace loom::data {

LOOM_INLINE Sampler train_sampler(const TrainingArguments& args, std::shared_ptr<const std::vector<int64_t>> lengths) {
  const int64_t seed = args.data_seed.value_or(args.seed);
  if (args.train_sampling_strategy == "sequential") return SequentialSampler{};
  if (args.train_sampling_strategy == "group_by_length") {
    check(lengths != nullptr, "--train_sampling_strategy group_by_length needs each example's length");
    return LengthGroupedSampler{seed, args.per_device_train_batch_size * args.gradient_accumulation_steps,
                                std::move(lengths)};
  }
  return RandomSampler{seed};
}

}  // namespace loom::data
