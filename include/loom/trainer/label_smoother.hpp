#pragma once
// HF's LabelSmoother: the loss the default compute_loss returns when --label_smoothing_factor
// is set and the batch has a `labels` field. As HF's compute_loss, the labels are taken out
// of the batch before the forward (the model then returns logits without computing its own
// loss), and the smoothed loss is computed on those logits.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

namespace loom {

/// HF's LabelSmoother(epsilon)(logits, labels, shift_labels): (1 - epsilon) * NLL + epsilon *
/// the mean over classes of -log_softmax, both averaged over the labels that are not
/// `ignore_index`. `logits` is [..., classes]; `labels` the same shape without the last dim
/// (or with a trailing 1). `shift_labels` (a causal LM): logits [..., :-1, :] predict labels
/// [..., 1:]. The smoothed term is summed in float32, as HF's.
LOOM_INLINE torch::Tensor label_smoothed_loss(const torch::Tensor& logits, const torch::Tensor& labels, double epsilon,
                                              bool shift_labels = false, int64_t ignore_index = -100);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/label_smoother.ipp>
#endif
