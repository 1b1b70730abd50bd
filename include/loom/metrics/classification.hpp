#pragma once
// The metrics a compute_metrics writes by hand each time, with scikit-learn's and HF evaluate's
// definitions: accuracy (sklearn's accuracy_score; subset accuracy for multi-label),
// precision / recall / F1 (sklearn's precision_recall_fscore_support with its `average` names
// "binary", "micro", "macro", "weighted" and its zero_division), exact match (evaluate's
// exact_match on strings; whole sequences of tokens) and perplexity (run_clm's exp(eval_loss),
// or from logits). Regression's errors are in metrics/regression.hpp.
//
// The tensor functions take what EvalPrediction holds, on any device and of any shape:
// - `labels`: class ids (integer, or floating-point with integer values), one per example
//   ([N]) or per token ([N, T], -100 ignored: HF's padding of labels and of ragged predictions);
// - `predictions`: class ids of the labels' shape, or logits with one more, trailing, class
//   dimension (argmax over it, as a compute_metrics does);
// - multi-label (ClassificationOptions::multi_label): labels and predictions are [N, L]
//   indicators, 0 or 1 (multi_label_predictions turns logits into them: sigmoid > 0.5).
// Everything is counted in int64 / double on the CPU.
//
// zero_division (sklearn's): a precision with no predicted example of a class, a recall with
// no true one, an F1 with neither has a zero denominator. Unset (sklearn's default "warn"),
// such a score is 0 and a warning is logged (loom::log_message, level warning, once per call,
// sklearn's UndefinedMetricWarning text); 0 or 1 gives that value silently; NaN gives NaN,
// which the averages then leave out (sklearn's _nanaverage).

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom::metrics {

/// How precision, recall and F1 read their inputs and average (sklearn's parameters).
struct ClassificationOptions {
  /// sklearn's `average`: "binary" (the pos_label class only; two classes at most), "micro"
  /// (counts summed over the classes), "macro" (unweighted mean of the classes' scores),
  /// "weighted" (mean weighted by each class's count of true examples).
  std::string average = "binary";
  int64_t pos_label = 1;              ///< the positive class under "binary"
  /// sklearn's labels=range(num_labels): the classes averaged over, absent ones included
  /// (every label and prediction must then lie in [0, num_labels)). Unset: the classes seen
  /// in labels or predictions. Multi-label: the width L.
  std::optional<int64_t> num_labels;
  /// The score of a zero denominator: unset = sklearn's "warn" (0, and a warning); 0, 1 or NaN.
  std::optional<double> zero_division;
  bool multi_label = false;           ///< labels and predictions are [N, L] 0/1 indicators
};

/// Averaged precision, recall and F1 (sklearn's precision_recall_fscore_support with an average).
struct PrecisionRecallF1 {
  double precision = 0;
  double recall = 0;
  double f1 = 0;
};

/// The predicted class of each position: `predictions` itself when it has the labels' shape,
/// else the argmax over its trailing dimension (logits [..., C]); any other shape is a loom::Error.
[[nodiscard]] LOOM_INLINE torch::Tensor predicted_classes(const torch::Tensor& predictions,
                                                          const torch::Tensor& labels);

/// Multi-label predictions from logits: 1 where sigmoid(logit) > threshold, else 0 (int64),
/// as HF's multi-label recipes threshold them.
[[nodiscard]] LOOM_INLINE torch::Tensor multi_label_predictions(const torch::Tensor& logits, double threshold = 0.5);

/// sklearn's accuracy_score: the share of examples (or tokens; -100 ignored) whose predicted
/// class is the label; multi-label: the share of rows predicted exactly (subset accuracy).
/// NaN when nothing is counted.
[[nodiscard]] LOOM_INLINE double accuracy(const torch::Tensor& predictions, const torch::Tensor& labels,
                                          const ClassificationOptions& options = {});

/// sklearn's precision_recall_fscore_support(average=options.average) (beta 1).
[[nodiscard]] LOOM_INLINE PrecisionRecallF1 precision_recall_f1(const torch::Tensor& predictions,
                                                                const torch::Tensor& labels,
                                                                const ClassificationOptions& options = {});
/// sklearn's precision_score.
[[nodiscard]] inline double precision(const torch::Tensor& predictions, const torch::Tensor& labels,
                                      const ClassificationOptions& options = {}) {
  return precision_recall_f1(predictions, labels, options).precision;
}
/// sklearn's recall_score.
[[nodiscard]] inline double recall(const torch::Tensor& predictions, const torch::Tensor& labels,
                                   const ClassificationOptions& options = {}) {
  return precision_recall_f1(predictions, labels, options).recall;
}
/// sklearn's f1_score.
[[nodiscard]] inline double f1(const torch::Tensor& predictions, const torch::Tensor& labels,
                               const ClassificationOptions& options = {}) {
  return precision_recall_f1(predictions, labels, options).f1;
}

/// What HF evaluate's exact_match normalizes before comparing (its defaults: nothing).
struct ExactMatchOptions {
  bool ignore_case = false;         ///< compare lower-cased (ASCII letters)
  bool ignore_punctuation = false;  ///< drop Python's string.punctuation characters
  bool ignore_numbers = false;      ///< drop the digits 0-9
};

/// HF evaluate's exact_match: the share of predictions equal to their reference (after the
/// options' normalization). The two lists must be as long; empty: NaN.
[[nodiscard]] LOOM_INLINE double exact_match(std::span<const std::string> predictions,
                                             std::span<const std::string> references,
                                             const ExactMatchOptions& options = {});

/// Exact match of token sequences: the share of rows ([N, T] labels; predictions ids or
/// logits as above) whose every position not labelled -100 is predicted right. A row with
/// nothing counted is left out; NaN when no row counts.
[[nodiscard]] LOOM_INLINE double sequence_exact_match(const torch::Tensor& predictions, const torch::Tensor& labels);

/// HF run_clm's perplexity: exp(mean loss), infinity when that overflows.
[[nodiscard]] LOOM_INLINE double perplexity(double mean_loss);

/// Perplexity from logits [..., T, V] and labels [..., T] (-100 ignored): exp of the mean
/// cross-entropy over the counted tokens. `shift` (causal LM, as HF's ForCausalLMLoss): the
/// logits at t predict the label at t + 1.
[[nodiscard]] LOOM_INLINE double perplexity(const torch::Tensor& logits, const torch::Tensor& labels,
                                            bool shift = false);

}  // namespace loom::metrics

#if defined(LOOM_HEADER_ONLY)
#include <loom/metrics/impl/classification.ipp>
#endif
