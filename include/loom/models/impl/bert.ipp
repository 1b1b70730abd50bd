#pragma once
// Definitions of models/bert.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/models/pretrained.hpp>

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace loom::models {

LOOM_INLINE void validate(const BertConfig& c, std::string_view where) {
  check_config_size(where, "vocab_size", c.vocab_size, ConfigLimits::vocab_size);
  check_config_size(where, "hidden_size", c.hidden_size, ConfigLimits::width);
  check_config_size(where, "num_hidden_layers", c.num_hidden_layers, ConfigLimits::layers);
  check_config_size(where, "num_attention_heads", c.num_attention_heads, ConfigLimits::width);
  check_config_size(where, "intermediate_size", c.intermediate_size, ConfigLimits::feed_forward);
  check_config_size(where, "max_position_embeddings", c.max_position_embeddings, ConfigLimits::positions);
  check_config_size(where, "type_vocab_size", c.type_vocab_size, ConfigLimits::vocab_size);
  check(c.hidden_size % c.num_attention_heads == 0, "{}: hidden_size ({}) must be a multiple of num_attention_heads ({})",
        where, c.hidden_size, c.num_attention_heads);
  check(is_known_activation(c.hidden_act), "{}: field 'hidden_act' is \"{}\"; loom knows {}", where, c.hidden_act,
        known_activations);
  for (const auto& [p, field] : {std::pair{c.hidden_dropout_prob, "hidden_dropout_prob"},
                                 std::pair{c.attention_probs_dropout_prob, "attention_probs_dropout_prob"},
                                 std::pair{c.classifier_dropout.value_or(0.0), "classifier_dropout"}})
    check(p >= 0.0 && p < 1.0, "{}: field '{}' must be in [0, 1), got {}", where, field, p);
  check(c.layer_norm_eps > 0.0, "{}: field 'layer_norm_eps' must be positive, got {}", where, c.layer_norm_eps);
  check(!c.is_decoder && !c.add_cross_attention, "{}: is_decoder / add_cross_attention are set; loom's BERT is an "
                                                 "encoder",
        where);
  if (c.pad_token_id)
    check(*c.pad_token_id >= 0 && *c.pad_token_id < c.vocab_size, "{}: field 'pad_token_id' ({}) is outside the "
                                                                   "vocabulary (vocab_size {})",
          where, *c.pad_token_id, c.vocab_size);
  validate_labels(c.num_labels, c.problem_type, where);
}

LOOM_INLINE std::vector<ConfigShape> config_shapes(const BertConfig& c) {
  auto shapes = body_shapes(c);
  shapes.push_back({"classifier.weight", {c.num_labels, c.hidden_size},
                    "num_labels " + std::to_string(c.num_labels) + ", hidden_size " + std::to_string(c.hidden_size)});
  return shapes;
}

LOOM_INLINE std::vector<ConfigShape> body_shapes(const BertConfig& c) {
  const auto h = ", hidden_size " + std::to_string(c.hidden_size);
  const auto last = std::to_string(c.num_hidden_layers - 1);
  return {{"bert.embeddings.word_embeddings.weight", {c.vocab_size, c.hidden_size},
           "vocab_size " + std::to_string(c.vocab_size) + h},
          {"bert.embeddings.position_embeddings.weight", {c.max_position_embeddings, c.hidden_size},
           "max_position_embeddings " + std::to_string(c.max_position_embeddings) + h},
          {"bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, c.hidden_size},
           "type_vocab_size " + std::to_string(c.type_vocab_size) + h},
          {"bert.encoder.layer." + last + ".intermediate.dense.weight", {c.intermediate_size, c.hidden_size},
           "num_hidden_layers " + std::to_string(c.num_hidden_layers) + ", intermediate_size " +
               std::to_string(c.intermediate_size) + h}};
}

LOOM_INLINE int64_t body_parameter_count(const BertConfig& c, bool pooler) {
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  const int64_t embeddings = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * h + 2 * h;
  // query, key, value; the attention's output dense and LayerNorm; intermediate; output dense and LayerNorm
  const int64_t layer = 3 * (h * h + h) + (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h;
  return embeddings + c.num_hidden_layers * layer + (pooler ? h * h + h : 0);
}

LOOM_INLINE int64_t parameter_count(const BertConfig& c) {
  return body_parameter_count(c, /*pooler=*/true) + c.hidden_size * c.num_labels + c.num_labels;
}

namespace detail {
LOOM_INLINE torch::nn::LayerNorm bert_layer_norm(const BertConfig& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layer_norm_eps));
}

// PreTrainedModel._init_weights over every module of `model`, in module order: Linear weights
// (peft::AdaptableLinear) and Embeddings normal(0, std) with the padding row 0, biases 0,
// LayerNorms 1 and 0. The linear layers draw nothing when built, so the Embeddings'
// constructors and these are the only draws.
LOOM_INLINE void init_bert_weights(torch::nn::Module& model, double std) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* m = item.value().get();
    if (auto* linear = dynamic_cast<peft::AdaptableLinearImpl*>(m)) {
      linear->weight.normal_(0.0, std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(m)) {
      embedding->weight.normal_(0.0, std);
      if (const auto pad = embedding->options.padding_idx()) embedding->weight[*pad].zero_();
    } else if (auto* norm = dynamic_cast<torch::nn::LayerNormImpl*>(m)) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}
}  // namespace detail

// ---- embeddings ---------------------------------------------------------------------------

LOOM_INLINE BertEmbeddingsImpl::BertEmbeddingsImpl(const BertConfig& c) {
  auto words = torch::nn::EmbeddingOptions(c.vocab_size, c.hidden_size);
  if (c.pad_token_id) words.padding_idx(*c.pad_token_id);
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(words));
  position_embeddings = register_module("position_embeddings", torch::nn::Embedding(c.max_position_embeddings,
                                                                                    c.hidden_size));
  token_type_embeddings = register_module("token_type_embeddings", torch::nn::Embedding(c.type_vocab_size,
                                                                                        c.hidden_size));
  LayerNorm = register_module("LayerNorm", detail::bert_layer_norm(c));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

LOOM_INLINE torch::Tensor BertEmbeddingsImpl::forward(const torch::Tensor& input_ids,
                                                      const torch::Tensor& token_type_ids) {
  const int64_t seq = input_ids.size(1);
  check(seq <= position_embeddings->weight.size(0), "BERT got a sequence of {} tokens; max_position_embeddings is {}",
        seq, position_embeddings->weight.size(0));
  const auto positions = torch::arange(seq, input_ids.options().dtype(torch::kLong)).unsqueeze(0);
  const auto types = token_type_ids.defined() ? token_type_ids : torch::zeros_like(input_ids);
  // One statement per lookup, in transformers' order (autograd sums in node order).
  const auto words = embedding_noise(word_embeddings(input_ids), is_training());
  auto x = words + token_type_embeddings(types);
  x = x + position_embeddings(positions);
  return dropout(LayerNorm(x));
}

// ---- one layer ----------------------------------------------------------------------------

LOOM_INLINE BertSelfAttentionImpl::BertSelfAttentionImpl(const BertConfig& c)
    : heads_(c.num_attention_heads), head_dim_(c.hidden_size / c.num_attention_heads),
      dropout_(c.attention_probs_dropout_prob) {
  query = register_module("query", peft::AdaptableLinear(c.hidden_size, c.hidden_size, /*bias=*/true));
  key = register_module("key", peft::AdaptableLinear(c.hidden_size, c.hidden_size, /*bias=*/true));
  value = register_module("value", peft::AdaptableLinear(c.hidden_size, c.hidden_size, /*bias=*/true));
}

LOOM_INLINE torch::Tensor BertSelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, heads_, head_dim_}).transpose(1, 2); };
  std::optional<torch::Tensor> attn_mask;
  if (mask.defined()) attn_mask = mask;
  // query, key, value in that order, one statement each: x feeds all three (and the
  // residual), and autograd sums its gradients in the reverse order of the nodes.
  const auto q = heads(query(x));
  const auto k = heads(key(x));
  const auto v = heads(value(x));
  auto y = at::scaled_dot_product_attention(q, k, v, attn_mask,
                                            is_training() ? dropout_ : 0.0, /*is_causal=*/false,
                                            std::pow(static_cast<double>(head_dim_), -0.5));
  return y.transpose(1, 2).contiguous().reshape({batch, seq, -1});
}

LOOM_INLINE BertResidualOutputImpl::BertResidualOutputImpl(const BertConfig& c, int64_t in_features) {
  dense = register_module("dense", peft::AdaptableLinear(in_features, c.hidden_size, /*bias=*/true));
  LayerNorm = register_module("LayerNorm", detail::bert_layer_norm(c));
  dropout = register_module("dropout", torch::nn::Dropout(c.hidden_dropout_prob));
}

LOOM_INLINE torch::Tensor BertResidualOutputImpl::forward(const torch::Tensor& x, const torch::Tensor& residual) {
  return LayerNorm(dropout(dense(x)) + residual);
}

LOOM_INLINE BertAttentionImpl::BertAttentionImpl(const BertConfig& c) {
  self = register_module("self", BertSelfAttention(c));
  output = register_module("output", BertResidualOutput(c, c.hidden_size));
}

LOOM_INLINE torch::Tensor BertAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  return output(self(x, mask), x);
}

LOOM_INLINE BertIntermediateImpl::BertIntermediateImpl(const BertConfig& c) : activation_(activation_fn(c.hidden_act)) {
  dense = register_module("dense", peft::AdaptableLinear(c.hidden_size, c.intermediate_size, /*bias=*/true));
}

LOOM_INLINE torch::Tensor BertIntermediateImpl::forward(const torch::Tensor& x) {
  return activation_(dense(x));
}

LOOM_INLINE BertLayerImpl::BertLayerImpl(const BertConfig& c) {
  attention = register_module("attention", BertAttention(c));
  intermediate = register_module("intermediate", BertIntermediate(c));
  output = register_module("output", BertResidualOutput(c, c.intermediate_size));
}

LOOM_INLINE torch::Tensor BertLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const auto a = attention(x, mask);
  return output(intermediate(a), a);
}

LOOM_INLINE BertEncoderImpl::BertEncoderImpl(const BertConfig& c) {
  layer = register_module("layer", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(full_shard_unit(BertLayer(c)));
    layer->push_back(layers.back());
  }
}

LOOM_INLINE torch::Tensor BertEncoderImpl::forward(torch::Tensor x, const torch::Tensor& mask) {
  for (auto& l : layers) x = l->forward(x, mask);
  return x;
}

// ---- the body and the classifier ------------------------------------------------------------

LOOM_INLINE BertModelImpl::BertModelImpl(const BertConfig& c, bool add_pooling_layer) {
  embeddings = register_module("embeddings", BertEmbeddings(c));
  encoder = register_module("encoder", BertEncoder(c));
  if (add_pooling_layer)
    pooler = register_module(
        "pooler", torch::nn::Sequential({{"dense", peft::AdaptableLinear(c.hidden_size, c.hidden_size, /*bias=*/true)},
                                         {"activation", torch::nn::Tanh()}}));
}

LOOM_INLINE torch::Tensor BertModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                                                 const torch::Tensor& token_type_ids) {
  check(!pooler.is_empty(), "this BertModel has no pooler (add_pooling_layer false); call sequence_output");
  return pooler->forward(sequence_output(input_ids, attention_mask, token_type_ids).select(1, 0));
}

LOOM_INLINE torch::Tensor BertModelImpl::sequence_output(const torch::Tensor& input_ids,
                                                         const torch::Tensor& attention_mask,
                                                         const torch::Tensor& token_type_ids) {
  check(input_ids.dim() == 2, "BERT takes input_ids of shape [batch, seq], got {}", c10::str(input_ids.sizes()));
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  torch::Tensor mask;
  // As transformers' sdpa path: no mask when nothing is padded (the check reads one value
  // back from the device, as HF's does), else a boolean [batch, 1, seq, seq] (true: attend).
  if (attention_mask.defined()) {
    check(attention_mask.sizes() == input_ids.sizes(), "BERT: attention_mask has shape {} but input_ids {}",
          c10::str(attention_mask.sizes()), c10::str(input_ids.sizes()));
    const auto keep = attention_mask.to(torch::kBool);
    if (!keep.all().item<bool>()) mask = keep.view({batch, 1, 1, seq}).expand({batch, 1, seq, seq});
  }
  return encoder(embeddings(input_ids, token_type_ids), mask);
}

LOOM_INLINE BertForSequenceClassificationImpl::BertForSequenceClassificationImpl(BertConfig config)
    : PreTrainedModel(std::move(config), "BertConfig") {
  bert = register_module("bert", BertModel(config_));
  dropout = register_module("dropout", torch::nn::Dropout(config_.classifier_dropout.value_or(config_.hidden_dropout_prob)));
  classifier =
      register_module("classifier", peft::AdaptableLinear(config_.hidden_size, config_.num_labels, /*bias=*/true));
  init_weights();
}

LOOM_INLINE void BertForSequenceClassificationImpl::init_weights() {
  detail::init_bert_weights(*this, config_.initializer_range);
}

LOOM_INLINE torch::Tensor BertForSequenceClassificationImpl::logits(const torch::Tensor& input_ids,
                                                                    const torch::Tensor& attention_mask,
                                                                    const torch::Tensor& token_type_ids) {
  return classifier(dropout(bert(input_ids, attention_mask, token_type_ids)));
}

LOOM_INLINE torch::Tensor BertForSequenceClassificationImpl::loss(const torch::Tensor& logits,
                                                                  const torch::Tensor& labels) const {
  return sequence_classification_loss(config_.problem_type, config_.num_labels, logits, labels,
                                      "BertForSequenceClassification");
}

LOOM_INLINE SequenceClassifierOutput BertForSequenceClassificationImpl::forward(const data::SequenceBatch& batch) {
  SequenceClassifierOutput out;
  out.logits = logits(batch.input_ids, batch.attention_mask);
  if (batch.labels.defined()) out.loss = loss(out.logits, batch.labels);
  return out;
}

LOOM_INLINE HfNameRules BertForSequenceClassificationImpl::name_rules() const {
  return HfNameRules{.base_prefix = "bert", .derived = {}, .ignored_suffixes = {}, .may_be_new = {}};
}

LOOM_INLINE BertForSequenceClassification BertForSequenceClassification::from_pretrained(
    const std::filesystem::path& dir, torch::ScalarType dtype) {
  return load_pretrained<BertForSequenceClassification>(dir, dtype);
}

// ---- the masked-LM head -----------------------------------------------------------------------

LOOM_INLINE BertPredictionHeadTransformImpl::BertPredictionHeadTransformImpl(const BertConfig& c)
    : activation_(activation_fn(c.hidden_act)) {
  dense = register_module("dense", peft::AdaptableLinear(c.hidden_size, c.hidden_size, /*bias=*/true));
  LayerNorm = register_module("LayerNorm", detail::bert_layer_norm(c));
}

LOOM_INLINE torch::Tensor BertPredictionHeadTransformImpl::forward(const torch::Tensor& x) {
  return LayerNorm(activation_(dense(x)));
}

LOOM_INLINE BertLMPredictionHeadImpl::BertLMPredictionHeadImpl(const BertConfig& c) {
  transform = register_module("transform", BertPredictionHeadTransform(c));
  if (!c.tie_word_embeddings) {
    decoder = register_module("decoder", std::make_shared<torch::nn::Module>());
    decoder_weight = decoder->register_parameter("weight", torch::empty({c.vocab_size, c.hidden_size}));
    decoder_bias = decoder->register_parameter("bias", torch::zeros({c.vocab_size}));
  }
  bias = register_parameter("bias", torch::zeros({c.vocab_size}));
}

LOOM_INLINE torch::Tensor BertLMPredictionHeadImpl::forward(const torch::Tensor& x, const torch::Tensor& tied) {
  if (decoder_weight.defined()) return torch::nn::functional::linear(transform(x), decoder_weight, decoder_bias);
  return torch::nn::functional::linear(transform(x), tied, bias);
}

LOOM_INLINE BertOnlyMLMHeadImpl::BertOnlyMLMHeadImpl(const BertConfig& c) {
  predictions = register_module("predictions", BertLMPredictionHead(c));
}

LOOM_INLINE BertForMaskedLMImpl::BertForMaskedLMImpl(BertConfig config) : PreTrainedModel(std::move(config), "BertConfig") {
  bert = register_module("bert", BertModel(config_, /*add_pooling_layer=*/false));
  cls = register_module("cls", BertOnlyMLMHead(config_));
  detail::init_bert_weights(*this, config_.initializer_range);
  torch::NoGradGuard no_grad;
  if (cls->predictions->decoder_weight.defined()) cls->predictions->decoder_weight.normal_(0.0, config_.initializer_range);
  cls->predictions->bias.zero_();
}

LOOM_INLINE torch::Tensor BertForMaskedLMImpl::logits(const torch::Tensor& input_ids,
                                                      const torch::Tensor& attention_mask,
                                                      const torch::Tensor& token_type_ids) {
  return cls->predictions(bert->sequence_output(input_ids, attention_mask, token_type_ids),
                          bert->embeddings->word_embeddings->weight);
}

LOOM_INLINE torch::Tensor BertForMaskedLMImpl::loss(const torch::Tensor& logits, const torch::Tensor& labels) const {
  const bool integer = labels.scalar_type() == torch::kLong || labels.scalar_type() == torch::kInt;
  check(integer && labels.dim() == 2 && labels.size(0) == logits.size(0) && labels.size(1) == logits.size(1),
        "BertForMaskedLM takes integer token labels [batch, seq] (-100: not predicted) matching input_ids {}; got {} "
        "labels of shape {} (masked-LM data comes from loom::data::MaskedLMDataset)",
        c10::str(logits.sizes().slice(0, 2)), c10::toString(labels.scalar_type()), c10::str(labels.sizes()));
  const int64_t vocab = config_.vocab_size;
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), labels.reshape({-1}).to(torch::kLong));
}

LOOM_INLINE MaskedLMOutput BertForMaskedLMImpl::forward(const data::SequenceBatch& batch) {
  MaskedLMOutput out;
  out.logits = logits(batch.input_ids, batch.attention_mask);
  if (batch.labels.defined()) out.loss = loss(out.logits, batch.labels);
  return out;
}

LOOM_INLINE HfNameRules BertForMaskedLMImpl::name_rules() const {
  HfNameRules rules{.base_prefix = "bert", .derived = {},
                    .ignored_suffixes = {"pooler.dense.weight", "pooler.dense.bias", "cls.seq_relationship.weight",
                                         "cls.seq_relationship.bias"},
                    .may_be_new = {}};
  if (config_.tie_word_embeddings)
    rules.derived = {{"cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"},
                     {"cls.predictions.decoder.bias", "cls.predictions.bias"}};
  return rules;
}

LOOM_INLINE std::vector<ConfigShape> BertForMaskedLMImpl::config_shapes(const BertConfig& c) {
  auto shapes = body_shapes(c);
  shapes.push_back({"cls.predictions.bias", {c.vocab_size}, "vocab_size " + std::to_string(c.vocab_size)});
  return shapes;
}

LOOM_INLINE int64_t BertForMaskedLMImpl::parameter_count(const BertConfig& c) {
  const int64_t h = c.hidden_size;
  // the head's transform (dense, LayerNorm) and bias; an untied decoder has its weight and bias
  const int64_t head = (h * h + h) + 2 * h + c.vocab_size + (c.tie_word_embeddings ? 0 : c.vocab_size * h + c.vocab_size);
  return body_parameter_count(c, /*pooler=*/false) + head;
}

LOOM_INLINE BertForMaskedLM BertForMaskedLM::from_pretrained(const std::filesystem::path& dir, torch::ScalarType dtype) {
  return load_pretrained<BertForMaskedLM>(dir, dtype);
}

}  // namespace loom::models
