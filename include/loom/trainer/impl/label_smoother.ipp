#pragma once
#include <loom/core/error.hpp>
#include <loom/trainer/label_smoother.hpp>

namespace loom {

LOOM_INLINE torch::Tensor label_smoothed_loss(const torch::Tensor& logits_in, const torch::Tensor& labels_in,
                                              double epsilon, bool shift_labels, int64_t ignore_index) {
  check(logits_in.defined() && logits_in.dim() >= 1,
        "label smoothing needs the model's logits (a tensor with a class dimension last)");
  torch::Tensor logits = logits_in, labels = labels_in;
  if (shift_labels) {
    check(logits.dim() >= 2 && labels.dim() >= 1, "label smoothing with shifted labels needs [..., seq, classes] "
          "logits, got shape {}", c10::str(logits.sizes()));
    logits = logits.narrow(-2, 0, logits.size(-2) - 1).contiguous();
    labels = labels.narrow(-1, 1, labels.size(-1) - 1).contiguous();
  }
  torch::Tensor log_probs = -torch::log_softmax(logits, -1);
  if (labels.dim() == log_probs.dim() - 1) labels = labels.unsqueeze(-1);
  check(labels.dim() == log_probs.dim() && labels.sizes().slice(0, labels.dim() - 1) ==
                                               log_probs.sizes().slice(0, log_probs.dim() - 1),
        "label smoothing: labels of shape {} do not match logits of shape {}", c10::str(labels_in.sizes()),
        c10::str(logits_in.sizes()));
  const torch::Tensor padding = labels.eq(ignore_index);
  labels = labels.to(torch::kLong).clamp_min(0);
  torch::Tensor nll = log_probs.gather(-1, labels);
  torch::Tensor smoothed = log_probs.sum(-1, /*keepdim=*/true, torch::kFloat);
  nll.masked_fill_(padding, 0.0);
  smoothed.masked_fill_(padding, 0.0);
  const torch::Tensor active = padding.numel() - padding.to(torch::kLong).sum();
  nll = nll.sum() / active;
  smoothed = smoothed.sum() / (active * log_probs.size(-1));
  return (1.0 - epsilon) * nll + epsilon * smoothed;
}

}  // namespace loom
