#pragma once
// Definitions of models/gpt2.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/models/pretrained.hpp>

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

namespace loom::models {

LOOM_INLINE void validate(const GPT2Config& c, std::string_view where) {
  check_config_size(where, "vocab_size", c.vocab_size, ConfigLimits::vocab_size);
  check_config_size(where, "n_positions", c.n_positions, ConfigLimits::positions);
  check_config_size(where, "n_embd", c.n_embd, ConfigLimits::width);
  check_config_size(where, "n_layer", c.n_layer, ConfigLimits::layers);
  check_config_size(where, "n_head", c.n_head, ConfigLimits::width);
  if (c.n_inner) check_config_size(where, "n_inner", *c.n_inner, ConfigLimits::feed_forward);
  check(c.n_embd % c.n_head == 0, "{}: n_embd ({}) must be a multiple of n_head ({})", where, c.n_embd, c.n_head);
  check(is_known_activation(c.activation_function), "{}: field 'activation_function' is \"{}\"; loom knows {}", where,
        c.activation_function, known_activations);
  for (const auto& [p, field] : {std::pair{c.resid_pdrop, "resid_pdrop"}, std::pair{c.embd_pdrop, "embd_pdrop"},
                                 std::pair{c.attn_pdrop, "attn_pdrop"}})
    check(p >= 0.0 && p < 1.0, "{}: field '{}' must be in [0, 1), got {}", where, field, p);
  check(c.layer_norm_epsilon > 0.0, "{}: field 'layer_norm_epsilon' must be positive, got {}", where,
        c.layer_norm_epsilon);
  check(!c.add_cross_attention, "{}: field 'add_cross_attention' is true; loom's GPT-2 has no cross-attention", where);
}

LOOM_INLINE std::vector<ConfigShape> config_shapes(const GPT2Config& c) {
  const int64_t inner = c.n_inner.value_or(4 * c.n_embd);
  const auto e = ", n_embd " + std::to_string(c.n_embd);
  return {{"transformer.wte.weight", {c.vocab_size, c.n_embd}, "vocab_size " + std::to_string(c.vocab_size) + e},
          {"transformer.wpe.weight", {c.n_positions, c.n_embd}, "n_positions " + std::to_string(c.n_positions) + e},
          {"transformer.h." + std::to_string(c.n_layer - 1) + ".mlp.c_fc.weight", {c.n_embd, inner},
           "n_layer " + std::to_string(c.n_layer) + e + ", inner width " + std::to_string(inner)}};
}

LOOM_INLINE int64_t parameter_count(const GPT2Config& c) {
  const int64_t e = c.n_embd, inner = c.n_inner.value_or(4 * e);
  // ln_1, attention's c_attn and c_proj, ln_2, the MLP's c_fc and c_proj (Conv1D: weight and bias)
  const int64_t block = 2 * e + (e * 3 * e + 3 * e) + (e * e + e) + 2 * e + (e * inner + inner) + (inner * e + e);
  const int64_t lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * e;
  return c.vocab_size * e + c.n_positions * e + c.n_layer * block + 2 * e + lm_head;
}

// ---- Conv1D ------------------------------------------------------------------------------

LOOM_INLINE Conv1DImpl::Conv1DImpl(int64_t in_features, int64_t out_features)
    : peft::AdaptableLinearImpl(in_features, out_features, /*bias=*/true, /*fan_in_fan_out=*/true) {}

// ---- attention, MLP, block ---------------------------------------------------------------

LOOM_INLINE GPT2AttentionImpl::GPT2AttentionImpl(const GPT2Config& c, int64_t layer_idx)
    : n_embd_(c.n_embd), n_head_(c.n_head) {
  c_attn = register_module("c_attn", Conv1D(c.n_embd, 3 * c.n_embd));
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(c.attn_pdrop));
  c_proj = register_module("c_proj", Conv1D(c.n_embd, c.n_embd));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.resid_pdrop));
  scaling_ = c.scale_attn_weights ? std::pow(static_cast<double>(c.n_embd / c.n_head), -0.5) : 1.0;
  if (c.scale_attn_by_inverse_layer_idx) scaling_ /= static_cast<double>(layer_idx + 1);
}

LOOM_INLINE torch::Tensor GPT2AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  const int64_t batch = x.size(0), seq = x.size(1), head_dim = n_embd_ / n_head_;
  const auto qkv = c_attn(x).split(n_embd_, 2);
  // One statement per operation, in transformers' order (key and value, then query): the
  // order of autograd's nodes decides the order in which gradients are summed.
  const auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, -1, head_dim}).transpose(1, 2); };
  const auto k = heads(qkv[1]);
  const auto v = heads(qkv[2]);
  const auto q = heads(qkv[0]);
  const double dropout = is_training() ? attn_dropout->options.p() : 0.0;  // HF: self.attn_dropout.p in training
  auto y = mask.defined() ? at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/false, scaling_)
                          : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout,
                                                             /*is_causal=*/seq > 1, scaling_);
  y = y.transpose(1, 2).contiguous().reshape({batch, seq, n_embd_});
  return resid_dropout(c_proj(y));
}

LOOM_INLINE torch::Tensor GPT2AttentionImpl::forward_step(const torch::Tensor& x, const AttentionStep& step) {
  // GPT2Attention.forward with a cache, in eval mode: q, k, v split, the cache's keys and
  // values before this step's, then sdpa with the step's mask (none: causal for a prompt).
  const int64_t batch = x.size(0), seq = x.size(1), head_dim = n_embd_ / n_head_;
  const auto qkv = c_attn(x).split(n_embd_, 2);
  const auto heads = [&](const torch::Tensor& t) { return t.view({batch, seq, -1, head_dim}).transpose(1, 2); };
  auto k = heads(qkv[1]);
  auto v = heads(qkv[2]);
  const auto q = heads(qkv[0]);
  if (step.cache != nullptr) std::tie(k, v) = step.cache->update(k, v);
  const bool causal = seq > 1 && !step.mask.defined();
  auto y = at::scaled_dot_product_attention(q, k, v, step.sdpa_mask(), 0.0, causal, scaling_);
  y = y.transpose(1, 2).contiguous().reshape({batch, seq, n_embd_});
  return c_proj(y);
}

LOOM_INLINE GPT2MLPImpl::GPT2MLPImpl(const GPT2Config& c)
    : activation_(activation_fn(c.activation_function)),
      fast_activation_(activation_fn(c.activation_function == "gelu_new" ? "gelu_pytorch_tanh" : c.activation_function)) {
  const int64_t inner = c.n_inner.value_or(4 * c.n_embd);
  c_fc = register_module("c_fc", Conv1D(c.n_embd, inner));
  c_proj = register_module("c_proj", Conv1D(inner, c.n_embd));
  dropout = register_module("dropout", torch::nn::Dropout(c.resid_pdrop));
}

LOOM_INLINE torch::Tensor GPT2MLPImpl::forward(const torch::Tensor& x) {
  const auto act = fast_kernels(kernels, x) ? fast_activation_ : activation_;
  return dropout(c_proj(act(c_fc(x))));
}

LOOM_INLINE GPT2BlockImpl::GPT2BlockImpl(const GPT2Config& c, int64_t layer_idx) {
  const auto ln = [&] { return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon)); };
  ln_1 = register_module("ln_1", ln());
  attn = register_module("attn", GPT2Attention(c, layer_idx));
  ln_2 = register_module("ln_2", ln());
  mlp = register_module("mlp", GPT2MLP(c));
}

LOOM_INLINE torch::Tensor GPT2BlockImpl::forward(const torch::Tensor& x) {
  auto h = attn(ln_1(x)) + x;
  return h + mlp(ln_2(h));
}

LOOM_INLINE torch::Tensor GPT2BlockImpl::forward(const torch::Tensor& x, const torch::Tensor& mask) {
  auto h = attn(ln_1(x), mask) + x;
  return h + mlp(ln_2(h));
}

LOOM_INLINE torch::Tensor GPT2BlockImpl::forward(const torch::Tensor& x, const AttentionStep& step) {
  auto h = attn->forward_step(ln_1(x), step) + x;
  return h + mlp(ln_2(h));
}

// ---- the body and the LM head -------------------------------------------------------------

LOOM_INLINE GPT2ModelImpl::GPT2ModelImpl(const GPT2Config& c) {
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(c.n_positions, c.n_embd));
  drop = register_module("drop", torch::nn::Dropout(c.embd_pdrop));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks.push_back(full_shard_unit(GPT2Block(c, i)));
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon)));
}

LOOM_INLINE torch::Tensor GPT2ModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  check(input_ids.dim() == 2, "GPT-2 takes input_ids of shape [batch, seq], got {}", c10::str(input_ids.sizes()));
  const int64_t seq = input_ids.size(1);
  check(seq <= wpe->weight.size(0), "GPT-2 got a sequence of {} tokens; n_positions is {}", seq, wpe->weight.size(0));
  const auto mask = padding_attention_mask(attention_mask, input_ids);
  const auto positions = torch::arange(seq, input_ids.options().dtype(torch::kLong)).unsqueeze(0);
  const auto tokens = embedding_noise(wte(input_ids), is_training());
  auto x = drop(tokens + wpe(positions));
  for (auto& block : blocks) x = mask.defined() ? block->forward(x, mask) : block->forward(x);
  return ln_f(x);
}

LOOM_INLINE torch::Tensor GPT2ModelImpl::forward_step(const DecodeStep& step) {
  // GPT2Model.forward as generate calls it: wte + wpe(position_ids), the causal mask with
  // padding, each block with its layer of the cache.
  const int64_t query = step.input_ids.size(1);
  const int64_t past = step.cache != nullptr ? step.cache->seq_length() : 0;
  if (step.cache != nullptr) step.cache->layers.resize(blocks.size());
  const auto x0 = wte(step.input_ids) + wpe(step.position_ids);
  const auto mask = step_attention_mask(step.attention_mask, query, past + query, x0.device());
  auto x = drop(x0);
  for (size_t i = 0; i < blocks.size(); ++i)
    x = blocks[i]->forward(x, AttentionStep{mask, step.cache != nullptr ? &step.cache->layers[i] : nullptr});
  return ln_f(x);
}

LOOM_INLINE GPT2LMHeadModelImpl::GPT2LMHeadModelImpl(GPT2Config config)
    : PreTrainedModel(std::move(config), "GPT2Config") {
  transformer = register_module("transformer", GPT2Model(config_));
  if (!config_.tie_word_embeddings)
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(config_.n_embd, config_.vocab_size)
                                                               .bias(false)));
  init_weights();
}

LOOM_INLINE void GPT2LMHeadModelImpl::init_weights() {
  detail::init_gpt2_body(*transformer, config_);
  torch::NoGradGuard no_grad;
  if (lm_head) lm_head->weight.normal_(0.0, config_.initializer_range);
}

LOOM_INLINE void detail::init_gpt2_body(GPT2ModelImpl& body, const GPT2Config& config) {
  // GPT2PreTrainedModel._init_weights over every module.
  torch::NoGradGuard no_grad;
  const double std = config.initializer_range;
  const double residual_std = std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  body.wte->weight.normal_(0.0, std);
  body.wpe->weight.normal_(0.0, std);
  const auto layer_norm = [](torch::nn::LayerNorm& ln) {
    ln->weight.fill_(1.0);
    ln->bias.zero_();
  };
  for (auto& unit : body.blocks) {
    auto& b = unit->inner();
    layer_norm(b->ln_1);
    layer_norm(b->ln_2);
    for (Conv1D* conv : {&b->attn->c_attn, &b->attn->c_proj, &b->mlp->c_fc, &b->mlp->c_proj}) {
      (*conv)->weight.normal_(0.0, std);
      (*conv)->bias.zero_();
    }
    b->attn->c_proj->weight.normal_(0.0, residual_std);
    b->mlp->c_proj->weight.normal_(0.0, residual_std);
  }
  layer_norm(body.ln_f);
}

LOOM_INLINE void GPT2LMHeadModelImpl::set_kernels(Kernels kernels) {
  kernels_ = kernels;
  for (auto& block : transformer->blocks) block->inner()->mlp->kernels = kernels;
}

LOOM_INLINE torch::Tensor GPT2LMHeadModelImpl::logits(const torch::Tensor& input_ids) {
  return forward({input_ids, {}}).logits;
}

LOOM_INLINE CausalLMOutput GPT2LMHeadModelImpl::forward(const data::CausalLMBatch& batch) {
  check(!batch.position_ids.defined(),
        "GPT-2 takes no position_ids (packed sequences): its attention would cross the documents; pad the batch "
        "instead, or use the Llama architecture, which attends within each packed document");
  const auto hidden = transformer(batch.input_ids);
  const torch::Tensor& weight = lm_head ? lm_head->weight : transformer->wte->weight;
  return causal_lm_output(hidden, weight, batch.labels, fast_kernels(kernels_, hidden));
}

LOOM_INLINE TokenScores GPT2LMHeadModelImpl::token_scores(const data::CausalLMBatch& batch, bool statistics,
                                                      std::optional<bool> chunked) {
  check(!batch.position_ids.defined(), "GPT-2 takes no position_ids (packed sequences); pad the batch instead");
  const auto hidden = transformer(batch.input_ids);
  const torch::Tensor& weight = lm_head ? lm_head->weight : transformer->wte->weight;
  return models::token_scores(hidden, weight, batch.labels, fast_kernels(kernels_, hidden), statistics, chunked);
}

LOOM_INLINE torch::Tensor GPT2LMHeadModelImpl::next_token_logits(const DecodeStep& step) {
  const auto hidden = transformer->forward_step(step);
  const auto last = hidden.narrow(1, hidden.size(1) - 1, 1);
  const torch::Tensor& weight = lm_head ? lm_head->weight : transformer->wte->weight;
  const auto logits = lm_head_logits(last, weight, fast_kernels(kernels_, last)).narrow(-1, 0, weight.size(0));
  return logits.select(1, 0).to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

LOOM_INLINE void GPT2LMHeadModelImpl::check_generation_positions(int64_t positions) const {
  check(positions <= config_.n_positions,
        "generate: the longest prompt plus max_new_tokens needs {} positions, past GPT-2's n_positions ({}): its "
        "learned position table has no row beyond; shorten the prompt or max_new_tokens",
        positions, config_.n_positions);
}

LOOM_INLINE HfNameRules GPT2LMHeadModelImpl::name_rules() const {
  HfNameRules rules;
  rules.base_prefix = "transformer";
  if (config_.tie_word_embeddings) rules.derived.emplace_back("lm_head.weight", "transformer.wte.weight");
  // The causal-mask buffers older transformers versions saved (HF ignores them on load).
  rules.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  return rules;
}

LOOM_INLINE GPT2LMHeadModel GPT2LMHeadModel::from_pretrained(const std::filesystem::path& dir,
                                                             torch::ScalarType dtype) {
  return load_pretrained<GPT2LMHeadModel>(dir, dtype);
}

// ---- the sequence classifier ------------------------------------------------------------------

LOOM_INLINE GPT2ForSequenceClassificationImpl::GPT2ForSequenceClassificationImpl(GPT2Config config)
    : PreTrainedModel(std::move(config), "GPT2Config") {
  transformer = register_module("transformer", GPT2Model(config_));
  score = register_module("score", peft::AdaptableLinear(config_.n_embd, config_.num_labels, /*bias=*/false));
  detail::init_gpt2_body(*transformer, config_);
  torch::NoGradGuard no_grad;
  score->weight.normal_(0.0, config_.initializer_range);
}

LOOM_INLINE int64_t GPT2ForSequenceClassificationImpl::parameter_count(const GPT2Config& c) {
  return models::parameter_count(c) - (c.tie_word_embeddings ? 0 : c.vocab_size * c.n_embd) + c.num_labels * c.n_embd;
}

LOOM_INLINE void GPT2ForSequenceClassificationImpl::set_kernels(Kernels kernels) {
  kernels_ = kernels;
  for (auto& block : transformer->blocks) block->inner()->mlp->kernels = kernels;
}

LOOM_INLINE torch::Tensor GPT2ForSequenceClassificationImpl::logits(const torch::Tensor& input_ids,
                                                                    const torch::Tensor& attention_mask) {
  const auto hidden = transformer->forward(input_ids, attention_mask);
  return score(states_at(hidden, last_token_positions(input_ids, config_.pad_token_id, architecture)));
}

LOOM_INLINE SequenceClassifierOutput GPT2ForSequenceClassificationImpl::forward(const data::SequenceBatch& batch) {
  SequenceClassifierOutput out;
  out.logits = logits(batch.input_ids, batch.attention_mask);
  if (batch.labels.defined())
    out.loss = sequence_classification_loss(config_.problem_type, config_.num_labels, out.logits, batch.labels,
                                            architecture);
  return out;
}

LOOM_INLINE HfNameRules GPT2ForSequenceClassificationImpl::name_rules() const {
  HfNameRules rules;
  rules.base_prefix = "transformer";
  rules.ignored_suffixes = {".attn.bias", ".attn.masked_bias", "lm_head.weight"};
  rules.may_be_new = {"score.weight"};
  return rules;
}

}  // namespace loom::models
