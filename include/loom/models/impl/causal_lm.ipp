#pragma once
// Definitions of models/causal_lm.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/data/text.hpp>
#include <loom/models/causal_lm.hpp>

#include <loom/core/error.hpp>

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <limits>

#include <utility>

namespace loom::models {

namespace detail {

// ForCausalLMLoss's targets: the labels padded with -100 on the right and the first dropped,
// so position t is scored against token t + 1 and the last position against nothing.
inline torch::Tensor shifted_labels(const torch::Tensor& labels) {
  return torch::constant_pad_nd(labels, {0, 1}, static_cast<double>(data::ignore_index))
      .narrow(-1, 1, labels.size(-1))
      .contiguous();
}

// The float32 log-probabilities of logits [rows, vocab]. torch's CUDA log-softmax reads half
// and writes float32 in one kernel (half only: for bfloat16 it refuses, and the upcast is a
// copy of a contiguous tensor); otherwise the upcast, then the kernel cross_entropy runs.
inline torch::Tensor float_log_probs(const torch::Tensor& logits, bool fused_upcast) {
  if (fused_upcast && logits.is_cuda() && logits.scalar_type() == torch::kHalf)
    return at::_log_softmax(logits, 1, /*half_to_float=*/true);
  return torch::log_softmax(logits.to(torch::kFloat), 1);
}

// The LM head's product over the vocabulary padded to a multiple of 64 (lm_head_logits' fast
// form): `w` (the weight, already in the product's format) with zero rows appended, and a bias
// of -inf on the extra columns, which addmm adds in cuBLAS's epilogue. Undefined tensors when
// `vocab` rows need no padding.
struct PaddedHead {
  torch::Tensor weight, bias;
};

inline PaddedHead padded_head(const torch::Tensor& w) {
  const int64_t vocab = w.size(0), padded = (vocab + 63) / 64 * 64;
  if (padded == vocab) return {};
  PaddedHead head{torch::constant_pad_nd(w, {0, 0, 0, padded - vocab}), torch::zeros({padded}, w.options())};
  head.bias.narrow(0, vocab, padded - vocab).fill_(-std::numeric_limits<double>::infinity());
  return head;
}

// linear_cross_entropy's autograd function: the forward computes the loss chunk by chunk and,
// when `grads`, each chunk's gradients at once (softmax minus the target's one-hot, over the
// scored count); backward scales them by the loss's gradient.
struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden, torch::Tensor weight,
                               torch::Tensor targets, bool fast, int64_t chunk_rows, bool grads) {
    const int64_t n = hidden.size(0), width = hidden.size(1), vocab = weight.size(0);
    const auto device = hidden.device().type();
    // The products run in autocast's format when it is on (as lm_head_logits under it), the
    // rest in float32; autocast itself is held off inside, so nothing else is cast.
    const auto compute =
        at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto w = weight.to(compute);
    torch::Tensor bias;  // -inf on the padded columns (lm_head_logits' padding)
    if (fast) {
      if (auto head = padded_head(w); head.weight.defined()) w = head.weight, bias = head.bias;
    }
    const int64_t padded = w.size(0);
    const int64_t rows = chunk_rows > 0 ? chunk_rows : chunked_lm_loss_rows(n, width, padded);
    const bool grad_hidden = grads && hidden.requires_grad(), grad_weight = grads && weight.requires_grad();
    const auto float_options = hidden.options().dtype(torch::kFloat);
    const auto count = targets.ne(data::ignore_index).sum().to(torch::kFloat);  // on the device: no sync
    auto losses = torch::empty({n}, float_options);
    torch::Tensor d_hidden = grad_hidden ? torch::empty_like(hidden, torch::MemoryFormat::Contiguous) : torch::Tensor();
    torch::Tensor d_weight = grad_weight ? torch::zeros({padded, width}, float_options) : torch::Tensor();
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t c = std::min(rows, n - start);
      const auto h = hidden.narrow(0, start, c).to(compute);
      const auto logits = bias.defined() ? torch::addmm(bias, h, w.t()) : torch::mm(h, w.t());
      auto z = logits.to(torch::kFloat);  // the same tensor when computing in float32
      const auto t = targets.narrow(0, start, c);
      const auto scored = t.ne(data::ignore_index).unsqueeze(1);
      const auto target = t.clamp_min(0).unsqueeze(1);  // an unscored row reads column 0, then counts 0
      const auto lse = torch::logsumexp(z, 1, /*keepdim=*/true);
      losses.narrow(0, start, c).copy_((lse - z.gather(1, target)).masked_fill(scored.logical_not(), 0).squeeze(1));
      if (!grad_hidden && !grad_weight) continue;
      // d(sum of losses)/d logits: softmax minus the one-hot of the target, 0 on unscored rows.
      // The 1/count is applied after the products, in float32, so that a 16-bit format sees
      // values of order one (an unscaled float16 gradient would underflow).
      auto g = z.sub_(lse).exp_();
      g.scatter_add_(1, target, torch::full({c, 1}, -1.0, g.options()));
      g.mul_(scored);
      const auto gc = g.to(compute);
      if (grad_hidden) d_hidden.narrow(0, start, c).copy_(torch::mm(gc, w).to(torch::kFloat).div_(count));
      if (grad_weight) {
        if (compute == torch::kFloat) d_weight.addmm_(gc.t(), h);  // no [vocab, hidden] temporary
        else d_weight.add_(torch::mm(gc.t(), h));
      }
    }
    if (grad_hidden) ctx->saved_data["d_hidden"] = d_hidden;
    if (grad_weight)
      ctx->saved_data["d_weight"] = d_weight.narrow(0, 0, vocab).div_(count).to(weight.scalar_type());
    return losses.sum() / count;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto& go = grad_outputs[0];
    torch::Tensor d_hidden, d_weight;
    if (ctx->saved_data.count("d_hidden") != 0) {
      const auto d = ctx->saved_data["d_hidden"].toTensor();
      d_hidden = d * go.to(d.scalar_type());
    }
    if (ctx->saved_data.count("d_weight") != 0) {
      const auto d = ctx->saved_data["d_weight"].toTensor();
      d_weight = d * go.to(d.scalar_type());
    }
    return {d_hidden, d_weight, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace detail

namespace detail {
// nll_loss's reduction for a causal LM's loss: the mean over the counted tokens, or their sum
// when it is divided by num_items_in_batch after (transformers' fixed_cross_entropy).
inline at::Reduction::Reduction loss_reduction(const torch::Tensor& num_items_in_batch) {
  return num_items_in_batch.defined() ? at::Reduction::Sum : at::Reduction::Mean;
}
// The reduced loss divided by num_items_in_batch when there is one (float32 by float32, as
// transformers divides).
inline torch::Tensor divided_by_items(const torch::Tensor& loss, const torch::Tensor& num_items_in_batch) {
  if (!num_items_in_batch.defined()) return loss;
  return loss / num_items_in_batch.to(loss.device(), torch::kFloat);
}
}  // namespace detail

LOOM_INLINE torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels, bool fused_upcast,
                                         const torch::Tensor& num_items_in_batch) {
  const int64_t vocab = logits.size(-1);
  const auto shifted = detail::shifted_labels(labels);
  return detail::divided_by_items(
      at::nll_loss_nd(detail::float_log_probs(logits.reshape({-1, vocab}), fused_upcast),
                      shifted.view({-1}).to(logits.device()), {}, detail::loss_reduction(num_items_in_batch),
                      data::ignore_index),
      num_items_in_batch);
}

LOOM_INLINE torch::Tensor linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                               const torch::Tensor& targets, bool fast, int64_t chunk_rows) {
  check(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1),
        "linear_cross_entropy: hidden [rows, h] and weight [vocab, h], got {} and {}", c10::str(hidden.sizes()),
        c10::str(weight.sizes()));
  check(targets.dim() == 1 && targets.size(0) == hidden.size(0),
        "linear_cross_entropy: targets [rows] for hidden {}, got {}", c10::str(hidden.sizes()),
        c10::str(targets.sizes()));
  const bool grads = torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  return detail::LinearCrossEntropyFunction::apply(hidden, weight, targets.to(hidden.device(), torch::kLong), fast,
                                                   chunk_rows, grads);
}

namespace detail {

// The positions a causal LM's loss scores: the shifted labels [positions], whether each is
// scored, and their indices (the one host sync).
struct ScoredPositions {
  torch::Tensor shifted, scored, index;
};

inline ScoredPositions scored_positions(const torch::Tensor& labels, const torch::Device& device) {
  ScoredPositions s;
  s.shifted = shifted_labels(labels).view({-1}).to(device);
  s.scored = s.shifted.ne(data::ignore_index);
  s.index = s.scored.nonzero().squeeze(1);
  return s;
}

// The hidden states of the scored positions, [scored, h].
inline torch::Tensor scored_rows(const torch::Tensor& hidden, const ScoredPositions& s) {
  return hidden.reshape({-1, hidden.size(-1)}).index_select(0, s.index);
}

// One value a scored row [scored] placed at its position among all of them (0 elsewhere),
// [positions] (differentiable).
inline torch::Tensor placed(const torch::Tensor& rows, const ScoredPositions& s) {
  return torch::zeros({s.shifted.size(0)}, rows.options()).index_copy(0, s.index, rows);
}

// The fewest rows the reference path's head product runs over. On the CPU a product of 1 to 3
// rows (MKL's sgemm) sums in another order than a taller one, in the logits and in the
// backward's hidden gradient, so a micro-batch scoring one token (padded instruction rows)
// drifted from transformers' product over every position by an ulp; from 4 rows up the rows
// came out the same at every shape measured (test_lm_loss checks 1 to 4 scored tokens).
inline constexpr int64_t kMinHeadRows = 4;

// The LM head's logits at the scored positions, [scored, vocab (padded on the fast path)]: the
// product of the scored rows alone, so that the head's time and memory scale with the scored
// tokens. On the reference path a micro-batch of fewer than kMinHeadRows scored rows adds
// unscored rows up to that count (their logits dropped after; their gradients are zero).
inline torch::Tensor scored_head_logits(const torch::Tensor& hidden, const torch::Tensor& weight,
                                        const ScoredPositions& s, bool fast, std::optional<double> softcap) {
  const int64_t scored = s.index.size(0);
  const auto flat = hidden.reshape({-1, hidden.size(-1)});
  if (fast || scored >= kMinHeadRows || scored == flat.size(0)) return lm_head_logits(scored_rows(hidden, s), weight, fast, softcap);
  auto unscored = torch::ones({flat.size(0)}, torch::TensorOptions().dtype(torch::kBool).device(flat.device()));
  unscored.index_fill_(0, s.index, false);
  const auto extra = unscored.nonzero().squeeze(1).slice(0, 0, kMinHeadRows - scored);
  const auto rows = flat.index_select(0, torch::cat({s.index, extra}));
  return lm_head_logits(rows, weight, fast, softcap).slice(0, 0, scored);
}

// The log-probability of each scored position's target, placed at its position among all of
// them (0 elsewhere), float32 [positions]: the log-softmax at the scored rows only (a row of a
// log-softmax does not depend on the others), of scored_head_logits.
inline torch::Tensor placed_log_probs(const torch::Tensor& hidden, const torch::Tensor& weight,
                                      const ScoredPositions& s, bool fast, std::optional<double> softcap) {
  const auto targets = s.shifted.index_select(0, s.index);
  const auto picked = float_log_probs(scored_head_logits(hidden, weight, s, fast, softcap), fast)
                          .gather(1, targets.unsqueeze(1));
  return placed(picked.squeeze(1), s);
}

// Whether a loss over `scored` rows of a head of `vocab` goes chunked: `chunked`, else the
// default by size; never with a soft-capped head (the chunked kernels have no cap), where
// chunked true is refused.
inline bool use_chunked_head(std::optional<bool> chunked, int64_t scored, int64_t vocab,
                             std::optional<double> softcap) {
  if (!softcap) return chunked.value_or(chunked_lm_loss_by_default(scored, vocab));
  check(!chunked.value_or(false),
        "the chunked LM loss (--chunked_lm_loss true) has no final logit soft-capping; a model with "
        "final_logit_softcapping ({}) computes its loss from the whole logits (--chunked_lm_loss false or unset)",
        *softcap);
  return false;
}

}  // namespace detail

LOOM_INLINE torch::Tensor scored_causal_lm_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                                const torch::Tensor& labels, bool fast, std::optional<bool> chunked,
                                                std::optional<double> softcap,
                                                const torch::Tensor& num_items_in_batch) {
  const auto s = detail::scored_positions(labels, hidden.device());
  const int64_t scored = s.index.size(0);
  // (No scored token: the unchunked form, whose sum is 0.)
  if (scored > 0 && detail::use_chunked_head(chunked, scored, weight.size(0), softcap)) {
    auto mean = linear_cross_entropy(detail::scored_rows(hidden, s), weight, s.shifted.index_select(0, s.index), fast);
    // The mean over this batch's tokens rescaled to the sum over num_items_in_batch.
    return num_items_in_batch.defined()
               ? detail::divided_by_items(mean * static_cast<double>(scored), num_items_in_batch)
               : mean;
  }
  // Each scored row's log-probability at its position, reduced by nll_loss as causal_lm_loss
  // reduces the whole [positions, vocab]: the same rows, summed in the same order (nll_loss's
  // cascade runs over every position, the unscored skipped).
  return detail::divided_by_items(
      at::nll_loss_nd(detail::placed_log_probs(hidden, weight, s, fast, softcap).unsqueeze(1),
                      s.shifted.masked_fill(s.scored, 0), {}, detail::loss_reduction(num_items_in_batch),
                      data::ignore_index),
      num_items_in_batch);
}

namespace detail {

// token_scores' chunked form: the log-probability of each row's target (every row scored), and
// with `statistics` the entropy, mean logit and top-1 of each row, the head applied chunk by
// chunk; backward recomputes each chunk's logits (softmax minus the target's one-hot, by the
// incoming gradient). Outputs: log_probs, then (with statistics) entropy, mean_logits and
// is_top1 as floats (the last three without gradient).
struct TokenLogProbFunction : torch::autograd::Function<TokenLogProbFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, torch::Tensor hidden,
                                                torch::Tensor weight, torch::Tensor targets, bool fast,
                                                bool statistics) {
    const int64_t n = hidden.size(0), width = hidden.size(1), vocab = weight.size(0);
    const auto device = hidden.device().type();
    const auto compute =
        at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto w = weight.to(compute);
    torch::Tensor bias;
    if (fast) {
      if (auto head = padded_head(w); head.weight.defined()) w = head.weight, bias = head.bias;
    }
    const int64_t rows = chunked_lm_loss_rows(n, width, w.size(0));
    const auto float_options = hidden.options().dtype(torch::kFloat);
    auto log_probs = torch::empty({n}, float_options), log_z = torch::empty({n}, float_options);
    torch::Tensor entropy, mean_logits, is_top1;
    if (statistics) {
      entropy = torch::empty({n}, float_options), mean_logits = torch::empty({n}, float_options);
      is_top1 = torch::empty({n}, float_options);
    }
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t c = std::min(rows, n - start);
      const auto h = hidden.narrow(0, start, c).to(compute);
      const auto logits = bias.defined() ? torch::addmm(bias, h, w.t()) : torch::mm(h, w.t());
      const auto z = logits.narrow(1, 0, vocab).to(torch::kFloat);
      const auto t = targets.narrow(0, start, c).unsqueeze(1);
      const auto lse = torch::logsumexp(z, 1, /*keepdim=*/true);
      log_z.narrow(0, start, c).copy_(lse.squeeze(1));
      log_probs.narrow(0, start, c).copy_((z.gather(1, t) - lse).squeeze(1));
      if (!statistics) continue;
      entropy.narrow(0, start, c).copy_(lse.squeeze(1) - (z - lse).exp().mul_(z).sum(1));
      mean_logits.narrow(0, start, c).copy_(z.mean(1));
      is_top1.narrow(0, start, c).copy_(z.argmax(1).eq(t.squeeze(1)));
    }
    ctx->save_for_backward({hidden, weight, targets, log_z});
    ctx->saved_data["fast"] = fast;
    ctx->saved_data["compute"] = static_cast<int64_t>(compute);
    if (!statistics) return {log_probs};
    ctx->mark_non_differentiable({entropy, mean_logits, is_top1});
    return {log_probs, entropy, mean_logits, is_top1};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto &hidden = saved[0], &weight = saved[1], &targets = saved[2], &log_z = saved[3];
    const auto compute = static_cast<torch::ScalarType>(ctx->saved_data["compute"].toInt());
    torch::Tensor d_hidden, d_weight;
    const auto& g = grad_outputs[0];
    if (!g.defined()) return {d_hidden, d_weight, {}, {}, {}};
    const int64_t n = hidden.size(0), width = hidden.size(1), vocab = weight.size(0);
    const bool grad_hidden = ctx->needs_input_grad(0), grad_weight = ctx->needs_input_grad(1);
    const auto w = weight.to(compute);
    const auto float_options = hidden.options().dtype(torch::kFloat);
    if (grad_hidden) d_hidden = torch::empty({n, width}, float_options);
    if (grad_weight) d_weight = torch::zeros({vocab, width}, float_options);
    const int64_t rows = chunked_lm_loss_rows(n, width, vocab);
    for (int64_t start = 0; start < n; start += rows) {
      const int64_t c = std::min(rows, n - start);
      const auto h = hidden.narrow(0, start, c).to(compute);
      const auto z = torch::mm(h, w.t()).to(torch::kFloat);
      const auto gc = g.narrow(0, start, c).to(torch::kFloat).unsqueeze(1);
      // d log p(target) / dz = one-hot(target) - softmax(z), by the incoming gradient.
      auto dz = z.sub_(log_z.narrow(0, start, c).unsqueeze(1)).exp_().mul_(gc).neg_();
      dz.scatter_add_(1, targets.narrow(0, start, c).unsqueeze(1), gc);
      const auto dzc = dz.to(compute);
      if (grad_hidden) d_hidden.narrow(0, start, c).copy_(torch::mm(dzc, w));
      if (grad_weight) d_weight.add_(torch::mm(dzc.t(), h).to(torch::kFloat));
    }
    if (grad_hidden) d_hidden = d_hidden.to(hidden.scalar_type());
    if (grad_weight) d_weight = d_weight.to(weight.scalar_type());
    return {d_hidden, d_weight, {}, {}, {}};
  }
};

}  // namespace detail

LOOM_INLINE TokenScores token_scores(const torch::Tensor& hidden, const torch::Tensor& weight,
                                     const torch::Tensor& labels, bool fast, bool statistics,
                                     std::optional<bool> chunked, std::optional<double> softcap) {
  check(labels.defined() && labels.sizes() == hidden.sizes().slice(0, hidden.dim() - 1),
        "token_scores: labels of shape {} for hidden states of shape {}",
        labels.defined() ? c10::str(labels.sizes()) : std::string("undefined"), c10::str(hidden.sizes()));
  const auto s = detail::scored_positions(labels, hidden.device());
  const int64_t vocab = weight.size(0);
  const auto targets = s.shifted.index_select(0, s.index);
  const auto place = [&](const torch::Tensor& rows) { return detail::placed(rows, s).view(labels.sizes()); };
  TokenScores out;
  if (detail::use_chunked_head(chunked, s.index.size(0), vocab, softcap)) {
    auto parts =
        detail::TokenLogProbFunction::apply(detail::scored_rows(hidden, s), weight, targets, fast, statistics);
    out.log_probs = place(parts[0]);
    if (statistics) {
      out.entropy = place(parts[1]), out.mean_logits = place(parts[2]);
      out.is_top1 = place(parts[3]).to(torch::kBool);
    }
    return out;
  }
  const auto logits = detail::scored_head_logits(hidden, weight, s, fast, softcap);
  const auto log_probs = detail::float_log_probs(logits, fast);
  out.log_probs = place(log_probs.gather(1, targets.unsqueeze(1)).squeeze(1));
  if (statistics) {
    torch::NoGradGuard no_grad;
    const auto shown = log_probs.narrow(1, 0, vocab);  // without lm_head_logits' padded columns
    const auto z = logits.narrow(1, 0, vocab).to(torch::kFloat);
    out.entropy = place(-(shown.exp() * shown).sum(1));
    out.mean_logits = place(z.mean(1));
    out.is_top1 = place(z.argmax(1).eq(targets).to(torch::kFloat)).to(torch::kBool);
  }
  return out;
}

LOOM_INLINE torch::Tensor lm_head_logits(const torch::Tensor& hidden, const torch::Tensor& weight, bool fast,
                                         std::optional<double> softcap) {
  const int64_t vocab = weight.size(0);
  if (softcap) {  // Gemma2ForCausalLM: logits / cap, tanh, times cap, op by op
    const auto logits = torch::nn::functional::linear(hidden, weight) / *softcap;
    return torch::tanh(logits) * *softcap;
  }
  if ((vocab % 64) == 0 || !fast) return torch::nn::functional::linear(hidden, weight);
  // The weight cast first, as autocast would, so the padded copy is the narrow one; addmm adds
  // the bias in cuBLAS's epilogue (linear on a 3-d input would add it in a separate pass).
  const auto device = hidden.device().type();
  const auto head = detail::padded_head(
      at::autocast::is_autocast_enabled(device) ? weight.to(at::autocast::get_autocast_dtype(device)) : weight);
  auto sizes = hidden.sizes().vec();
  sizes.back() = head.weight.size(0);
  return torch::addmm(head.bias, hidden.reshape({-1, hidden.size(-1)}), head.weight.t()).view(sizes);
}

LOOM_INLINE CausalLMOutput causal_lm_output(const torch::Tensor& hidden, const torch::Tensor& weight,
                                            const torch::Tensor& labels, bool fast, std::optional<double> softcap) {
  const auto& request = forward_request();
  if (labels.defined() && !request.logits)
    return {scored_causal_lm_loss(hidden, weight, labels, fast, request.chunked_lm_loss, softcap,
                                  request.num_items_in_batch),
            torch::Tensor()};
  const auto all = lm_head_logits(hidden, weight, fast, softcap);
  CausalLMOutput out;
  out.logits = all.narrow(-1, 0, weight.size(0));
  if (labels.defined()) out.loss = causal_lm_loss(all, labels, fast, request.num_items_in_batch);
  return out;
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> LayerCache::update(const torch::Tensor& k, const torch::Tensor& v) {
  // DynamicLayer starts from an empty tensor: the first step's keys come out as a copy
  // (contiguous), as transformers hands them to sdpa.
  keys = keys.defined() ? torch::cat({keys, k}, -2) : torch::cat({k}, -2);
  values = values.defined() ? torch::cat({values, v}, -2) : torch::cat({v}, -2);
  return {keys, values};
}

LOOM_INLINE torch::Tensor padding_attention_mask(const torch::Tensor& attention_mask, const torch::Tensor& input_ids) {
  if (!attention_mask.defined()) return {};
  check(attention_mask.sizes() == input_ids.sizes(), "attention_mask of shape {} does not match input_ids of shape {}",
        c10::str(attention_mask.sizes()), c10::str(input_ids.sizes()));
  // As transformers' sdpa path: no mask when nothing is padded (one value read back).
  const auto keep = attention_mask.to(input_ids.device());
  if (keep.to(torch::kBool).all().item<bool>()) return {};
  return step_attention_mask(keep, input_ids.size(1), input_ids.size(1), input_ids.device());
}

LOOM_INLINE torch::Tensor step_attention_mask(const torch::Tensor& attention_mask, int64_t query, int64_t keys,
                                              const torch::Device& device) {
  // The caller passes no mask when the batch has no padding (generate checks it once).
  if (!attention_mask.defined() && (query == 1 || query == keys)) return {};
  const auto options = torch::TensorOptions().device(device);
  const auto q = torch::arange(query, options.dtype(torch::kLong)) + (keys - query);
  const auto k = torch::arange(keys, options.dtype(torch::kLong));
  auto mask = k.unsqueeze(0).le(q.unsqueeze(1)).view({1, 1, query, keys});
  if (attention_mask.defined()) {
    const auto pad = attention_mask.narrow(1, attention_mask.size(1) - keys, keys).to(device, torch::kBool);
    mask = mask.logical_and(pad.view({pad.size(0), 1, 1, keys}));
  }
  return mask.expand({attention_mask.defined() ? attention_mask.size(0) : 1, 1, query, keys});
}

}  // namespace loom::models
