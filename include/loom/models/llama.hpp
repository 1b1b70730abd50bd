#pragma once
// The Llama architecture (transformers' LlamaForCausalLM), which also serves the Qwen2, Qwen3,
// Mistral, Phi-3, Gemma, Gemma 2 and Gemma 3 text configs: the families differ in a few facts,
// one row each of kLlamaFamilies (Qwen2: bias on q/k/v; Qwen3: an RMSNorm on each head of q and
// k; Mistral: a sliding window; Phi-3: fused projections; Gemma: (1 + w) norms and scaled
// embeddings; Gemma 2: sandwich norms, soft-caps, sliding and full layers alternating; Gemma 3:
// Gemma 2's layers with q/k norms and a rope per layer type). HF's parameter names and
// config.json, so an HF folder loads into it and what it saves opens in transformers as the
// same class.
//
//   auto model = loom::models::LlamaForCausalLM::from_pretrained("llama-folder");
//   loom::models::LlamaConfig c;  c.hidden_size = 256; ...;  loom::models::LlamaForCausalLM model(c);
//   model->save_pretrained("out");  // config.json (model_type llama/qwen2/...) + model.safetensors
//
// Names: model.embed_tokens, model.layers.{i}.input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj, model.norm, and lm_head.weight unless
// tie_word_embeddings; Qwen3 and Gemma 3 add self_attn.{q,k}_norm, Gemma 2 and 3
// {pre,post}_feedforward_layernorm. Each decoder layer is a loom::FullShardUnit
// (name-transparent) answering to its family's HF class name (LlamaDecoderLayer,
// Qwen2DecoderLayer, Gemma2DecoderLayer, ...) for --fsdp_transformer_layer_cls_to_wrap.
//
// Arithmetic follows transformers' sdpa path op by op: RMSNorm in float32 then the weight
// times the input's dtype, rotary embeddings computed in float32 (transformers' rope init
// functions), grouped-query attention through at::scaled_dot_product_attention with
// enable_gqa and is_causal (under a mask the key/value heads repeated first, transformers'
// repeat_kv), the SwiGLU MLP down(act(gate(x)) * up(x)), and the causal LM loss
// of causal_lm.hpp. A layer with attention soft-capping (Gemma 2) follows transformers' eager
// path instead (the only one that caps): scores written out, scaled, tanh(s / cap) * cap,
// masked, softmax in float32.
//
// Supported: model_type llama, qwen2, qwen3, mistral, phi3 (q, k, v and gate, up fused), gemma
// (Gemma 1: RMSNorm by (1 + weight), embeddings times sqrt(hidden_size), head_dim 256 unless
// given), gemma2 (Gemma 1's plus post_attention_layernorm on the attention's output,
// pre/post_feedforward_layernorm around the MLP, scores scaled by query_pre_attn_scalar^-0.5,
// attn_logit_softcapping, final_logit_softcapping on every loss path, which then stays unchunked)
// and gemma3_text (Gemma 2's layers, (1 + w) q/k norms, rope_parameters keyed by layer type,
// the older rope_theta / rope_local_base_freq / rope_scaling / sliding_window_pattern read into
// them; its attention ignores attn_logit_softcapping, as transformers'); rope_parameters (or
// the older rope_theta / rope_scaling keys) of rope_type "default", "linear", "dynamic" (NTK,
// recomputed past max_position_embeddings as transformers' rotary embedding does, state
// included), "yarn" (its attention factor, mscale, beta and truncate keys), "longrope" (short /
// long factors) or "llama3"; any num_key_value_heads dividing num_attention_heads; head_dim;
// attention_bias / mlp_bias (Llama); tie_word_embeddings both ways; hidden_act of
// models/activations.hpp. Refused with a loom: line naming the field:
// other rope types or rope keys, pretraining_tp other than 1, use_bidirectional_attention true,
// soft-caps that are not positive. Sliding-window attention as transformers masks it (a query
// sees the sliding_window keys up to itself): every Mistral layer when sliding_window is set;
// Qwen2 / Qwen3 layers whose layer_types entry is "sliding_attention" (by default those from
// max_window_layers on) when use_sliding_window; Gemma 2 / 3 layers whose layer_types entry is
// "sliding_attention" (by default all but every 2nd / every sliding_window_pattern-th, 6).

#include <loom/config/inline.hpp>
#include <loom/core/fused_gradients.hpp>
#include <loom/core/neftune.hpp>
#include <loom/data/text.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/activation_memory.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/peft/lora.hpp>
#include <loom/models/pretrained.hpp>
#include <loom/models/sequence_classification.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace loom::models {

/// What sets one family of the Llama architecture apart: one row of kLlamaFamilies per
/// config.json model_type, read wherever the families differ (no name compared elsewhere).
struct LlamaFamily {
  /// config.json keys a family's HF config has (save_pretrained writes only those).
  enum Keys : unsigned {
    attention_bias_key = 1u << 0,  ///< attention_bias
    mlp_bias_key = 1u << 1,        ///< mlp_bias and pretraining_tp (Llama's own)
    head_dim_key = 1u << 2,        ///< head_dim
    window_keys = 1u << 3,         ///< use_sliding_window, max_window_layers (Qwen's)
    sliding_window_key = 1u << 4,  ///< sliding_window
    phi3_keys = 1u << 5,           ///< resid_pdrop, embd_pdrop, original_max_position_embeddings (Phi-3's)
    bidirectional_key = 1u << 6,   ///< use_bidirectional_attention (Gemma's)
    layer_types_key = 1u << 7,     ///< layer_types (Qwen's, Gemma 2's and 3's)
    /// query_pre_attn_scalar, attn_logit_softcapping, final_logit_softcapping, and
    /// hidden_activation in place of hidden_act (Gemma 2's and 3's)
    softcap_keys = 1u << 8,
    /// num_local_experts, num_experts_per_tok, output_router_logits, router_aux_loss_coef
    /// (Mixtral's and Qwen3-MoE's)
    moe_keys = 1u << 9,
    router_jitter_key = 1u << 10,  ///< router_jitter_noise (Mixtral's)
    /// moe_intermediate_size, decoder_sparse_step, mlp_only_layers, norm_topk_prob (Qwen3-MoE's)
    sparse_step_keys = 1u << 11,
    window_switch_key = 1u << 12,  ///< use_sliding_window alone: then every layer slides (Qwen3-MoE's)
  };
  std::string_view model_type;     ///< config.json's model_type
  std::string_view causal_lm;      ///< transformers' causal LM class (config.json's architectures)
  std::string_view sequence_classification;  ///< transformers' sequence classifier class (LlamaForSequenceClassification)
  std::string_view decoder_layer;  ///< transformers' decoder layer class (--fsdp_transformer_layer_cls_to_wrap)
  unsigned keys = 0;               ///< the Keys its config.json has
  bool qkv_bias = false;           ///< q, k and v always have biases (Qwen2), whatever attention_bias says
  bool qk_norm = false;            ///< an RMSNorm over each head of q and k, before the rotary embedding (Qwen3)
  bool window_attends = false;     ///< sliding_window bounds the attention (Mistral); Qwen's needs use_sliding_window
  int64_t default_head_dim = 0;    ///< head_dim when config.json has none (0: hidden_size / num_attention_heads)
  bool fused_projections = false;  ///< q, k, v as one qkv_proj and gate, up as one gate_up_proj (Phi-3)
  bool partial_rotary = false;     ///< rope_parameters.partial_rotary_factor turns only part of each head (Phi-3)
  bool norm_plus_one = false;      ///< RMSNorm scales by (1 + weight) in float32, weights starting at 0 (Gemma)
  bool embed_scale = false;        ///< the embeddings times sqrt(hidden_size) (Gemma)
  bool gelu_means_tanh = false;    ///< hidden_act "gelu" is read as "gelu_pytorch_tanh" (GemmaConfig's legacy rule)
  /// post_attention_layernorm on the attention's output before its residual sum, and
  /// pre_feedforward_layernorm / post_feedforward_layernorm around the MLP (Gemma 2 and 3)
  bool sandwich_norms = false;
  bool attention_softcap = false;  ///< attn_logit_softcapping caps the attention scores (Gemma 2; Gemma 3's attention ignores the key)
  /// layer_types by default (when config.json has none): each sliding_pattern-th layer full, the
  /// others sliding (Gemma 2: 2; Gemma 3: 6, or sliding_window_pattern); sliding_window bounds
  /// the sliding layers without use_sliding_window. 0: Qwen's rule or none.
  int64_t sliding_pattern = 0;
  double default_rope_theta = 10000.0;  ///< rope_theta when config.json gives none (Gemma 3's full_attention: 1e6)
  /// The sliding layers' own rope: rope_parameters holds one per layer type, "full_attention"
  /// and "sliding_attention", this the sliding one's default rope_theta (Gemma 3's
  /// rope_local_base_freq, 10000). 0: one rope for every layer.
  double local_rope_theta = 0.0;
  /// The sparse MoE block's module name in a decoder layer (Mixtral: block_sparse_moe;
  /// Qwen3-MoE: mlp); empty: every layer has the dense MLP.
  std::string_view moe_block{};
  /// transformers' class of that block (MixtralSparseMoeBlock): its FullShard unit's class name.
  std::string_view moe_block_class{};
  /// An expert's gate, up and down projections as transformers' files name them (Mixtral: w1, w3, w2).
  std::array<std::string_view, 3> expert_projections{"gate_proj", "up_proj", "down_proj"};
  int64_t default_experts = 0;           ///< num_local_experts when config.json has none (Mixtral: 8, Qwen3-MoE: 128)
  int64_t default_experts_per_tok = 0;   ///< num_experts_per_tok when config.json has none (2, 8)
  /// moe_intermediate_size when config.json has none (Qwen3-MoE: 768); 0: the experts are
  /// intermediate_size wide (Mixtral)
  int64_t default_moe_intermediate = 0;
  bool always_norm_topk = false;  ///< the top-k routing weights always renormalized to sum 1 (Mixtral); else by norm_topk_prob
  /// The routing weights stay float32 (Mixtral); else cast to the router logits' dtype (Qwen3-MoE)
  bool float_routing_weights = false;
  /// The block holds its experts before its router (Qwen3-MoE), so model.parameters() (the
  /// order of the gradient norm's sum) lists them first; else the router first (Mixtral)
  bool experts_before_router = false;
};

/// The families LlamaForCausalLM reads, facts from transformers' config and modeling files.
inline constexpr std::array<LlamaFamily, 10> kLlamaFamilies{{
    {.model_type = "llama", .causal_lm = "LlamaForCausalLM",
     .sequence_classification = "LlamaForSequenceClassification", .decoder_layer = "LlamaDecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::mlp_bias_key | LlamaFamily::head_dim_key},
    {.model_type = "qwen2", .causal_lm = "Qwen2ForCausalLM",
     .sequence_classification = "Qwen2ForSequenceClassification", .decoder_layer = "Qwen2DecoderLayer",
     .keys = LlamaFamily::window_keys | LlamaFamily::layer_types_key | LlamaFamily::sliding_window_key,
     .qkv_bias = true},
    {.model_type = "qwen3", .causal_lm = "Qwen3ForCausalLM",
     .sequence_classification = "Qwen3ForSequenceClassification", .decoder_layer = "Qwen3DecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::head_dim_key | LlamaFamily::window_keys |
             LlamaFamily::layer_types_key | LlamaFamily::sliding_window_key,
     .qk_norm = true, .default_head_dim = 128},
    {.model_type = "mistral", .causal_lm = "MistralForCausalLM",
     .sequence_classification = "MistralForSequenceClassification", .decoder_layer = "MistralDecoderLayer",
     .keys = LlamaFamily::head_dim_key | LlamaFamily::sliding_window_key, .window_attends = true},
    {.model_type = "phi3", .causal_lm = "Phi3ForCausalLM",
     .sequence_classification = "Phi3ForSequenceClassification", .decoder_layer = "Phi3DecoderLayer",
     .keys = LlamaFamily::sliding_window_key | LlamaFamily::phi3_keys, .window_attends = true,
     .fused_projections = true, .partial_rotary = true},
    {.model_type = "gemma", .causal_lm = "GemmaForCausalLM",
     .sequence_classification = "GemmaForSequenceClassification", .decoder_layer = "GemmaDecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::head_dim_key | LlamaFamily::bidirectional_key,
     .default_head_dim = 256, .norm_plus_one = true, .embed_scale = true, .gelu_means_tanh = true},
    {.model_type = "gemma2", .causal_lm = "Gemma2ForCausalLM",
     .sequence_classification = "Gemma2ForSequenceClassification", .decoder_layer = "Gemma2DecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::head_dim_key | LlamaFamily::sliding_window_key |
             LlamaFamily::bidirectional_key | LlamaFamily::layer_types_key | LlamaFamily::softcap_keys,
     .default_head_dim = 256, .norm_plus_one = true, .embed_scale = true, .sandwich_norms = true,
     .attention_softcap = true, .sliding_pattern = 2},
    {.model_type = "gemma3_text", .causal_lm = "Gemma3ForCausalLM",
     .sequence_classification = "Gemma3TextForSequenceClassification", .decoder_layer = "Gemma3DecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::head_dim_key | LlamaFamily::sliding_window_key |
             LlamaFamily::bidirectional_key | LlamaFamily::layer_types_key | LlamaFamily::softcap_keys,
     .qk_norm = true, .default_head_dim = 256, .norm_plus_one = true, .embed_scale = true, .sandwich_norms = true,
     .sliding_pattern = 6, .default_rope_theta = 1'000'000.0, .local_rope_theta = 10000.0},
    {.model_type = "mixtral", .causal_lm = "MixtralForCausalLM",
     .sequence_classification = "MixtralForSequenceClassification", .decoder_layer = "MixtralDecoderLayer",
     .keys = LlamaFamily::head_dim_key | LlamaFamily::sliding_window_key | LlamaFamily::moe_keys |
             LlamaFamily::router_jitter_key,
     .window_attends = true, .default_rope_theta = 1'000'000.0, .moe_block = "block_sparse_moe",
     .moe_block_class = "MixtralSparseMoeBlock", .expert_projections = {"w1", "w3", "w2"}, .default_experts = 8,
     .default_experts_per_tok = 2, .always_norm_topk = true, .float_routing_weights = true},
    {.model_type = "qwen3_moe", .causal_lm = "Qwen3MoeForCausalLM",
     .sequence_classification = "Qwen3MoeForSequenceClassification", .decoder_layer = "Qwen3MoeDecoderLayer",
     .keys = LlamaFamily::attention_bias_key | LlamaFamily::head_dim_key | LlamaFamily::window_switch_key |
             LlamaFamily::sliding_window_key | LlamaFamily::moe_keys | LlamaFamily::sparse_step_keys,
     .qk_norm = true, .moe_block = "mlp", .moe_block_class = "Qwen3MoeSparseMoeBlock", .default_experts = 128,
     .default_experts_per_tok = 8, .default_moe_intermediate = 768, .experts_before_router = true},
}};

/// transformers' LlamaConfig, with the fields Qwen2Config, Qwen3Config, MistralConfig,
/// Phi3Config, GemmaConfig, Gemma2Config and Gemma3TextConfig add:
/// HF's field names and Llama's defaults (config.json reads into it; model_type says which
/// family, a row of kLlamaFamilies).
struct LlamaConfig {
  std::string model_type = "llama";                  ///< llama, qwen2, qwen3, mistral, phi3, gemma, gemma2, gemma3_text, mixtral or qwen3_moe
  int64_t vocab_size = 32000;                        ///< tokens in the vocabulary
  int64_t hidden_size = 4096;                        ///< hidden size
  int64_t intermediate_size = 11008;                 ///< MLP width
  int64_t num_hidden_layers = 32;                    ///< decoder layers
  int64_t num_attention_heads = 32;                  ///< query heads
  std::optional<int64_t> num_key_value_heads;        ///< key/value heads (grouped-query attention; none: num_attention_heads)
  std::optional<int64_t> head_dim;                   ///< width of a head (none: hidden_size / num_attention_heads)
  std::string hidden_act = "silu";                   ///< see models/activations.hpp
  std::optional<std::string> hidden_activation;      ///< (Gemma 2 and 3: their name for hidden_act, which it replaces)
  int64_t max_position_embeddings = 2048;            ///< longest sequence the rotary table is meant for
  double initializer_range = 0.02;                   ///< std of the random initialization
  double rms_norm_eps = 1e-6;                        ///< RMSNorm eps
  bool use_cache = true;                             ///< (generation; kept for the round trip)
  std::optional<int64_t> pad_token_id;               ///< padding token
  std::optional<int64_t> bos_token_id = 1;           ///< beginning-of-text token
  nlohmann::json eos_token_id = 2;                   ///< end-of-text token, or a list of them (Llama 3)
  std::optional<int64_t> pretraining_tp = 1;         ///< (Llama; must be 1)
  bool tie_word_embeddings = false;                  ///< lm_head shares embed_tokens' weight
  nlohmann::json rope_parameters;                    ///< {"rope_type": "default" | "llama3", "rope_theta": ..., llama3's factors}
  std::optional<double> rope_theta;                  ///< older files' key (read into rope_parameters)
  nlohmann::json rope_scaling;                       ///< older files' key (read into rope_parameters)
  bool attention_bias = false;                       ///< bias on q, k, v and o (Llama)
  double attention_dropout = 0.0;                    ///< dropout on the attention weights (training)
  double resid_pdrop = 0.0;                          ///< (Phi-3) dropout on the attention's and the MLP's outputs before each residual sum (training)
  double embd_pdrop = 0.0;                           ///< (Phi-3: in its config, unused by transformers' model; kept for the round trip)
  std::optional<int64_t> original_max_position_embeddings;  ///< (Phi-3) the pretrained length longrope scales from (also read from rope_parameters)
  std::optional<bool> use_bidirectional_attention;   ///< (Gemma) must be unset or false: loom's attention is causal
  bool mlp_bias = false;                             ///< bias on gate, up and down (Llama)
  std::optional<bool> use_sliding_window;            ///< (Qwen: the sliding_attention layers have a window)
  std::optional<int64_t> sliding_window;             ///< keys a query sees (Mistral: every layer; Qwen: with use_sliding_window)
  std::optional<int64_t> max_window_layers;          ///< (Qwen: layers from this one on slide, when layer_types is absent; 28)
  nlohmann::json layer_types;                        ///< (Qwen, Gemma 2 and 3: "full_attention" / "sliding_attention" per layer)
  std::optional<int64_t> sliding_window_pattern;     ///< (Gemma 3's older files: every n-th layer full when layer_types is absent)
  std::optional<int64_t> query_pre_attn_scalar;      ///< (Gemma 2 and 3) the attention scores scale by its -0.5 power, not head_dim's (256 when absent)
  std::optional<double> attn_logit_softcapping;      ///< (Gemma 2) attention scores tanh(s / cap) * cap before the mask; null: none (Gemma 3's attention ignores it, as transformers')
  std::optional<double> final_logit_softcapping;     ///< (Gemma 2 and 3) logits tanh(z / cap) * cap; null: none
  std::optional<double> rope_local_base_freq;        ///< (Gemma 3's older files) the sliding layers' rope_theta (read into rope_parameters)
  std::optional<int64_t> num_local_experts;          ///< (Mixtral, Qwen3-MoE) experts of a sparse layer (none: 8 / 128)
  std::optional<int64_t> num_experts;                ///< (older files' name of num_local_experts, read into it)
  std::optional<int64_t> num_experts_per_tok;        ///< (Mixtral, Qwen3-MoE) experts each token is routed to (none: 2 / 8)
  bool output_router_logits = false;                 ///< (Mixtral, Qwen3-MoE) the loss adds router_aux_loss_coef times the load-balancing loss
  double router_aux_loss_coef = 0.001;               ///< (Mixtral, Qwen3-MoE) the load-balancing loss's weight
  double router_jitter_noise = 0.0;                  ///< (Mixtral) training: the MoE block's input times uniform(1 - j, 1 + j)
  std::optional<int64_t> moe_intermediate_size;      ///< (Qwen3-MoE) an expert's width (none: 768; Mixtral's experts: intermediate_size)
  int64_t decoder_sparse_step = 1;                   ///< (Qwen3-MoE) layer i is sparse when (i + 1) % decoder_sparse_step == 0
  nlohmann::json mlp_only_layers;                    ///< (Qwen3-MoE) indices of layers with the dense MLP (intermediate_size) instead
  bool norm_topk_prob = false;                       ///< (Qwen3-MoE) the top-k routing weights renormalized to sum 1 (Mixtral's always are)
  int64_t num_labels = 2;                            ///< classifier outputs (LlamaForSequenceClassification; id2label's size when given)
  std::map<int64_t, std::string> id2label;           ///< a classifier's label names (empty in a causal LM's config)
  std::map<std::string, int64_t> label2id;           ///< the inverse
  std::optional<std::string> problem_type;           ///< a classifier's: regression, single_label_classification, multi_label_classification

  /// The model types this struct reads (config.json's model_type): kLlamaFamilies' in order.
  static constexpr auto model_types = [] {
    std::array<std::string_view, kLlamaFamilies.size()> out{};
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = kLlamaFamilies[i].model_type;
    return out;
  }();
  /// Whether config.json gets `key` (each family writes the keys its HF config has).
  LOOM_INLINE bool written(std::string_view key) const;
};

/// Fills what follows from other fields: rope_parameters from the older rope_theta and
/// rope_scaling keys, num_key_value_heads and head_dim.
LOOM_INLINE void complete_config(LlamaConfig& config);

/// The key/value heads: num_key_value_heads, or num_attention_heads when unset (no grouping).
inline int64_t llama_kv_heads(const LlamaConfig& c) { return c.num_key_value_heads.value_or(c.num_attention_heads); }
/// The width of one head: head_dim, or hidden_size / num_attention_heads when unset.
inline int64_t llama_head_dim(const LlamaConfig& c) { return c.head_dim.value_or(c.hidden_size / c.num_attention_heads); }
/// The row of kLlamaFamilies for `model_type`; null when none (validate refuses it).
inline const LlamaFamily* find_llama_family(std::string_view model_type) {
  for (const auto& f : kLlamaFamilies)
    if (f.model_type == model_type) return &f;
  return nullptr;
}
/// The row of kLlamaFamilies for the config's model_type (a loom::Error when none).
LOOM_INLINE const LlamaFamily& llama_family(const LlamaConfig& c);
/// Whether q_proj, k_proj and v_proj have biases: attention_bias, and always in Qwen2.
inline bool llama_qkv_bias(const LlamaConfig& c) { return c.attention_bias || llama_family(c).qkv_bias; }
/// The final logit soft-cap (Gemma 2's final_logit_softcapping), none in other families.
inline std::optional<double> llama_final_softcap(const LlamaConfig& c) {
  return (llama_family(c).keys & LlamaFamily::softcap_keys) != 0 ? c.final_logit_softcapping : std::nullopt;
}

/// Whether decoder layer `layer` has the sparse MoE block, not the dense MLP (Mixtral: every
/// layer; Qwen3-MoE: num_local_experts > 0, layer not in mlp_only_layers and (layer + 1) a
/// multiple of decoder_sparse_step).
LOOM_INLINE bool llama_layer_sparse(const LlamaConfig& c, int64_t layer);
/// An expert's width: moe_intermediate_size, or intermediate_size (Mixtral's experts).
inline int64_t llama_expert_width(const LlamaConfig& c) { return c.moe_intermediate_size.value_or(c.intermediate_size); }
/// The experts of a sparse layer (num_local_experts, or the family's default).
inline int64_t llama_experts(const LlamaConfig& c) { return c.num_local_experts.value_or(llama_family(c).default_experts); }
/// The experts each token is routed to (num_experts_per_tok, or the family's default).
inline int64_t llama_experts_per_tok(const LlamaConfig& c) {
  return c.num_experts_per_tok.value_or(llama_family(c).default_experts_per_tok);
}

/// transformers' load_balancing_loss_func (Switch Transformer's auxiliary loss) over the router
/// logits of every sparse layer ([tokens, experts] each): per layer the softmax's top-k experts
/// counted and its probabilities summed (with `attention_mask`, int [batch, seq] of the same
/// tokens, only the rows it marks 1), both divided by the rows counted over all layers; then
/// experts * sum(counts * probabilities), float32. The router logits' own device and dtype.
LOOM_INLINE torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits, int64_t experts,
                                              int64_t top_k, const torch::Tensor& attention_mask = {});

/// What the memory plan's activation estimate reads of a Llama-architecture model
/// (models/activation_memory.hpp): a causal LM's head (which honours forward_request()), or none.
inline ActivationShape llama_activation_shape(const LlamaConfig& c, bool causal_lm) {
  const LlamaFamily& family = llama_family(c);
  const int64_t kv = llama_kv_heads(c) * llama_head_dim(c), q = c.num_attention_heads * llama_head_dim(c);
  // A sparse layer's MLP: per routed row (top_k a token) the gathered input, gate, its SiLU,
  // up, their product and the down projection's output; the router's logits and float32
  // probabilities. Averaged over the layers (Qwen3-MoE's dense ones: 4 intermediate_size).
  // Its experts' gate and up weights joined (2 x width x hidden each), whatever the tokens.
  int64_t mlp = 0, fixed = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool sparse = llama_layer_sparse(c, i);
    mlp += sparse ? llama_experts_per_tok(c) * (4 * llama_expert_width(c) + 2 * c.hidden_size) + 3 * llama_experts(c)
                  : 4 * c.intermediate_size;
    if (sparse) fixed += llama_experts(c) * 2 * llama_expert_width(c) * c.hidden_size;
  }
  if (c.num_hidden_layers > 0) {
    mlp /= c.num_hidden_layers;
    fixed /= c.num_hidden_layers;
  }
  return {.layers = c.num_hidden_layers, .hidden = c.hidden_size, .kv = kv, .mlp = mlp,
          .heads = c.num_attention_heads, .vocab = causal_lm ? c.vocab_size : 0,
          .qk_norm = family.qk_norm ? 2 * (q + kv) : 0, .norms = family.sandwich_norms ? 4 : 2,
          .eager_attention = family.attention_softcap && c.attn_logit_softcapping.has_value(), .query_width = q,
          .head_softcap = causal_lm && llama_final_softcap(c).has_value(),
          .attention_dropout = c.attention_dropout > 0, .loss_only_head = causal_lm, .layer_fixed = fixed};
}

/// Whether decoder layer `layer` is a "sliding_attention" layer (layer_types, or the family's
/// default: Qwen's max_window_layers with use_sliding_window, Gemma's pattern).
LOOM_INLINE bool llama_layer_slides(const LlamaConfig& c, int64_t layer);
/// The attention window of decoder layer `layer` (keys a query sees, itself included), or none
/// (causal over the whole sequence): see the file comment.
LOOM_INLINE std::optional<int64_t> llama_layer_window(const LlamaConfig& c, int64_t layer);

/// Checks `config` (sizes, heads, rope, the features implemented here); errors name `where`.
LOOM_INLINE void validate(const LlamaConfig& config, std::string_view where);
/// The shapes the config gives the embeddings and the last layer (checked against the weight
/// files' headers before the model is built).
LOOM_INLINE std::vector<ConfigShape> config_shapes(const LlamaConfig& config);
/// The parameters LlamaForCausalLM has under `config` (num_parameters(), counted from the
/// config before anything is built).
LOOM_INLINE int64_t parameter_count(const LlamaConfig& config);

namespace detail {
/// HF's random initialization (_init_weights) of one parameter of a Llama-architecture model,
/// `name` as `root` names it, drawn from `generator`: normal(0, initializer_range) for linear
/// and embedding weights (the padding row 0), zero biases, norms 1 (Gemma's 0).
LOOM_INLINE void init_llama_parameter(const torch::nn::Module& root, const LlamaConfig& config,
                                      const std::string& name, torch::Tensor& t, at::Generator generator);
}  // namespace detail

/// One rope's rotary table (transformers' LlamaRotaryEmbedding; Gemma 3 has one per layer
/// type): the inverse frequencies of a rope_parameters object's rope_type, in float32, and the
/// state of the rope types whose frequencies follow the sequence (transformers'
/// dynamic_rope_update: dynamic NTK recomputes them past max_position_embeddings, longrope
/// switches to its long factors past original_max_position_embeddings).
class LlamaRotaryEmbedding {
 public:
  /// The rope `rope` (a validated rope_parameters object) of `config`'s heads.
  LOOM_INLINE LlamaRotaryEmbedding(const LlamaConfig& config, const nlohmann::json& rope);
  /// (cos, sin) for int64 positions [batch, seq]: [batch, seq, rotary width] each, in float32.
  LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> operator()(const torch::Tensor& positions);

 private:
  torch::Tensor inv_freq_;  // the frequencies (float32, on the device of the last call)
  double attention_scaling_ = 1.0;
  std::string rope_type_;
  nlohmann::json rope_;
  int64_t rope_dim_ = 0, max_positions_ = 0, max_seq_len_cached_ = 0;
  torch::Tensor original_inv_freq_, long_inv_freq_;
};

/// Llama's RMSNorm: weight * (x / sqrt(mean(x^2) + eps)), computed in float32.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  /// `plus_one`: Gemma's RMSNorm, (x / rms) * (1 + weight) in float32 then cast, weight starting at 0.
  LOOM_INLINE LlamaRMSNormImpl(int64_t hidden_size, double eps, bool plus_one = false);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  /// The weight's initial value: 1, or Gemma's 0.
  [[nodiscard]] double initial_weight() const { return plus_one_ ? 0.0 : 1.0; }
  torch::Tensor weight;

 private:
  double eps_;
  bool plus_one_ = false;
};
TORCH_MODULE(LlamaRMSNorm);

/// Grouped-query self-attention with rotary position embeddings.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  /// Layer `layer`'s attention (its window: llama_layer_window).
  LOOM_INLINE explicit LlamaAttentionImpl(const LlamaConfig& config, int64_t layer = 0);
  /// `cos`, `sin`: [batch, seq, head_dim] (the model's rotary table for these positions);
  /// `mask`: undefined (causal attention), or bool [batch, 1, seq, seq], true where a query
  /// may attend (packed documents: causal within each); `cu_seqlens`: undefined, or (packed
  /// documents on CUDA) int32 [documents + 1], where each document starts in the batch's
  /// flattened tokens, for the variable-length flash kernel (half precision; else the mask).
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    const torch::Tensor& mask, const torch::Tensor& cu_seqlens);
  /// A decoding step (generation): the rotated keys and values appended to the step's cache,
  /// attention under the step's mask, grouped heads as transformers' sdpa path treats them.
  LOOM_INLINE torch::Tensor forward_step(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                         const AttentionStep& step);
  peft::AdaptableLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  peft::AdaptableLinear qkv_proj{nullptr};  ///< Phi-3's q, k and v in one (then q_proj, k_proj, v_proj are null)
  LlamaRMSNorm q_norm{nullptr}, k_norm{nullptr};  ///< Qwen3's, over each head's width (null in other families)

 private:
  /// The projections of x: q, k and v [batch, seq, width], from the three or the fused one.
  LOOM_INLINE std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project(const torch::Tensor& x);
  /// [batch, seq, width] -> [batch, heads, seq, head_dim], through `norm` when the family has one.
  LOOM_INLINE torch::Tensor split_heads(const torch::Tensor& t, LlamaRMSNorm norm) const;
  /// Attention written out (transformers' eager_attention_forward), for a soft-capped layer: the
  /// scores of q by the repeated keys, scaled, capped tanh(s / cap) * cap, masked (`mask` bool
  /// [batch or 1, 1, query, keys]), softmax in float32, by the repeated values.
  LOOM_INLINE torch::Tensor eager_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const torch::Tensor& mask) const;
  int64_t heads_, kv_heads_, head_dim_;
  double dropout_, scaling_;
  std::optional<int64_t> window_;
  std::optional<double> softcap_;  // Gemma 2's attn_logit_softcapping
};
TORCH_MODULE(LlamaAttention);

/// The SwiGLU feed-forward part: down(act(gate(x)) * up(x)).
class LlamaMLPImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit LlamaMLPImpl(const LlamaConfig& config);
  /// An expert of a sparse MoE block: `intermediate` wide, no biases, its projections named
  /// `names` (gate, up, down: the family's expert_projections).
  LOOM_INLINE LlamaMLPImpl(const LlamaConfig& config, int64_t intermediate,
                           const std::array<std::string_view, 3>& names);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  peft::AdaptableLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  peft::AdaptableLinear gate_up_proj{nullptr};  ///< Phi-3's gate and up in one (then gate_proj, up_proj are null)

 private:
  ActivationFn activation_;
  int64_t intermediate_;
  bool expert_ = false;  // an expert: gate and up as one product (transformers' fused experts)
};
TORCH_MODULE(LlamaMLP);

/// A sparse MoE block (transformers' MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock): the router
/// `gate` (a bias-free linear to one logit an expert), softmax in float32, the top-k experts of
/// each token (their weights renormalized to sum 1 under the family's rule), and each expert's
/// SwiGLU on the tokens routed to it only (sorted by expert, gathered, one product an expert,
/// scattered back), weighted and summed over a token's k experts. Every expert runs, on no rows
/// when none is routed to it, so every parameter has a gradient (zero), as transformers'
/// default grouped_mm experts give. A FullShard unit of its own inside the decoder layer's.
class LlamaSparseMoeBlockImpl : public torch::nn::Module, public FusedGradients {
 public:
  LOOM_INLINE explicit LlamaSparseMoeBlockImpl(const LlamaConfig& config);
  /// [batch, seq, hidden] -> [batch * seq, hidden]; with `router_logits`, [batch * seq, hidden +
  /// experts]: the router's logits beside the output (so that they leave a recomputed or
  /// sharded unit with their gradient).
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, bool router_logits = false);
  /// transformers' class of the block in the config's family (MixtralSparseMoeBlock, ...): what
  /// --fsdp_transformer_layer_cls_to_wrap names (FullShardUnit reads it).
  [[nodiscard]] std::string hf_class_name() const { return std::string(class_name_); }
  /// transformers' fused experts.gate_up_proj and experts.down_proj: the experts' gate and up
  /// weights, expert after expert, and their down weights (the gradient norm's tensors).
  [[nodiscard]] LOOM_INLINE std::vector<std::vector<torch::Tensor>> fused_gradients() const override;
  torch::nn::Linear gate{nullptr};                 ///< the router, [experts, hidden], no bias
  torch::nn::ModuleList experts{nullptr};          ///< registered as "experts" ("experts.{i}.w1", ...)
  std::vector<LlamaMLP> expert_mlps;               ///< the same experts, typed

 private:
  int64_t top_k_;
  bool normalize_, float_weights_;
  double jitter_;
  std::string_view class_name_;
};
TORCH_MODULE(LlamaSparseMoeBlock);

/// One decoder layer: x + attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.));
/// with sandwich norms (Gemma 2 and 3) x + post_attention_layernorm(attn(input_layernorm(x))),
/// then + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(.))).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit LlamaDecoderLayerImpl(const LlamaConfig& config, int64_t layer = 0);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    const torch::Tensor& mask, const torch::Tensor& cu_seqlens);
  /// A decoding step (generation): the attention reads and grows the step's cache.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                    const AttentionStep& step);
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};  ///< the dense MLP (null in a sparse layer)
  /// A sparse layer's MoE block (Mixtral, Qwen3-MoE), registered under the family's moe_block.
  FullShardUnit<LlamaSparseMoeBlock> moe{nullptr};
  LlamaRMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaRMSNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};  ///< Gemma 2's and 3's (else null)
  /// transformers' class of this layer in the config's family (Qwen3DecoderLayer, ...): what
  /// --fsdp_transformer_layer_cls_to_wrap names (FullShardUnit reads it).
  [[nodiscard]] std::string hf_class_name() const { return std::string(decoder_layer_); }
  /// Whether forward (not a decoding step) returns the router logits beside the hidden states:
  /// [batch, seq, hidden + experts] (a sparse layer of a config with output_router_logits).
  [[nodiscard]] bool emits_router_logits() const { return router_logits_; }

 private:
  /// The residual sums and the MLP after the attention's output `attended` (x the layer's input);
  /// `router_logits`: a sparse layer's router logits beside the output.
  LOOM_INLINE torch::Tensor after_attention(const torch::Tensor& x, const torch::Tensor& attended,
                                            bool router_logits = false);
  std::string_view decoder_layer_;
  bool router_logits_ = false;
  double resid_dropout_ = 0.0;  // Phi-3's resid_pdrop on each sublayer's output (training)
};
TORCH_MODULE(LlamaDecoderLayer);

/// The body (HF's LlamaModel, "model"): embeddings, decoder layers, final norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit LlamaModelImpl(const LlamaConfig& config);
  /// Hidden states [batch, seq, hidden_size] of int64 token ids [batch, seq]; `position_ids`
  /// (int64 [batch, seq], optional) restart at 0 at each packed document, which then attends
  /// to itself only: through a mask, or with `varlen` on CUDA through the variable-length
  /// flash kernel (the fast kernels' choice; one host sync a forward to find the documents).
  /// `attention_mask` (int64 [batch, seq], 1 on tokens, 0 on padding; optional) keeps every
  /// query off the padding, as transformers' padding mask (not with position_ids).
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids = {},
                                    bool varlen = false, const torch::Tensor& attention_mask = {});
  /// Hidden states [batch, query, hidden_size] of a decoding step (generation): the rotary
  /// table at the step's positions, its padding mask, and the key/value cache when it has one.
  LOOM_INLINE torch::Tensor forward_step(const DecodeStep& step);
  /// The rotary table (cos, sin) for positions 0 .. seq-1, [1, seq, head_dim] each, in float32
  /// (the full-attention layers' rope: Gemma 3 has another for its sliding layers).
  LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> rotary(int64_t seq, const torch::Device& device);
  /// The same for int64 positions [batch, seq]: [batch, seq, head_dim] each.
  LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> rotary(const torch::Tensor& positions);
  /// The token embeddings of `input_ids` (Gemma's scaled by sqrt(hidden_size)).
  LOOM_INLINE torch::Tensor embed(const torch::Tensor& input_ids);
  /// The router logits of the last forward's sparse layers ([batch * seq, experts] each, in
  /// layer order; none unless output_router_logits), handed over once: the next call has none.
  std::vector<torch::Tensor> take_router_logits() { return std::exchange(router_logits_, {}); }
  torch::nn::Embedding embed_tokens{nullptr};
  /// embed_tokens as a FullShard unit of its own (registered as "embed_tokens" in its place)
  /// when the head does not share its weight: gathered around its forward only.
  FullShardUnit<torch::nn::Embedding> embed_unit{nullptr};
  NEFTune embedding_noise;                               ///< on embed_tokens' output while training
  torch::nn::ModuleList layers{nullptr};                 ///< registered as "layers"
  std::vector<FullShardUnit<LlamaDecoderLayer>> units;   ///< the same layers, typed
  LlamaRMSNorm norm{nullptr};

 private:
  /// The rotary tables (cos, sin) of every rope at `positions`, in the layers' dtype `dtype`.
  LOOM_INLINE std::vector<std::pair<torch::Tensor, torch::Tensor>> rotary_tables(const torch::Tensor& positions,
                                                                               torch::ScalarType dtype);
  std::vector<LlamaRotaryEmbedding> ropes_;  // one, or (Gemma 3) the full and the sliding layers'
  std::vector<std::size_t> layer_rope_;      // each layer's entry of ropes_
  std::optional<double> embed_scale_;  // Gemma's embedding scale
  std::vector<torch::Tensor> router_logits_;  // the last forward's (output_router_logits)
};
TORCH_MODULE(LlamaModel);

/// A Llama-architecture causal LM (transformers' LlamaForCausalLM, Qwen2ForCausalLM,
/// Qwen3ForCausalLM, MistralForCausalLM, Gemma2ForCausalLM, ... by the config's model_type).
class LlamaForCausalLMImpl : public PreTrainedModel<LlamaForCausalLMImpl, LlamaConfig, data::CausalLMBatch> {
 public:
  /// A causal LM (HF's MODEL_FOR_CAUSAL_LM_MAPPING): --label_smoothing_factor shifts the labels.
  static constexpr bool is_causal_lm = true;
  /// Its loss divides the summed token loss by the Trainer's num_items_in_batch when a training
  /// forward hands one over (forward_request()), as transformers' causal LMs, which take it
  /// among their loss kwargs (HF's model_accepts_loss_kwargs).
  static constexpr bool accepts_num_items_in_batch = true;

  /// A model with HF's random initialization (normal(0, initializer_range) for linear and
  /// embedding weights, zero biases, norms 1), each parameter from its own generator seeded
  /// by one draw of torch's default generator and the parameter's name (so that a model built
  /// under loom::DeferredInit and materialized by shard holds the same values).
  LOOM_INLINE explicit LlamaForCausalLMImpl(LlamaConfig config = {});
  /// The initialization of parameter `name` (PreTrainedModel's per-parameter seeding).
  void init_parameter(const std::string& name, torch::Tensor& t, at::Generator generator) const {
    detail::init_llama_parameter(*this, config(), name, t, std::move(generator));
  }

  /// Loss (when batch.labels is defined) and logits: the Trainer's default compute_loss.
  LOOM_INLINE CausalLMOutput forward(const data::CausalLMBatch& batch);
  /// The memory plan's estimate of one training forward's saved activations, in bytes
  /// (models/activation_memory.hpp): `bytes_per_element` 2 under --bf16 / --fp16, else 4;
  /// `recompute` under --gradient_checkpointing.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    return transformer_activation_bytes(llama_activation_shape(config(), /*causal_lm=*/true), batch, seq,
                                        bytes_per_element, recompute);
  }
  /// Logits [batch, seq, vocab_size] of int64 token ids [batch, seq].
  LOOM_INLINE torch::Tensor logits(const torch::Tensor& input_ids);
  /// What the model gives each of batch.labels (causal_lm.hpp's token_scores: position t scores
  /// labels[t + 1]; with `statistics`, the entropy, mean logit and top-1 too), the head at the
  /// scored positions only: what DPO sums over each completion. `chunked` as token_scores.
  LOOM_INLINE TokenScores token_scores(const data::CausalLMBatch& batch, bool statistics = false,
                                       std::optional<bool> chunked = std::nullopt);
  /// Generation's forward (models/generation.hpp): the logits of the step's last position,
  /// float32 [batch, vocab_size] (transformers' logits_to_keep=1).
  LOOM_INLINE torch::Tensor next_token_logits(const DecodeStep& step);
  /// Warns (once a call) when a generation needs more positions than max_position_embeddings:
  /// the rotary embeddings go on past it, as in transformers, but the model was not trained there.
  LOOM_INLINE void check_generation_positions(int64_t positions) const;
  /// config.json's architectures: the family's causal_lm (LlamaForCausalLM, Qwen3ForCausalLM, ...).
  LOOM_INLINE std::string_view architecture_name() const;
  /// The names beyond the parameters that an HF file may hold (lm_head.weight when tied).
  LOOM_INLINE HfNameRules name_rules() const;
  static void complete_config(LlamaConfig& config) { models::complete_config(config); }

  /// NEFTune's noise on the token embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return model->embedding_noise; }
  /// Chooses the kernels of the forward (Kernels: automatic, the default, is fast on CUDA).
  void set_kernels(Kernels kernels) { kernels_ = kernels; }
  [[nodiscard]] Kernels kernels() const { return kernels_; }

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< only when tie_word_embeddings is false
  /// lm_head as a FullShard unit of its own (registered as "lm_head" in its place): gathered
  /// around the head's product and loss, and again for their backward.
  FullShardUnit<torch::nn::Linear> head_unit{nullptr};

 private:
  /// fn(weight) with the LM head's weight (embed_tokens' when tied), gathered around fn under
  /// FullShard; `outputs(result)`: the tensors backward reaches the head through.
  template <class Fn, class Outputs>
  auto with_head(const torch::Tensor& hidden, Fn&& fn, Outputs&& outputs) {
    if (!head_unit) return fn(model->embed_tokens->weight);
    return head_unit->scope({hidden}, [&] { return fn(lm_head->weight); }, std::forward<Outputs>(outputs));
  }
  Kernels kernels_ = Kernels::automatic;
};

/// A Llama-architecture sequence classifier (transformers' LlamaForSequenceClassification,
/// Qwen2ForSequenceClassification, ... by the config's model_type): the body, then `score`
/// (no bias) on the hidden state of each row's last token that is not pad_token_id (the
/// rightmost, so left and right padding both work; without pad_token_id only a batch of one,
/// as transformers), and HF's loss by problem_type (models/sequence_classification.hpp). A
/// reward model is one with num_labels 1. Names: model.* as the causal LM's, score.weight.
class LlamaForSequenceClassificationImpl
    : public PreTrainedModel<LlamaForSequenceClassificationImpl, LlamaConfig, data::SequenceBatch> {
 public:
  /// A model with HF's random initialization (as LlamaForCausalLM's: each parameter from its
  /// own generator, seeded by one draw of torch's default generator and its name).
  LOOM_INLINE explicit LlamaForSequenceClassificationImpl(LlamaConfig config = {});
  /// The initialization of parameter `name` (PreTrainedModel's per-parameter seeding).
  void init_parameter(const std::string& name, torch::Tensor& t, at::Generator generator) const {
    detail::init_llama_parameter(*this, config(), name, t, std::move(generator));
  }

  /// Loss (when batch.labels is defined) and logits [batch, num_labels]: the Trainer's default
  /// compute_loss. batch.attention_mask (optional) masks the padding in attention.
  LOOM_INLINE SequenceClassifierOutput forward(const data::SequenceBatch& batch);
  /// Logits [batch, num_labels] of int64 token ids [batch, seq] (attention_mask optional).
  LOOM_INLINE torch::Tensor logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  /// The position each row is classified at: the last token that is not pad_token_id (0 when a
  /// row is all padding, as transformers' argmax), int64 [batch].
  LOOM_INLINE torch::Tensor pooled_positions(const torch::Tensor& input_ids) const;
  /// The memory plan's estimate (models/activation_memory.hpp): the body's, no LM head.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    return transformer_activation_bytes(llama_activation_shape(config(), /*causal_lm=*/false), batch, seq,
                                        bytes_per_element, recompute);
  }
  /// config.json's architectures: the family's sequence classifier (LlamaForSequenceClassification, ...).
  LOOM_INLINE std::string_view architecture_name() const;
  /// A file may lack score.weight (a causal LM's or a bare body's: the head starts from its
  /// initialization, as transformers' "newly initialized") and hold lm_head.weight (ignored).
  LOOM_INLINE HfNameRules name_rules() const;
  /// The causal LM's completion, then HF's label rule (complete_labels).
  static void complete_config(LlamaConfig& config) {
    models::complete_config(config);
    complete_labels(config);
  }
  /// The parameters a classifier of `config` has (the body and the score head).
  LOOM_INLINE static int64_t parameter_count(const LlamaConfig& config);

  /// NEFTune's noise on the token embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return model->embedding_noise; }
  /// Chooses the kernels of the forward (Kernels: automatic, the default, is fast on CUDA).
  void set_kernels(Kernels kernels) { kernels_ = kernels; }
  [[nodiscard]] Kernels kernels() const { return kernels_; }

  LlamaModel model{nullptr};
  peft::AdaptableLinear score{nullptr};  ///< [num_labels, hidden_size], no bias

 private:
  Kernels kernels_ = Kernels::automatic;
};

/// Module holder of LlamaForSequenceClassificationImpl, with HF's from_pretrained.
class LlamaForSequenceClassification : public torch::nn::ModuleHolder<LlamaForSequenceClassificationImpl> {
 public:
  using torch::nn::ModuleHolder<LlamaForSequenceClassificationImpl>::ModuleHolder;
  /// Reads an HF folder of the Llama architecture: a sequence classifier's, or a causal LM's or
  /// a bare body's, whose score head starts from its initialization (a reward model from an SFT
  /// model: num_labels 1). `num_labels` (when given) replaces the config's, and its label names
  /// when their count differs (transformers' from_pretrained(..., num_labels=N)).
  static LlamaForSequenceClassification from_pretrained(const std::filesystem::path& dir,
                                                        torch::ScalarType dtype = torch::kFloat,
                                                        std::optional<int64_t> num_labels = std::nullopt) {
    return load_pretrained<LlamaForSequenceClassification>(dir, dtype, [&](LlamaConfig& c) { override_num_labels(c, num_labels); });
  }
};

/// Module holder of LlamaForCausalLMImpl, with HF's from_pretrained.
class LlamaForCausalLM : public torch::nn::ModuleHolder<LlamaForCausalLMImpl> {
 public:
  using torch::nn::ModuleHolder<LlamaForCausalLMImpl>::ModuleHolder;
  /// Reads an HF folder (a model_type of kLlamaFamilies): config.json, then the weights
  /// (model.safetensors or sharded), checked strictly against the model built from it, into
  /// parameters of `dtype` (float32 by default; bf16 / fp16 files are converted).
  static LlamaForCausalLM from_pretrained(const std::filesystem::path& dir, torch::ScalarType dtype = torch::kFloat) {
    return load_pretrained<LlamaForCausalLM>(dir, dtype);
  }
};

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/llama.ipp>
#endif
