#pragma once
// Definitions of data/mlm.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/data/mlm.hpp>

#include <ATen/CPUGeneratorImpl.h>

namespace loom::data {

LOOM_INLINE void validate(const MaskedLMOptions& o) {
  const auto probability = [](double p, const char* name) {
    check(p >= 0.0 && p <= 1.0, "masked-LM option {} must lie in [0, 1], got {}", name, p);
  };
  probability(o.mlm_probability, "mlm_probability");
  probability(o.mask_replace_prob, "mask_replace_prob");
  probability(o.random_replace_prob, "random_replace_prob");
  check(o.mask_replace_prob + o.random_replace_prob <= 1.0,
        "masked-LM options mask_replace_prob ({}) and random_replace_prob ({}) add up to more than 1",
        o.mask_replace_prob, o.random_replace_prob);
  check(o.vocab_size > 0, "masked-LM option vocab_size must be positive (the tokenizer's size), got {}", o.vocab_size);
  check(o.mask_token_id >= 0 && o.mask_token_id < o.vocab_size,
        "masked-LM option mask_token_id ({}) must be a token of the vocabulary [0, {}); the data's meta.json names "
        "it as mask_token_id",
        o.mask_token_id, o.vocab_size);
  for (const int64_t id : o.special_token_ids)
    check(id >= 0 && id < o.vocab_size, "masked-LM special token id {} is outside the vocabulary [0, {})", id,
          o.vocab_size);
}

LOOM_INLINE MaskedTokens mask_tokens(const torch::Tensor& input_ids, const torch::Tensor& never,
                                     const MaskedLMOptions& o, at::Generator gen) {
  check(input_ids.dim() == 2 && input_ids.scalar_type() == torch::kLong && input_ids.device().is_cpu(),
        "mask_tokens takes int64 CPU input_ids [batch, seq], got {} {} on {}", c10::toString(input_ids.scalar_type()),
        c10::str(input_ids.sizes()), c10::str(input_ids.device()));
  check(never.sizes() == input_ids.sizes(), "mask_tokens: the never-masked marks have shape {} but input_ids {}",
        c10::str(never.sizes()), c10::str(input_ids.sizes()));
  // HF's order of draws: selection, [MASK] replacement, random replacement, the random words.
  auto inputs = input_ids.clone();
  auto labels = input_ids.clone();
  const auto shape = labels.sizes();
  const auto full = [&](double p) { return torch::full(shape, p, torch::kFloat); };
  auto probability = full(o.mlm_probability);
  probability.masked_fill_(never.to(torch::kBool), 0.0);
  const auto selected = at::bernoulli(probability, gen).to(torch::kBool);
  labels.masked_fill_(selected.logical_not(), ignore_index);
  const auto replaced = at::bernoulli(full(o.mask_replace_prob), gen).to(torch::kBool).logical_and(selected);
  inputs.masked_fill_(replaced, o.mask_token_id);
  if (o.mask_replace_prob == 1.0 || o.random_replace_prob == 0.0) return {inputs, labels};
  const double scaled = o.random_replace_prob / (1.0 - o.mask_replace_prob);
  const auto random =
      at::bernoulli(full(scaled), gen).to(torch::kBool).logical_and(selected).logical_and(replaced.logical_not());
  const auto words = at::randint(o.vocab_size, shape, gen, torch::TensorOptions().dtype(torch::kLong));
  inputs = torch::where(random, words, inputs);
  return {inputs, labels};
}

LOOM_INLINE torch::Tensor never_masked(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                       const std::vector<int64_t>& special_token_ids) {
  auto never = torch::zeros(input_ids.sizes(), torch::kBool);
  if (!special_token_ids.empty())
    never = torch::isin(input_ids, torch::tensor(special_token_ids, torch::kLong));
  if (attention_mask.defined()) never = never.logical_or(attention_mask.eq(0));
  return never;
}

LOOM_INLINE at::Generator batch_generator(uint64_t seed, BatchPlace place) {
  // splitmix64's finalizer over the three, so nearby seeds, epochs and batches give unrelated streams.
  const auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  const uint64_t s = mix(mix(mix(seed) ^ static_cast<uint64_t>(place.epoch)) ^ static_cast<uint64_t>(place.index));
  return at::make_generator<at::CPUGeneratorImpl>(s);
}

LOOM_INLINE SequenceBatch mask_batch(SequenceBatch batch, const MaskedLMOptions& o, BatchPlace place) {
  check(batch.input_ids.defined(), "masked-LM data needs input_ids");
  const auto ids = batch.input_ids.to(torch::kLong);
  const auto never = never_masked(ids, batch.attention_mask, o.special_token_ids);
  auto masked = mask_tokens(ids, never, o, batch_generator(o.seed, place));
  batch.input_ids = std::move(masked.input_ids);
  batch.labels = std::move(masked.labels);
  return batch;
}

}  // namespace loom::data
