#pragma once
// BERT with a sequence-classification head (transformers' BertForSequenceClassification) or
// the masked-LM head (BertForMaskedLM) as loom modules: HF's architecture, parameter names and
// config.json.
//
//   auto model = loom::models::BertForSequenceClassification::from_pretrained("bert-folder");
//   auto model = loom::models::BertForSequenceClassification(loom::models::BertConfig{.num_labels = 3});
//   model->save_pretrained("out");
//
// Names: bert.embeddings.{word,position,token_type}_embeddings and .LayerNorm,
// bert.encoder.layer.{i}.attention.self.{query,key,value}, .attention.output.{dense,LayerNorm},
// .intermediate.dense, .output.{dense,LayerNorm}, bert.pooler.dense, classifier. Each layer
// bert.encoder.layer.{i} is a loom::FullShardUnit (name-transparent). Every linear layer
// (query, key, value, the dense layers, the pooler's, the classifier) is a
// peft::AdaptableLinear, so LoRA (peft/lora.hpp) can go on any of them, as PEFT's can.
//
// Arithmetic follows transformers' default (sdpa) path: the padding mask from attention_mask
// becomes SDPA's boolean attn_mask (none when nothing is padded, as HF skips it), the
// activation is hidden_act (gelu: the exact erf form), the pooler is tanh(dense(h[:, 0])).
// Loss as HF's, by problem_type (models/sequence_classification.hpp, shared with the Llama
// architecture's classifier).
// from_pretrained, save_pretrained, num_parameters and floating_point_ops are pretrained.hpp's.

#include <loom/config/inline.hpp>
#include <loom/data/text.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/activation_memory.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/models/pretrained.hpp>
#include <loom/models/sequence_classification.hpp>
#include <loom/core/neftune.hpp>
#include <loom/peft/lora.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::models {

/// transformers' BertConfig (plus the classification fields of PretrainedConfig): HF's
/// field names and defaults.
struct BertConfig {
  int64_t vocab_size = 30522;                    ///< tokens in the vocabulary
  int64_t hidden_size = 768;                     ///< hidden size
  int64_t num_hidden_layers = 12;                ///< encoder layers
  int64_t num_attention_heads = 12;              ///< attention heads (hidden_size must be a multiple)
  int64_t intermediate_size = 3072;              ///< feed-forward width
  std::string hidden_act = "gelu";               ///< see models/activations.hpp
  double hidden_dropout_prob = 0.1;              ///< dropout after embeddings and sublayers
  double attention_probs_dropout_prob = 0.1;     ///< dropout on the attention weights
  int64_t max_position_embeddings = 512;         ///< longest sequence
  int64_t type_vocab_size = 2;                   ///< token types (segments)
  double initializer_range = 0.02;               ///< std of the random initialization
  double layer_norm_eps = 1e-12;                 ///< LayerNorm eps
  std::optional<int64_t> pad_token_id = 0;       ///< padding token (its embedding row gets no gradient)
  bool use_cache = true;                         ///< (decoder use; kept for the round trip)
  std::optional<double> classifier_dropout;      ///< dropout before the classifier (none: hidden_dropout_prob)
  bool is_decoder = false;                       ///< must be false: an encoder here
  bool add_cross_attention = false;              ///< must be false
  std::optional<int64_t> bos_token_id;           ///< (kept for the round trip)
  std::optional<int64_t> eos_token_id;           ///< (kept for the round trip)
  bool tie_word_embeddings = true;               ///< (no LM head here; kept for the round trip)
  std::optional<std::string> problem_type;       ///< regression, single_label_classification, multi_label_classification
  int64_t num_labels = 2;                        ///< classifier outputs (id2label's size when that is given)
  std::map<int64_t, std::string> id2label;       ///< label names (empty: LABEL_0 ...)
  std::map<std::string, int64_t> label2id;       ///< the inverse (empty: from id2label)

  static constexpr std::string_view model_type = "bert";  ///< config.json's model_type
};


/// Checks `config` (sizes positive and within ConfigLimits, ...); errors name `where` (the
/// config file, or "BertConfig").
LOOM_INLINE void validate(const BertConfig& config, std::string_view where);
/// The shapes `config` gives the embeddings, the last layer and the classifier, which
/// from_pretrained compares with the weight files' headers before it builds the model.
LOOM_INLINE std::vector<ConfigShape> config_shapes(const BertConfig& config);
/// The same without the classifier (the body every BERT head shares).
LOOM_INLINE std::vector<ConfigShape> body_shapes(const BertConfig& config);
/// The parameters BertForSequenceClassification has under `config` (num_parameters(),
/// counted from the config before anything is built).
LOOM_INLINE int64_t parameter_count(const BertConfig& config);
/// The parameters of BertModel (embeddings, layers, and the pooler when `pooler`).
LOOM_INLINE int64_t body_parameter_count(const BertConfig& config, bool pooler);

/// word + token_type + position embeddings, LayerNorm, dropout.
class BertEmbeddingsImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertEmbeddingsImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& token_type_ids);
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr}, token_type_embeddings{nullptr};
  NEFTune embedding_noise;  ///< on word_embeddings' output while training (--neftune_noise_alpha)
  torch::nn::LayerNorm LayerNorm{nullptr};  // NOLINT: HF's name
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertEmbeddings);

/// query, key, value and SDPA (HF's BertSelfAttention).
class BertSelfAttentionImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertSelfAttentionImpl(const BertConfig& config);
  /// `mask`: boolean [batch, 1, seq, seq] (true: attend) or undefined.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  peft::AdaptableLinear query{nullptr}, key{nullptr}, value{nullptr};

 private:
  int64_t heads_, head_dim_;
  double dropout_;
};
TORCH_MODULE(BertSelfAttention);

/// dense, dropout, LayerNorm(. + residual): HF's BertSelfOutput and BertOutput.
class BertResidualOutputImpl : public torch::nn::Module {
 public:
  LOOM_INLINE BertResidualOutputImpl(const BertConfig& config, int64_t in_features);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual);
  peft::AdaptableLinear dense{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};  // NOLINT: HF's name
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(BertResidualOutput);

/// self-attention and its output (HF's BertAttention: "self", "output").
class BertAttentionImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertAttentionImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  BertSelfAttention self{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertAttention);

/// dense + activation (HF's BertIntermediate).
class BertIntermediateImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertIntermediateImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  peft::AdaptableLinear dense{nullptr};

 private:
  ActivationFn activation_;  // hidden_act, resolved once
};
TORCH_MODULE(BertIntermediate);

/// One encoder layer: attention, intermediate, output.
class BertLayerImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertLayerImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask);
  BertAttention attention{nullptr};
  BertIntermediate intermediate{nullptr};
  BertResidualOutput output{nullptr};
};
TORCH_MODULE(BertLayer);

/// The layers, registered as "layer" (HF's BertEncoder).
class BertEncoderImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertEncoderImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(torch::Tensor x, const torch::Tensor& mask);
  torch::nn::ModuleList layer{nullptr};
  std::vector<FullShardUnit<BertLayer>> layers;  ///< the same layers, typed
};
TORCH_MODULE(BertEncoder);

/// The BERT body (HF's BertModel, with its pooler unless add_pooling_layer is false).
class BertModelImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertModelImpl(const BertConfig& config, bool add_pooling_layer = true);
  /// The pooled output tanh(pooler.dense(h[:, 0])) [batch, hidden_size]; attention_mask and
  /// token_type_ids may be undefined (no padding, segment 0). Needs the pooler.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                    const torch::Tensor& token_type_ids);
  /// The last layer's hidden states [batch, seq, hidden_size] (HF's sequence_output).
  LOOM_INLINE torch::Tensor sequence_output(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                            const torch::Tensor& token_type_ids);
  BertEmbeddings embeddings{nullptr};
  BertEncoder encoder{nullptr};
  torch::nn::Sequential pooler{nullptr};  ///< "dense" then tanh (none without the pooling layer)
};
TORCH_MODULE(BertModel);

/// BERT with a classification (or regression) head on the pooled output.
/// The memory plan's activation shape of a BERT encoder (models/activation_memory.hpp): post-LN
/// layers save the same tensors as the pre-norm ones counted there (the layer input, q, k, v,
/// sdpa's output and its contiguous copy, the two LayerNorms' inputs and outputs, the MLP's
/// input and activation output: 9h + 2f), dropout masks after attention and the MLP, sdpa's
/// math path with attention dropout; `vocab`: the head's output width (the MLM head's
/// vocabulary, 0 for a classifier's few labels).
inline ActivationShape bert_activation_shape(const BertConfig& c, int64_t vocab) {
  return {.layers = c.num_hidden_layers, .hidden = c.hidden_size, .kv = c.hidden_size, .mlp = 2 * c.intermediate_size,
          .heads = c.num_attention_heads, .vocab = vocab, .dropouts = c.hidden_dropout_prob > 0 ? 2 : 0,
          .attention_dropout = c.attention_probs_dropout_prob > 0};
}

class BertForSequenceClassificationImpl
    : public PreTrainedModel<BertForSequenceClassificationImpl, BertConfig, data::SequenceBatch> {
 public:
  static constexpr std::string_view architecture = "BertForSequenceClassification";  ///< config.json's architectures

  /// A model with HF's random initialization (Linear and Embedding weights normal(0,
  /// initializer_range), the padding row 0, biases 0, LayerNorms 1 and 0), drawn from torch's
  /// default generator.
  LOOM_INLINE explicit BertForSequenceClassificationImpl(BertConfig config = {});

  /// Loss (when batch.labels is defined) and logits: the Trainer's default compute_loss.
  LOOM_INLINE SequenceClassifierOutput forward(const data::SequenceBatch& batch);
  /// The memory plan's estimate of one training forward's saved activations, in bytes
  /// (bert_activation_shape): `bytes_per_element` 2 under --bf16 / --fp16, else 4; `recompute`
  /// under --gradient_checkpointing.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    return transformer_activation_bytes(bert_activation_shape(config(), 0), batch, seq, bytes_per_element, recompute);
  }
  /// Logits [batch, num_labels]; attention_mask (1 token, 0 padding) and token_type_ids may be undefined.
  LOOM_INLINE torch::Tensor logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                                   const torch::Tensor& token_type_ids = {});
  /// HF's loss for `logits` and `labels` under the config's problem_type (see above for the
  /// labels each takes; others are a loom::Error).
  LOOM_INLINE torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& labels) const;
  /// The names beyond the parameters that an HF BERT file may hold (none; bare BertModel
  /// files are read under "bert").
  LOOM_INLINE HfNameRules name_rules() const;
  /// HF's label rule (complete_labels), applied before every validation.
  static void complete_config(BertConfig& config) { complete_labels(config); }

  /// NEFTune's noise on the word embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return bert->embeddings->embedding_noise; }

  BertModel bert{nullptr};
  torch::nn::Dropout dropout{nullptr};
  peft::AdaptableLinear classifier{nullptr};

 private:
  LOOM_INLINE void init_weights();
};

/// Module holder of BertForSequenceClassificationImpl, with HF's from_pretrained.
class BertForSequenceClassification : public torch::nn::ModuleHolder<BertForSequenceClassificationImpl> {
 public:
  using torch::nn::ModuleHolder<BertForSequenceClassificationImpl>::ModuleHolder;
  /// Reads an HF folder: config.json, then the weights, checked strictly.
  LOOM_INLINE static BertForSequenceClassification from_pretrained(const std::filesystem::path& dir,
                                                                   torch::ScalarType dtype = torch::kFloat);
};


/// What BertForMaskedLM's forward(batch) returns.
struct MaskedLMOutput {
  torch::Tensor loss;    ///< cross-entropy over the labelled tokens (-100 ignored); undefined without labels
  torch::Tensor logits;  ///< [batch, seq, vocab_size]
};

/// dense, activation, LayerNorm (HF's BertPredictionHeadTransform).
class BertPredictionHeadTransformImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertPredictionHeadTransformImpl(const BertConfig& config);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  peft::AdaptableLinear dense{nullptr};
  torch::nn::LayerNorm LayerNorm{nullptr};  // NOLINT: HF's name

 private:
  ActivationFn activation_;  // hidden_act, resolved once
};
TORCH_MODULE(BertPredictionHeadTransform);

/// HF's BertLMPredictionHead: the transform, then the decoder. Tied (tie_word_embeddings,
/// HF's default): its weight is the word embeddings' and its bias is "bias" (files may hold
/// both again as decoder.weight and decoder.bias). Untied: "decoder.weight" and
/// "decoder.bias" are its own, and "bias" is kept but unused, as transformers 5 has it.
class BertLMPredictionHeadImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertLMPredictionHeadImpl(const BertConfig& config);
  /// Scores [.., vocab_size] of hidden states [.., hidden_size], with `tied` the decoder
  /// weight when the head has none of its own.
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& tied);
  BertPredictionHeadTransform transform{nullptr};
  torch::Tensor bias;                          ///< [vocab_size]
  std::shared_ptr<torch::nn::Module> decoder;  ///< "weight" [vocab_size, hidden_size], "bias" when untied, else null
  torch::Tensor decoder_weight, decoder_bias;  ///< those (undefined when tied)
};
TORCH_MODULE(BertLMPredictionHead);

/// HF's BertOnlyMLMHead: "predictions".
class BertOnlyMLMHeadImpl : public torch::nn::Module {
 public:
  LOOM_INLINE explicit BertOnlyMLMHeadImpl(const BertConfig& config);
  BertLMPredictionHead predictions{nullptr};
};
TORCH_MODULE(BertOnlyMLMHead);

/// BERT with the masked-language-model head (transformers' BertForMaskedLM): the body without
/// its pooler ("bert"), and "cls.predictions". Its files may hold the tied copies
/// cls.predictions.decoder.{weight,bias} (tied config); the pooler and next-sentence head of a
/// BertForPreTraining file (bert.pooler.dense.*, cls.seq_relationship.*) are skipped, as HF
/// skips them. Batches: SequenceBatch with labels [batch, seq] (data/mlm.hpp masks them).
class BertForMaskedLMImpl : public PreTrainedModel<BertForMaskedLMImpl, BertConfig, data::SequenceBatch> {
 public:
  static constexpr std::string_view architecture = "BertForMaskedLM";  ///< config.json's architectures

  /// A model with HF's random initialization (as BertForSequenceClassification's; the
  /// prediction bias 0), drawn from torch's default generator.
  LOOM_INLINE explicit BertForMaskedLMImpl(BertConfig config = {});

  /// Loss (when batch.labels is defined) and logits: the Trainer's default compute_loss.
  LOOM_INLINE MaskedLMOutput forward(const data::SequenceBatch& batch);
  /// The memory plan's estimate of one training forward's saved activations, in bytes
  /// (bert_activation_shape): `bytes_per_element` 2 under --bf16 / --fp16, else 4; `recompute`
  /// under --gradient_checkpointing.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool recompute) const {
    return transformer_activation_bytes(bert_activation_shape(config(), config().vocab_size), batch, seq, bytes_per_element, recompute);
  }
  /// Logits [batch, seq, vocab_size]; attention_mask and token_type_ids may be undefined.
  LOOM_INLINE torch::Tensor logits(const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                                   const torch::Tensor& token_type_ids = {});
  /// HF's masked-LM loss: cross-entropy of logits [batch, seq, vocab] against int64 labels
  /// [batch, seq] with -100 ignored, the mean over the labelled tokens.
  LOOM_INLINE torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& labels) const;
  /// The tied copies and the BertForPreTraining heads a file may hold (see above).
  LOOM_INLINE HfNameRules name_rules() const;
  /// The body's shapes and the prediction bias, compared with a folder's weights.
  LOOM_INLINE static std::vector<ConfigShape> config_shapes(const BertConfig& config);
  /// The parameters of this model under `config`: the body without a pooler and the MLM head.
  LOOM_INLINE static int64_t parameter_count(const BertConfig& config);
  /// HF's label rule (complete_labels), applied before every validation.
  static void complete_config(BertConfig& config) { complete_labels(config); }

  /// NEFTune's noise on the word embeddings (the Trainer sets it from --neftune_noise_alpha).
  NEFTune& neftune() { return bert->embeddings->embedding_noise; }

  BertModel bert{nullptr};
  BertOnlyMLMHead cls{nullptr};
};

/// Module holder of BertForMaskedLMImpl, with HF's from_pretrained.
class BertForMaskedLM : public torch::nn::ModuleHolder<BertForMaskedLMImpl> {
 public:
  using torch::nn::ModuleHolder<BertForMaskedLMImpl>::ModuleHolder;
  /// Reads an HF folder: config.json, then the weights, checked strictly.
  LOOM_INLINE static BertForMaskedLM from_pretrained(const std::filesystem::path& dir,
                                                     torch::ScalarType dtype = torch::kFloat);
};

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/bert.ipp>
#endif
