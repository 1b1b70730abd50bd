#pragma once
// Batches of token ids, as Hugging Face's text models take them. The datasets that serve
// them (token files, padded sequences) and the models that read them (loom/models/) agree
// on these field names, which are HF's.
#include <torch/torch.h>

namespace loom::data {

/// A causal language-model batch: `labels` equals `input_ids` where it counts (the model
/// shifts by one, as HF's *ForCausalLM do) and is -100 where it is ignored.
struct CausalLMBatch {
  torch::Tensor input_ids;  ///< int64 [batch, seq]
  torch::Tensor labels;     ///< int64 [batch, seq], -100 ignored
  /// int64 [batch, seq], or undefined (positions 0 .. seq-1). Packed sequences: the positions
  /// restart at 0 where a document starts, and a model that takes them attends within each
  /// document only (HF's position_ids, as TRL's padding-free packing hands them over).
  torch::Tensor position_ids{};
};

/// A padded batch of token sequences with one label per sequence (single-label
/// classification: int64 [batch]; regression with one target: float [batch]; multi-label
/// multi-hot rows or several regression targets: float [batch, num_labels]) or per token
/// (int64 [batch, seq], -100 ignored).
struct SequenceBatch {
  torch::Tensor input_ids;       ///< int64 [batch, seq], padded with the pad id
  torch::Tensor attention_mask;  ///< int64 [batch, seq]: 1 on tokens, 0 on padding
  torch::Tensor labels;          ///< see above; undefined for unlabeled data
};

/// The label value ignored by the losses and by evaluation padding (HF's -100).
inline constexpr int64_t ignore_index = -100;

}  // namespace loom::data
