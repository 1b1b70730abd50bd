#pragma once
// What a step's forward hands back, as the Trainer's hooks and the evaluation accumulator
// trade in it: a model's (or compute_loss's) output, prediction_step's triple, and
// compute_metrics' input, with HF's names.

#include <torch/torch.h>

#include <concepts>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

/// What a model (or compute_loss) may return: a loss plus the logits used for metrics.
struct ModelOutput {
  torch::Tensor loss;    ///< scalar loss, mean over the batch's items
  torch::Tensor logits;  ///< predictions handed to compute_metrics
};

/// prediction_step's result, as HF's (loss, logits, labels) triple.
struct PredictionOutput {
  torch::Tensor loss;    ///< scalar mean loss of the batch (undefined: none)
  torch::Tensor logits;  ///< predictions (undefined: none)
  torch::Tensor labels;  ///< label ids (undefined: none); the first of all_labels when there are several
  std::vector<torch::Tensor> all_labels;  ///< with several label_names, one per name in order (else empty)
};

/// compute_metrics' input, as HF's EvalPrediction. Batches whose dim 1 differs (token-level
/// outputs of different lengths) are concatenated padded there with -100.
struct EvalPrediction {
  torch::Tensor predictions;  ///< every batch's logits, concatenated on dim 0 (CPU)
  torch::Tensor label_ids;    ///< every batch's labels, concatenated on dim 0 (CPU)
  std::vector<torch::Tensor> all_label_ids;  ///< one per label_names field, in order (HF's tuple of label_ids)
  torch::Tensor inputs;  ///< the batches' main input, when include_for_metrics names inputs (else undefined)
  torch::Tensor losses;  ///< each row's batch loss, when include_for_metrics names loss (else undefined)
};

/// What compute_loss may return: a tensor, or an aggregate with `loss` (and maybe `logits`).
template <class R>
concept LossResult = std::is_same_v<std::decay_t<R>, torch::Tensor> ||
                     requires(const R& r) { { r.loss } -> std::convertible_to<torch::Tensor>; };

/// The loss of a compute_loss result.
template <LossResult R>
torch::Tensor loss_of(R&& r) {
  if constexpr (std::is_same_v<std::decay_t<R>, torch::Tensor>) return std::forward<R>(r);
  else return r.loss;
}

/// The logits of a compute_loss result (undefined when it has none).
template <LossResult R>
torch::Tensor logits_of(const R& r) {
  if constexpr (requires { { r.logits } -> std::convertible_to<torch::Tensor>; }) return r.logits;
  else return {};
}

}  // namespace loom
