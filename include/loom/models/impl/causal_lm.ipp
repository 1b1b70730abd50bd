#pragma once
// Definitions of models/causal_lm.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/data/text.hpp>
#include <loom/models/causal_lm.hpp>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <limits>

#include <utility>

namespace loom::models {

LOOM_INLINE torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels, bool fused_upcast) {
  // ForCausalLMLoss: pad the labels with -100 on the right and drop the first, so position t
  // is scored against token t + 1 and the last position against nothing.
  const int64_t vocab = logits.size(-1);
  auto shifted = torch::constant_pad_nd(labels, {0, 1}, static_cast<double>(data::ignore_index))
                     .narrow(-1, 1, labels.size(-1))
                     .contiguous();
  // torch's CUDA log-softmax reads half and writes float32 in one kernel (half only: for
  // bfloat16 it refuses, and the upcast below is a copy of a contiguous tensor).
  if (fused_upcast && logits.is_cuda() && logits.scalar_type() == torch::kHalf) {
    const auto log_probs = at::_log_softmax(logits.reshape({-1, vocab}), 1, /*half_to_float=*/true);
    return at::nll_loss_nd(log_probs, shifted.view({-1}).to(logits.device()), {}, at::Reduction::Mean,
                           data::ignore_index);
  }
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat).reshape({-1, vocab}), shifted.view({-1}).to(logits.device()),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(data::ignore_index));
}

LOOM_INLINE torch::Tensor lm_head_logits(const torch::Tensor& hidden, const torch::Tensor& weight, bool fast) {
  const int64_t vocab = weight.size(0), padded = (vocab + 63) / 64 * 64;
  if (padded == vocab || !fast) return torch::nn::functional::linear(hidden, weight);
  // Zero rows appended to the weight (cast first, as autocast would, so the copy is the
  // narrow one) and a bias of -inf on the extra columns, added by addmm in cuBLAS's epilogue
  // (linear on a 3-d input would add it in a separate pass over the logits).
  const auto device = hidden.device().type();
  auto w = at::autocast::is_autocast_enabled(device) ? weight.to(at::autocast::get_autocast_dtype(device)) : weight;
  w = torch::constant_pad_nd(w, {0, 0, 0, padded - vocab});
  auto bias = torch::zeros({padded}, w.options());
  bias.narrow(0, vocab, padded - vocab).fill_(-std::numeric_limits<double>::infinity());
  auto sizes = hidden.sizes().vec();
  sizes.back() = padded;
  return torch::addmm(bias, hidden.reshape({-1, hidden.size(-1)}), w.t()).view(sizes);
}

LOOM_INLINE CausalLMOutput causal_lm_output(const torch::Tensor& hidden, const torch::Tensor& weight,
                                            const torch::Tensor& labels, bool fast) {
  const auto all = lm_head_logits(hidden, weight, fast);
  CausalLMOutput out;
  out.logits = all.narrow(-1, 0, weight.size(0));
  if (labels.defined()) out.loss = causal_lm_loss(all, labels, fast);
  return out;
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> LayerCache::update(const torch::Tensor& k, const torch::Tensor& v) {
  // DynamicLayer starts from an empty tensor: the first step's keys come out as a copy
  // (contiguous), as transformers hands them to sdpa.
  keys = keys.defined() ? torch::cat({keys, k}, -2) : torch::cat({k}, -2);
  values = values.defined() ? torch::cat({values, v}, -2) : torch::cat({v}, -2);
  return {keys, values};
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
