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
  /// int64 [batch, seq], 1 on tokens and 0 on padding, or undefined (no padding to mask): a
  /// model that takes it keeps queries off the padding, and a sparse MoE model's load-balancing
  /// loss counts the tokens only (transformers' attention_mask).
  torch::Tensor attention_mask{};
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

/// The tokens a causal-LM batch's loss averages over: position t predicts labels[t + 1], so
/// labels[:, 1:] != -100 (what HF's Trainer counts as num_items_in_batch for a causal LM, and
/// loom's Trainer's num_items for CausalLMBatch: accumulation and data parallelism then
/// normalize by the tokens of the whole global batch).
inline int64_t predicted_tokens(const CausalLMBatch& batch) {
  if (batch.labels.dim() != 2 || batch.labels.size(1) < 2) return 0;
  const auto targets = batch.labels.narrow(1, 1, batch.labels.size(1) - 1);
  return targets.ne(ignore_index).sum().template item<int64_t>();
}

}  // namespace loom::data
