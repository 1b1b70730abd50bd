#pragma once
// The activation estimate of a pre-norm transformer layer stack, which loom::models' causal LMs
// expose as activation_bytes(batch, seq, bytes_per_element, recompute) for the memory plan
// (accelerate/memory_plan.hpp). After Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models", s*b*h*(34 + 5*a*s/h) bytes a layer in 16-bit),
// adapted to what these modules save for backward:
//   per layer and token, in elements of `e` bytes: the norms' inputs and outputs (2h each: two
//   norms, or Gemma 2's and 3's four, the sandwich around attention and MLP),
//   q, k, v as scaled_dot_product_attention saves them (h + 2*kv), its output (h) and the
//   output projection's contiguous input (h), the MLP's saved tensors (`mlp`: GPT-2's fc
//   output and activation output 2f, plus 3f for gelu_new written out as HF writes it, the
//   reference kernels'; Llama's gate, its SiLU, up and their product 4f), Qwen3's per-head q/k
//   norms' inputs and outputs (`qk_norm`: 2 (q + k widths)), dropout masks of
//   1 byte (h per dropout with p > 0), and with attention dropout sdpa's math path: the
//   scaled q and k (2h) and the attention probabilities a*s (e each, before and after the
//   dropout, and a 1-byte mask); with attention soft-capping (Gemma 2: `eager_attention`, the
//   scores written out) the capped scores a*s (e, tanh's output), their softmax a*s (float32,
//   and under a 16-bit format its cast for the product), and k and v repeated to every query
//   head (2 a*d, `query_width` a*d beside the kv width);
//   after the stack: the final norm (2h), the logits (V, in e) and the loss's log-softmax (V,
//   float32). When this thread's forward_request() asks for the loss alone (the Trainer sets
//   it around its estimate as around its training forward), the head sees only the scored
//   positions (counted here as every position, the most there can be): each one's gathered
//   hidden state (h, in e) and, chunked (--chunked_lm_loss, or its default by size), the
//   float32 gradient of its hidden state (4h bytes) instead of its logits and log-softmax.
//   A soft-capped head (Gemma 2's final_logit_softcapping, `head_softcap`) also keeps tanh's
//   output (V, in e) and is never chunked.
// A sparse MoE layer also keeps its experts' gate and up weights joined (`layer_fixed`: 2 x
// width x hidden an expert, whatever the tokens), the operand of the one product it runs when
// a backward may follow.
// recompute (--gradient_checkpointing): each layer keeps its input (h) and one layer's
// activations are live again during its backward.

#include <loom/core/forward_request.hpp>

#include <cstdint>

namespace loom::models {

/// The sizes the estimate reads.
struct ActivationShape {
  int64_t layers = 0, hidden = 0, kv = 0, mlp = 0, heads = 0, vocab = 0;
  int64_t qk_norm = 0;          ///< elements a token of the q/k norms save (Qwen3; 0 without them)
  int norms = 2;                ///< RMSNorms / LayerNorms in a layer (Gemma 2 and 3: 4)
  bool eager_attention = false;  ///< attention written out, scores kept (attention soft-capping)
  int64_t query_width = 0;      ///< heads * head_dim (eager_attention's repeated k and v; 0: hidden)
  bool head_softcap = false;    ///< the LM head's logits soft-capped (tanh's output kept; never chunked)
  int dropouts = 0;             ///< dropouts with p > 0 in a layer (their 1-byte masks, h each)
  bool attention_dropout = false;
  bool loss_only_head = false;  ///< a causal LM's head, which honours forward_request() (causal_lm_output)
  /// Elements a layer saves whatever the tokens, averaged over the layers (a sparse MoE
  /// block's experts' gate and up weights joined for one product, kept for the backward).
  int64_t layer_fixed = 0;
};

/// One micro-batch's saved activations in bytes (see the file comment).
inline double transformer_activation_bytes(const ActivationShape& m, int64_t batch, int64_t seq, int64_t e,
                                           bool recompute) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
  double layer = static_cast<double>(e) * (2.0 * m.norms * m.hidden + m.hidden + 2.0 * m.kv + 2.0 * m.hidden + m.mlp +
                                           static_cast<double>(m.qk_norm)) +
                 static_cast<double>(m.dropouts) * m.hidden;
  if (m.eager_attention) {
    const double scores = static_cast<double>(m.heads) * seq;
    const double width = static_cast<double>(m.query_width > 0 ? m.query_width : m.hidden);
    layer += scores * (e + 4.0 + (e < 4 ? e : 0)) + 2.0 * e * (width - m.kv);
    if (m.attention_dropout) layer += scores * (e + 1.0);  // the dropped weights and their mask
  } else if (m.attention_dropout) {
    layer += static_cast<double>(m.heads) * seq * (2.0 * e + 1) + 2.0 * e * m.hidden;
  }
  const double capped = m.head_softcap ? static_cast<double>(e) * m.vocab : 0.0;
  double head = static_cast<double>(e) * 2.0 * m.hidden + (e + 4.0) * m.vocab + capped;
  if (const ForwardRequest& request = forward_request(); !request.logits && m.loss_only_head) {
    const bool chunked = !m.head_softcap &&
                         request.chunked_lm_loss.value_or(chunked_lm_loss_by_default(batch * seq, m.vocab));
    head = static_cast<double>(e) * 3.0 * m.hidden + (chunked ? 4.0 * m.hidden : (e + 4.0) * m.vocab + capped);
  }
  const double stack = recompute ? static_cast<double>(e) * m.hidden * m.layers + layer : layer * m.layers;
  const double fixed = static_cast<double>(e) * static_cast<double>(m.layer_fixed) * (recompute ? 1 : m.layers);
  return tokens * (stack + head) + fixed;
}

}  // namespace loom::models
