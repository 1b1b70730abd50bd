#pragma once
// What every causal language model here shares (GPT-2 now, the families to come): the
// output of forward(batch) and transformers' causal LM loss (ForCausalLMLoss).
//
// The loss is always the mean over the scored tokens, as transformers' models compute it
// when called without num_items_in_batch: loom's Trainer weights micro-batches and ranks by
// their items itself (Accelerator::item_factor), so no model divides by a batch-wide count.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

namespace loom::models {

/// What a causal LM's forward(batch) returns (loom's default compute_loss and
/// prediction_step read `loss` and `logits`): transformers' CausalLMOutput.
struct CausalLMOutput {
  torch::Tensor loss;    ///< HF's causal LM loss (undefined when the batch has no labels)
  torch::Tensor logits;  ///< [batch, seq, vocab_size]
};

/// HF's causal LM loss: logits at position t predict labels[t + 1]; -100 is ignored; the mean
/// over the counted tokens, in float32. With `fused_upcast`, float16 CUDA logits go into the
/// log-softmax kernel as they are and come out in float32 (the same function as
/// transformers' upcast first, without a float32 copy of the logits); the logits may carry
/// extra columns of -inf (a padded vocabulary), which change nothing.
LOOM_INLINE torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                         bool fused_upcast = false);

/// The LM head's logits of `hidden` [.., hidden] by `weight` [vocab, hidden] (no bias). With
/// `fast` and a vocabulary not a multiple of 64, the product runs over the vocabulary padded
/// to one (cuBLAS's fast kernels need the alignment): [.., padded] whose extra columns are
/// -inf, so a softmax over all of them is the vocabulary's; callers show the first vocab
/// columns and give the whole to causal_lm_loss. Else [.., vocab], as a linear layer.
LOOM_INLINE torch::Tensor lm_head_logits(const torch::Tensor& hidden, const torch::Tensor& weight, bool fast);

/// A causal LM's output from its last hidden states: the logits of lm_head_logits(hidden,
/// weight, fast), shown with vocab_size = weight.size(0) columns, and, when `labels` is
/// defined, causal_lm_loss over all of them. Every causal LM's forward(batch) and logits().
LOOM_INLINE CausalLMOutput causal_lm_output(const torch::Tensor& hidden, const torch::Tensor& weight,
                                            const torch::Tensor& labels, bool fast);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/causal_lm.ipp>
#endif
