#pragma once
// What every causal language model here shares (GPT-2 now, the families to come): the
// output of forward(batch) and transformers' causal LM loss (ForCausalLMLoss).
//
// The key/value cache of generation (models/generation.hpp) is here too: the per-layer store
// and the step a causal LM's next_token_logits takes, which its attention modules read.
//
// The loss is the mean over the scored tokens, as transformers' models compute it when called
// without num_items_in_batch; in a training forward of loom's Trainer, which hands the
// accumulation group's count over in forward_request(), the summed token loss divided by it,
// as transformers' ForCausalLMLoss with num_items_in_batch (the Trainer then divides by
// nothing more).

#include <loom/config/inline.hpp>
#include <loom/core/forward_request.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

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
/// extra columns of -inf (a padded vocabulary), which change nothing. With
/// `num_items_in_batch` (a scalar count): the summed token loss divided by it instead
/// (transformers' ForCausalLMLoss given num_items_in_batch).
LOOM_INLINE torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels,
                                         bool fused_upcast = false, const torch::Tensor& num_items_in_batch = {});

/// The LM head's logits of `hidden` [.., hidden] by `weight` [vocab, hidden] (no bias). With
/// `fast` and a vocabulary not a multiple of 64, the product runs over the vocabulary padded
/// to one (cuBLAS's fast kernels need the alignment): [.., padded] whose extra columns are
/// -inf, so a softmax over all of them is the vocabulary's; callers show the first vocab
/// columns and give the whole to causal_lm_loss. Else [.., vocab], as a linear layer.
/// `softcap` (Gemma 2's final_logit_softcapping): the logits soft-capped as transformers caps
/// them, tanh(logits / softcap) * softcap, over the vocabulary alone (never padded: a capped
/// -inf column would be -softcap).
LOOM_INLINE torch::Tensor lm_head_logits(const torch::Tensor& hidden, const torch::Tensor& weight, bool fast,
                                         std::optional<double> softcap = std::nullopt);

/// The LM head and the cross-entropy in one, over chunks of rows (Liger's fused linear
/// cross-entropy): the mean over the rows whose target is not -100 of -log softmax(hidden @
/// weight^T)[target], for hidden [n, h], weight [vocab, h] and int64 targets [n]. It never
/// holds more than one chunk's logits (`chunk_rows` rows, 0: chunked_lm_loss_rows): the
/// forward computes each chunk's gradients with respect to `hidden` and `weight` (those that
/// require one, when grad mode is on) and backward scales them by the loss's gradient, so the
/// products are the unchunked loss's three, and no logits are kept for backward. Under
/// autocast the products run in its format and the softmax in float32, as the unchunked loss.
/// `fast`: the product over the vocabulary padded to 64 (lm_head_logits). Differentiable once.
LOOM_INLINE torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                               const torch::Tensor& targets, bool fast, int64_t chunk_rows = 0);

/// causal_lm_loss of the logits lm_head_logits(hidden, weight, fast) would give, computed at
/// the scored positions only (shifted label not -100): their hidden states are gathered and
/// go through the head, the others never do (the reference path multiplies at least 4 rows,
/// adding unscored ones: a product of 1 to 3 rows rounds otherwise on the CPU). Unchunked, the same value as causal_lm_loss
/// (the per-position log-probabilities are reduced in the order nll_loss reduces all of
/// them); `chunked` (nullopt: chunked_lm_loss_by_default): linear_cross_entropy, within
/// float32 rounding of it. hidden [batch, seq, h], labels [batch, seq]. One host sync (the
/// count of scored positions). With `softcap` (lm_head_logits') the loss is never chunked (the
/// chunked kernels have no cap): the default takes the unchunked form and `chunked` true is a
/// loom::Error. `num_items_in_batch`: as causal_lm_loss's (chunked: the mean rescaled by the
/// scored count over it).
LOOM_INLINE torch::Tensor scored_causal_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                const torch::Tensor& labels, bool fast,
                                                std::optional<bool> chunked = std::nullopt,
                                                std::optional<double> softcap = std::nullopt,
                                                const torch::Tensor& num_items_in_batch = {});

/// What a causal LM gives each of its labels (TRL's fused LM head outputs), float32
/// [batch, seq]: position t scores labels[t + 1] (as the loss does); 0 where that label is -100,
/// and at each row's last position.
struct TokenScores {
  torch::Tensor log_probs;    ///< log p(label): differentiable (what DPO sums over each completion)
  torch::Tensor entropy;      ///< the entropy of the next-token distribution (no gradient; with statistics)
  torch::Tensor mean_logits;  ///< the logits' mean over the vocabulary (no gradient; with statistics)
  torch::Tensor is_top1;      ///< bool: the label is the first most likely token (with statistics)
};

/// TokenScores of hidden [batch, seq, h] by the head `weight` [vocab, h] and `labels`
/// [batch, seq], the head at the scored positions only (as scored_causal_lm_loss); with
/// `statistics`, the entropy, mean logit and top-1 fields too (else undefined). `chunked`
/// (nullopt: chunked_lm_loss_by_default): the scored rows go through the head in chunks and
/// backward recomputes each chunk's logits, so the [scored, vocab] float32 logits are never
/// held (TRL's chunked log-probabilities); unchunked, log_probs are log_softmax's bit for bit,
/// chunked within float32 rounding. One host sync. `softcap`: as scored_causal_lm_loss's.
LOOM_INLINE TokenScores token_scores(const torch::Tensor& hidden, const torch::Tensor& weight,
                                     const torch::Tensor& labels, bool fast, bool statistics = false,
                                     std::optional<bool> chunked = std::nullopt,
                                     std::optional<double> softcap = std::nullopt);

/// A causal LM's output from its last hidden states: the logits of lm_head_logits(hidden,
/// weight, fast), shown with vocab_size = weight.size(0) columns, and, when `labels` is
/// defined, causal_lm_loss over all of them. Every causal LM's forward(batch) and logits().
/// When this thread's forward_request() asks for the loss alone (the Trainer's training
/// forward), a batch with labels gets scored_causal_lm_loss and no logits; its
/// num_items_in_batch, when defined, divides the summed loss. `softcap`: the
/// final logit soft-cap (lm_head_logits').
LOOM_INLINE CausalLMOutput causal_lm_output(const torch::Tensor& hidden, const torch::Tensor& weight,
                                            const torch::Tensor& labels, bool fast,
                                            std::optional<double> softcap = std::nullopt);

/// One layer's keys and values so far (transformers' DynamicLayer): [batch, kv_heads, seen,
/// head_dim] each, undefined before the first step.
struct LayerCache {
  torch::Tensor keys;    ///< the keys of every position seen, after the rotary embedding where there is one
  torch::Tensor values;  ///< the values of every position seen
  /// Appends this step's keys and values (along the positions, as DynamicLayer.update) and
  /// returns all of them.
  LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> update(const torch::Tensor& k, const torch::Tensor& v);
};

/// The key/value cache of a causal LM (transformers' DynamicCache): one LayerCache a layer,
/// filled by the first step (the prompt) and grown by one position each step after it.
struct KVCache {
  std::vector<LayerCache> layers;  ///< one per layer (sized by the model's first step)
  /// Positions stored (0 before the first step).
  [[nodiscard]] int64_t seq_length() const {
    return layers.empty() || !layers[0].keys.defined() ? 0 : layers[0].keys.size(2);
  }
};

/// What one attention module gets in a decoding step: the mask of this step (undefined:
/// causal attention, no padding) and its layer's cache (nullptr: no cache).
struct AttentionStep {
  torch::Tensor mask{};        ///< bool [batch, 1, query, key]: true where a query may attend
  LayerCache* cache = nullptr;  ///< keys and values of the earlier positions
  /// The mask as sdpa's attn_mask argument (nullopt when undefined).
  [[nodiscard]] std::optional<torch::Tensor> sdpa_mask() const {
    return mask.defined() ? std::optional<torch::Tensor>(mask) : std::nullopt;
  }
};

/// One forward of generation (a causal LM's next_token_logits): the new tokens and their
/// positions, the attention mask of every position so far, and the cache.
struct DecodeStep {
  torch::Tensor input_ids{};       ///< int64 [batch, query]: the prompt, then one token a step (all, without a cache)
  torch::Tensor position_ids{};    ///< int64 [batch, query]: counted from each row's first real token
  torch::Tensor attention_mask{};  ///< int64 [batch, cache + query]: 0 on left padding; undefined when there is none
  KVCache* cache = nullptr;        ///< nullptr: no cache (the whole sequence each step)
};

/// The attention mask of a whole padded batch, as transformers' sdpa path makes it: undefined
/// when `attention_mask` is (or nothing is padded), else step_attention_mask over the batch's
/// positions: causal and off the padding. A shape other than input_ids' is a loom::Error.
LOOM_INLINE torch::Tensor padding_attention_mask(const torch::Tensor& attention_mask, const torch::Tensor& input_ids);

/// The attention mask of a step as transformers' create_causal_mask makes it for sdpa:
/// undefined where no padding and sdpa's is_causal (or a query of one) suffice, else bool
/// [batch, 1, query, key]: causal (key position <= query position, the query offset by the
/// keys already cached) and not on padding. `attention_mask`: int64 [batch, key] or undefined.
LOOM_INLINE torch::Tensor step_attention_mask(const torch::Tensor& attention_mask, int64_t query, int64_t keys,
                                              const torch::Device& device);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/causal_lm.ipp>
#endif
