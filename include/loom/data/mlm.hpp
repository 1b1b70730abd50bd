#pragma once
// Masked-language-model data: the masking rule of transformers' DataCollatorForLanguageModeling
// (mlm=True), over batches of token sequences (SequenceBatch: input_ids, attention_mask).
//
//   auto train = loom::data::MaskedLMDataset(sequences, {.mask_token_id = meta.mask_token_id.value(),
//                                                        .vocab_size = meta.vocab_size,
//                                                        .special_token_ids = {pad, cls, sep, mask},
//                                                        .seed = args.seed});
//
// The rule, drawn in HF's order from one generator: each token is selected with probability
// mlm_probability, except special tokens and padding (attention_mask 0), which never are;
// labels keep the selected tokens' ids and are -100 elsewhere; of the selected tokens,
// mask_replace_prob become [MASK], random_replace_prob (of all selected) become a token drawn
// uniformly from [0, vocab_size), and the rest stay as they are (80 / 10 / 10 by default).
//
// Where HF draws from one generator across batches (so a batch's mask depends on every
// batch read before it, and on the worker that reads it), each batch here has a generator of
// its own, seeded from (seed, epoch, the batch's index in the epoch): the same batch gets the
// same mask on any thread, at any number of dataloader workers, and after a resume, while
// each epoch masks its examples anew (HF's dynamic masking). mask_tokens() is the rule itself
// on a given generator: seeded as HF's collator's `seed`, it draws exactly what HF's
// torch_mask_tokens draws for that batch.

#include <loom/config/inline.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/text.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace loom::data {

/// DataCollatorForLanguageModeling's masking settings (HF's names and defaults).
struct MaskedLMOptions {
  double mlm_probability = 0.15;       ///< share of the (non-special) tokens selected for prediction
  double mask_replace_prob = 0.8;      ///< share of the selected tokens replaced by [MASK]
  double random_replace_prob = 0.1;    ///< share of the selected tokens replaced by a random token
  int64_t mask_token_id = -1;          ///< the [MASK] id (required)
  int64_t vocab_size = 0;              ///< random replacements are drawn from [0, vocab_size) (HF: len(tokenizer))
  std::vector<int64_t> special_token_ids;  ///< never selected (HF: the tokenizer's special tokens); padding never is
  uint64_t seed = 42;                  ///< the masks' seed (give the run's --seed or --data_seed)
};

/// Checks `options` as HF's collator does (probabilities in [0, 1], mask + random <= 1) and
/// that the ids lie in the vocabulary; a loom::Error names the field.
LOOM_INLINE void validate(const MaskedLMOptions& options);

/// Masked inputs and their labels.
struct MaskedTokens {
  torch::Tensor input_ids;  ///< the ids with the selected tokens replaced
  torch::Tensor labels;     ///< the original ids of the selected tokens, -100 elsewhere
};

/// HF's torch_mask_tokens on int64 `input_ids` [batch, seq] (CPU), where `never` (bool, the same
/// shape) marks the tokens that are never selected, drawing from `generator` in HF's order.
LOOM_INLINE MaskedTokens mask_tokens(const torch::Tensor& input_ids, const torch::Tensor& never,
                                     const MaskedLMOptions& options, at::Generator generator);

/// The tokens of `input_ids` that are never selected: the special ids, and, when
/// `attention_mask` is defined, the padding.
LOOM_INLINE torch::Tensor never_masked(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                       const std::vector<int64_t>& special_token_ids);

/// The generator of the batch at `place` under `seed` (a CPU generator seeded by mixing the three).
LOOM_INLINE at::Generator batch_generator(uint64_t seed, BatchPlace place);

/// `batch` masked for masked-LM training at `place`: input_ids masked, labels [batch, seq] as
/// mask_tokens gives them (any labels the batch had are replaced).
LOOM_INLINE SequenceBatch mask_batch(SequenceBatch batch, const MaskedLMOptions& options, BatchPlace place);

/// A dataset of token sequences (batches of SequenceBatch) served masked for masked-LM
/// training, each batch masked by its own generator (see the header comment).
template <Dataset D>
  requires std::same_as<batch_t<D>, SequenceBatch>
class MaskedLMDataset {
 public:
  /// `dataset`'s batches, masked under `options` (checked here).
  MaskedLMDataset(D dataset, MaskedLMOptions options) : dataset_(std::move(dataset)), options_(std::move(options)) {
    validate(options_);
  }
  /// Examples in the wrapped dataset.
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(dataset_.size()); }
  /// The masked batch of rows `indices` at `place`.
  [[nodiscard]] SequenceBatch get_batch(std::span<const int64_t> indices, BatchPlace place) const {
    return mask_batch(fetch(dataset_, indices, place), options_, place);
  }
  /// The wrapped dataset.
  [[nodiscard]] const D& dataset() const { return dataset_; }
  /// The masking settings.
  [[nodiscard]] const MaskedLMOptions& options() const { return options_; }

 private:
  D dataset_;
  MaskedLMOptions options_;
};

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/mlm.ipp>
#endif
