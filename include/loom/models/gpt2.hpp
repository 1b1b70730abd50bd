#pragma once
// GPT-2 (transformers' GPT2LMHeadModel) as a loom module: HF's architecture, parameter names
// and config.json, so an HF folder loads into it and what it saves opens in transformers.
//
//   auto model = loom::models::GPT2LMHeadModel::from_pretrained("gpt2-folder");
//   auto model = loom::models::GPT2LMHeadModel(loom::models::GPT2Config{.n_layer = 4});
//   model->save_pretrained("out");                      // config.json + model.safetensors
//
// Names: transformer.wte / wpe / h.{i}.ln_1 / attn.c_attn / attn.c_proj / ln_2 / mlp.c_fc /
// mlp.c_proj / ln_f, and lm_head.weight only when tie_word_embeddings is false (tied, the
// head is wte's weight and files may or may not carry the copy). The Conv1D layers keep
// HF's [in, out] weights. Each block h.{i} is a loom::FullShardUnit, which is
// name-transparent, so the names are the same under every sharding policy.
//
// Arithmetic follows transformers' default (sdpa) path: attention through
// at::scaled_dot_product_attention with is_causal, the activation named by
// activation_function (gelu_new: the tanh approximation written as HF writes it), dropout
// from the config's *_pdrop in training mode, and the causal LM loss of HF's
// ForCausalLMLoss (causal_lm.hpp: labels shifted by one, -100 ignored, mean over the counted
// tokens). from_pretrained, save_pretrained, num_parameters and floating_point_ops are
// pretrained.hpp's.

#include <loom/config/inline.hpp>
#include <loom/data/text.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/activation_memory.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/peft/lora.hpp>
#include <loom/models/pretrained.hpp>
#include <loom/models/sequence_classification.hpp>
#include <loom/core/neftune.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <map>
#include <string_view>
#include <vector>

namespace loom::models {

/// transformers' GPT2Config: HF's field names and defaults (config.json reads into it).
struct GPT2Config {
  int64_t vocab_size = 50257;                        ///< tokens in the vocabulary
  int64_t n_positions = 1024;                        ///< longest sequence (position embeddings)
  int64_t n_embd = 768;                              ///< hidden size
  int64_t n_layer = 12;                              ///< transformer blocks
  int64_t n_head = 12;                               ///< attention heads (n_embd must be a multiple)
  std::optional<int64_t> n_inner;                    ///< MLP width (none: 4 * n_embd)
  std::string activation_function = "gelu_new";      ///< see models/activations.hpp
  double resid_pdrop = 0.1;                          ///< dropout after attention and MLP
  double embd_pdrop = 0.1;                           ///< dropout after the embeddings
  double attn_pdrop = 0.1;                           ///< dropout on the attention weights
  double layer_norm_epsilon = 1e-5;                  ///< LayerNorm eps
  double initializer_range = 0.02;                   ///< std of the random initialization
  std::string summary_type = "cls_index";            ///< (GPT2DoubleHeadsModel; kept for the round trip)
  bool summary_use_proj = true;                      ///< (idem)
  std::optional<std::string> summary_activation;     ///< (idem)
  bool summary_proj_to_labels = true;                ///< (idem)
  double summary_first_dropout = 0.1;                ///< (idem)
  bool scale_attn_weights = true;                    ///< scale attention scores by 1/sqrt(head size)
  bool use_cache = true;                             ///< (generation; kept for the round trip)
  std::optional<int64_t> bos_token_id = 50256;       ///< beginning-of-text token
  std::optional<int64_t> eos_token_id = 50256;       ///< end-of-text token
  std::optional<int64_t> pad_token_id;               ///< padding token
  bool scale_attn_by_inverse_layer_idx = false;      ///< also scale layer i's scores by 1/(i+1)
  bool reorder_and_upcast_attn = false;              ///< (HF's eager path only; sdpa ignores it)
  bool add_cross_attention = false;                  ///< must be false: no encoder-decoder use here
  bool tie_word_embeddings = true;                   ///< lm_head shares wte's weight
  int64_t num_labels = 2;                            ///< classifier outputs (GPT2ForSequenceClassification; id2label's size when given)
  std::map<int64_t, std::string> id2label;           ///< a classifier's label names (empty in an LM's config)
  std::map<std::string, int64_t> label2id;           ///< the inverse
  std::optional<std::string> problem_type;           ///< a classifier's: regression, single_label_classification, multi_label_classification

  static constexpr std::string_view model_type = "gpt2";  ///< config.json's model_type
  /// Whether config.json gets `key`: a classifier's labels only when it has them (as
  /// transformers writes them), num_labels never (id2label says it).
  [[nodiscard]] bool written(std::string_view key) const {
    if (key == "num_labels") return false;
    if (key == "id2label" || key == "label2id") return !id2label.empty();
    if (key == "problem_type") return problem_type.has_value();
    return true;
  }
};

/// Checks `config` (sizes positive and within ConfigLimits, n_embd a multiple of n_head, a known activation, the
/// features this implementation has); errors name `where` (the config file, or "GPT2Config").
LOOM_INLINE void validate(const GPT2Config& config, std::string_view where);
/// The shapes `config` gives the embeddings and the last block, which from_pretrained compares
/// with the weight files' headers before it builds the model.
LOOM_INLINE std::vector<ConfigShape> config_shapes(const GPT2Config& config);
/// The parameters GPT2LMHeadModel has under `config` (num_parameters(), counted from the config
/// before anything is built).
LOOM_INLINE int64_t parameter_count(const GPT2Config& config);

/// HF's Conv1D: a linear layer whose weight is stored [in, out]; out = bias + x @ weight. It
/// can carry a LoRA adapter (an AdaptableLinear with fan_in_fan_out, as PEFT treats Conv1D).
class Conv1DImpl : public peft::AdaptableLinearImpl {
 public:
  LOOM_INLINE Conv1DImpl(int64_t in_features, int64_t out_features);
};
TORCH_MODULE(Conv1D);

/// Causal self-attention: c_attn (q, k, v in one Conv1D), SDPA, c_proj.
class GPT2AttentionImpl : public torch::nn::Module {
 public:
  LOOM_INLINE GPT2AttentionImpl(const GPT2Config& config, int64_t layer_idx);
  /// `mask` (bool [batch, 1, seq, seq], true: attend; optional) instead of the causal one.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask = {});
  /// A decoding step (generation): this step's mask, keys and values appended to the cache.
  LOOM_INLINE torch::Tensor forward_step(const torch::Tensor& x, const AttentionStep& step);
  Conv1D c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr};   ///< on the attention weights (HF's; sdpa reads its p)
  torch::nn::Dropout resid_dropout{nullptr};

 private:
  int64_t n_embd_, n_head_;
  double scaling_;
};
TORCH_MODULE(GPT2Attention);

/// The feed-forward part: c_fc, activation, c_proj, dropout.
class GPT2MLPImpl : public torch::nn::Module {
 public:
  LOOM_INLINE GPT2MLPImpl(const GPT2Config& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
  Kernels kernels = Kernels::automatic;  ///< set by GPT2LMHeadModelImpl::set_kernels

 private:
  ActivationFn activation_;       // activation_function, resolved once
  ActivationFn fast_activation_;  // the same function as one fused kernel where torch has one
};
TORCH_MODULE(GPT2MLP);

/// One pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class GPT2BlockImpl : public torch::nn::Module {
 public:
  LOOM_INLINE GPT2BlockImpl(const GPT2Config& config, int64_t layer_idx);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  /// The same with an attention mask (bool [batch, 1, seq, seq], true: attend): the padding's.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  /// A decoding step (generation): the attention reads and grows the step's cache.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const AttentionStep& step);
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  GPT2Attention attn{nullptr};
  GPT2MLP mlp{nullptr};
};
TORCH_MODULE(GPT2Block);

/// The GPT-2 body (HF's GPT2Model, "transformer"): embeddings, blocks, final LayerNorm.
class GPT2ModelImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit GPT2ModelImpl(const GPT2Config& config);
  /// Hidden states [batch, seq, n_embd] of int64 token ids [batch, seq]; `attention_mask`
  /// (int64 [batch, seq], 1 on tokens, 0 on padding; optional) keeps every query off the
  /// padding, as transformers' padding mask.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  /// Hidden states [batch, query, n_embd] of a decoding step (generation): the step's
  /// positions, its padding mask, and the key/value cache when it has one.
  LOOM_INLINE torch::Tensor forward_step(const DecodeStep& step);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  NEFTune embedding_noise;                         ///< on wte's output while training (--neftune_noise_alpha)
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};                ///< the blocks, registered as "h"
  std::vector<FullShardUnit<GPT2Block>> blocks;    ///< the same blocks, typed
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(GPT2Model);

/// GPT-2 with its language-modeling head (transformers' GPT2LMHeadModel).
class GPT2LMHeadModelImpl : public PreTrainedModel<GPT2LMHeadModelImpl, GPT2Config, data::CausalLMBatch> {
 public:
  static constexpr std::string_view architecture = "GPT2LMHeadModel";  ///< config.json's architectures
  /// A causal LM (HF's MODEL_FOR_CAUSAL_LM_MAPPING): --label_smoothing_factor shifts the labels.
  static constexpr bool is_causal_lm = true;
  /// Its loss divides the summed token loss by the Trainer's num_items_in_batch when a training
  /// forward hands one over (forward_request()), as transformers' causal LMs, which take it
  /// among their loss kwargs (HF's model_accepts_loss_kwargs).
  static constexpr bool accepts_num_items_in_batch = true;

  /// A model with HF's random initialization (normal(0, initializer_range), the residual
  /// projections c_proj scaled by 1/sqrt(2 n_layer), LayerNorms 1 and 0, biases 0), drawn
  /// from torch's default generator (seed it with torch::manual_seed).
  LOOM_INLINE explicit GPT2LMHeadModelImpl(GPT2Config config = {});

  /// Loss (when batch.labels is defined) and logits: the Trainer's default compute_loss.
  LOOM_INLINE CausalLMOutput forward(const data::CausalLMBatch& batch);
  /// The memory plan's estimate of one training forward's saved activations, in bytes
  /// (models/activation_memory.hpp): `bytes_per_element` 2 under --bf16 / --fp16, else 4;
  /// `recompute` under --gradient_checkpointing.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    const auto& c = config();
    const int64_t inner = c.n_inner.value_or(4 * c.n_embd);
    // gelu_new's reference form (HF's formula, op by op) saves three more inner-wide tensors;
    // the fast kernels' gelu_pytorch_tanh (Kernels::fast; automatic on CUDA) none.
    const bool composite = c.activation_function == "gelu_new" && kernels_ != Kernels::fast;
    return transformer_activation_bytes({.layers = c.n_layer, .hidden = c.n_embd, .kv = c.n_embd,
                                         .mlp = (composite ? 5 : 2) * inner, .heads = c.n_head,
                                         .vocab = c.vocab_size, .dropouts = c.resid_pdrop > 0 ? 2 : 0,
                                         .attention_dropout = c.attn_pdrop > 0, .loss_only_head = true},
                                        batch, seq, bytes_per_element, recompute);
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
  /// Refuses a generation that needs more than n_positions positions (the learned table
  /// has no row past its end).
  LOOM_INLINE void check_generation_positions(int64_t positions) const;
  /// The names beyond the parameters that an HF GPT-2 file may hold.
  LOOM_INLINE HfNameRules name_rules() const;

  /// NEFTune's noise on the token embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return transformer->embedding_noise; }

  /// Chooses the kernels of the forward (Kernels: automatic, the default, is fast on CUDA).
  LOOM_INLINE void set_kernels(Kernels kernels);
  [[nodiscard]] Kernels kernels() const { return kernels_; }

  GPT2Model transformer{nullptr};
  torch::nn::Linear lm_head{nullptr};  ///< only when tie_word_embeddings is false

 private:
  LOOM_INLINE void init_weights();
  Kernels kernels_ = Kernels::automatic;
};

namespace detail {
/// GPT2PreTrainedModel._init_weights over GPT-2's body: wte, wpe and every Conv1D normal(0,
/// initializer_range), the residual projections (attn.c_proj, mlp.c_proj) with that over
/// sqrt(2 n_layer), biases 0, LayerNorms 1 and 0.
LOOM_INLINE void init_gpt2_body(GPT2ModelImpl& body, const GPT2Config& config);
}  // namespace detail

/// GPT-2 as a sequence classifier (transformers' GPT2ForSequenceClassification): the body,
/// then `score` (no bias) on each row's last token that is not pad_token_id
/// (models/sequence_classification.hpp: left and right padding; without pad_token_id, batches
/// of one), and HF's loss by problem_type. Names: transformer.*, score.weight.
class GPT2ForSequenceClassificationImpl
    : public PreTrainedModel<GPT2ForSequenceClassificationImpl, GPT2Config, data::SequenceBatch> {
 public:
  static constexpr std::string_view architecture = "GPT2ForSequenceClassification";  ///< config.json's architectures

  /// A model with HF's random initialization, drawn from torch's default generator.
  LOOM_INLINE explicit GPT2ForSequenceClassificationImpl(GPT2Config config = {});
  /// Loss (when batch.labels is defined) and logits [batch, num_labels]: the Trainer's default
  /// compute_loss. batch.attention_mask (optional) masks the padding in attention.
  LOOM_INLINE SequenceClassifierOutput forward(const data::SequenceBatch& batch);
  /// Logits [batch, num_labels] of int64 token ids [batch, seq] (attention_mask optional).
  LOOM_INLINE torch::Tensor logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {});
  /// The memory plan's estimate: the body's (as GPT2LMHeadModel's), no LM head.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    const auto& c = config();
    const int64_t inner = c.n_inner.value_or(4 * c.n_embd);
    const bool composite = c.activation_function == "gelu_new" && kernels_ != Kernels::fast;
    return transformer_activation_bytes({.layers = c.n_layer, .hidden = c.n_embd, .kv = c.n_embd,
                                         .mlp = (composite ? 5 : 2) * inner, .heads = c.n_head, .vocab = 0,
                                         .dropouts = c.resid_pdrop > 0 ? 2 : 0, .attention_dropout = c.attn_pdrop > 0},
                                        batch, seq, bytes_per_element, recompute);
  }
  /// A file may lack score.weight (an LM's or a bare body's: new, as transformers' "newly
  /// initialized") and hold lm_head.weight or the legacy attention buffers (ignored).
  LOOM_INLINE HfNameRules name_rules() const;
  /// HF's label rule (complete_labels), applied before every validation.
  static void complete_config(GPT2Config& config) { complete_labels(config); }
  /// The parameters a classifier of `config` has (the body and the score head).
  LOOM_INLINE static int64_t parameter_count(const GPT2Config& config);

  /// NEFTune's noise on the token embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return transformer->embedding_noise; }
  /// Chooses the kernels of the forward (Kernels: automatic, the default, is fast on CUDA).
  LOOM_INLINE void set_kernels(Kernels kernels);
  [[nodiscard]] Kernels kernels() const { return kernels_; }

  GPT2Model transformer{nullptr};
  peft::AdaptableLinear score{nullptr};  ///< [num_labels, n_embd], no bias

 private:
  Kernels kernels_ = Kernels::automatic;
};

/// Module holder of GPT2ForSequenceClassificationImpl, with HF's from_pretrained (an LM's
/// folder too, its score head new; `num_labels` replaces the config's, as transformers'
/// from_pretrained(..., num_labels=N)).
class GPT2ForSequenceClassification : public torch::nn::ModuleHolder<GPT2ForSequenceClassificationImpl> {
 public:
  using torch::nn::ModuleHolder<GPT2ForSequenceClassificationImpl>::ModuleHolder;
  static GPT2ForSequenceClassification from_pretrained(const std::filesystem::path& dir,
                                                       torch::ScalarType dtype = torch::kFloat,
                                                       std::optional<int64_t> num_labels = std::nullopt) {
    return load_pretrained<GPT2ForSequenceClassification>(dir, dtype, [&](GPT2Config& c) { override_num_labels(c, num_labels); });
  }
};

/// Module holder of GPT2LMHeadModelImpl, with HF's from_pretrained.
class GPT2LMHeadModel : public torch::nn::ModuleHolder<GPT2LMHeadModelImpl> {
 public:
  using torch::nn::ModuleHolder<GPT2LMHeadModelImpl>::ModuleHolder;
  /// Reads an HF folder: config.json, then the weights (model.safetensors or sharded),
  /// checked strictly against the model built from that config.
  LOOM_INLINE static GPT2LMHeadModel from_pretrained(const std::filesystem::path& dir,
                                                     torch::ScalarType dtype = torch::kFloat);
};

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/gpt2.ipp>
#endif
