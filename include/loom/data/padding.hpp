#pragma once
// Padding variable-length token sequences into one batch: transformers'
// DataCollatorWithPadding (one label per sequence) and DataCollatorForTokenClassification
// (one label per token) in one collator. A dataset of TokenSequence examples batches them
// with it through its collate() (data/token_file.hpp's TokenSequenceDataset) or through
// with_collator(dataset, DataCollatorWithPadding{...}) (data/dataset.hpp).

#include <loom/config/inline.hpp>
#include <loom/data/text.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <span>

namespace loom::data {

/// One tokenized example before padding.
struct TokenSequence {
  torch::Tensor input_ids;  ///< integer [length]
  torch::Tensor labels;     ///< one label (0-dim), a float row ([num_labels]), integer ones per token ([length]), or undefined
};

/// Which end of a sequence the padding goes to (HF's tokenizer.padding_side).
enum class PaddingSide { right, left };

/// How long a padded batch is (HF's padding strategies that give a tensor).
enum class PaddingStrategy {
  longest,     ///< the longest sequence of the batch (HF's padding=True / "longest")
  max_length,  ///< `max_length` ids (HF's padding="max_length")
};

/// Pads a batch of TokenSequence into a SequenceBatch, with the semantics of transformers'
/// DataCollatorWithPadding (and DataCollatorForTokenClassification's label padding):
/// - the length is the longest sequence (or max_length), rounded up to a multiple of
///   `pad_to_multiple_of` when given;
/// - input_ids are padded with `pad_token_id`, attention_mask is 1 on tokens and 0 on padding,
///   both int64, on `padding_side`;
/// - labels: one per sequence are stacked (their dtype kept: int64 classes, float
///   regression) and so are floating-point rows (multi-hot or regression targets: [B,
///   num_labels]); integer ones per token (as long as the sequence) are padded with
///   `label_pad_token_id` (-100) on the same side; undefined in every example stays undefined.
/// A sequence longer than max_length under PaddingStrategy::max_length is an error (HF would
/// return ragged lists): truncate first (TokenSequenceDataset's max_length).
struct DataCollatorWithPadding {
  int64_t pad_token_id = 0;                             ///< the id padding is made of
  PaddingStrategy padding = PaddingStrategy::longest;   ///< the batch's length
  std::optional<int64_t> max_length;                    ///< the length under PaddingStrategy::max_length
  std::optional<int64_t> pad_to_multiple_of;            ///< round the length up to a multiple of this
  PaddingSide padding_side = PaddingSide::right;        ///< where padding goes
  int64_t label_pad_token_id = ignore_index;            ///< per-token labels' padding (-100)

  /// The padded batch of `examples` (at least one).
  LOOM_INLINE SequenceBatch operator()(std::span<const TokenSequence> examples) const;
  /// The length of a batch whose longest example has `longest` tokens: max_length under
  /// PaddingStrategy::max_length, rounded up to pad_to_multiple_of.
  [[nodiscard]] LOOM_INLINE int64_t padded_length(int64_t longest) const;
};

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/padding.ipp>
#endif
