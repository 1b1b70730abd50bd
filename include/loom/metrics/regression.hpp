#pragma once
// Regression metrics for a compute_metrics, with scikit-learn's and SciPy's definitions:
// mean squared error, its root, mean absolute error, R² (sklearn.metrics, multioutput
// "uniform_average": the mean of each output's score) and Pearson's r (scipy.stats.pearsonr,
// one output). `predictions` and `labels` are floating-point tensors of one shape, [N] (one
// output) or [N, K] (K outputs), on any device; [N, 1] predictions also fit [N] labels (a
// regression head's logits). Everything is computed in double on the CPU; NaN or infinite
// values are a loom::Error.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

namespace loom::metrics {

/// sklearn's mean_squared_error.
[[nodiscard]] LOOM_INLINE double mean_squared_error(const torch::Tensor& predictions, const torch::Tensor& labels);
/// sklearn's root_mean_squared_error: the mean over the outputs of each one's RMSE.
[[nodiscard]] LOOM_INLINE double root_mean_squared_error(const torch::Tensor& predictions, const torch::Tensor& labels);
/// sklearn's mean_absolute_error.
[[nodiscard]] LOOM_INLINE double mean_absolute_error(const torch::Tensor& predictions, const torch::Tensor& labels);
/// sklearn's r2_score: 1 - residual / total sum of squares, averaged over the outputs; an output
/// whose labels are constant scores 1 when predicted exactly, else 0 (sklearn's force_finite).
[[nodiscard]] LOOM_INLINE double r2_score(const torch::Tensor& predictions, const torch::Tensor& labels);
/// scipy.stats.pearsonr's statistic of one output ([N] or [N, 1]); NaN when either side is constant.
[[nodiscard]] LOOM_INLINE double pearson(const torch::Tensor& predictions, const torch::Tensor& labels);

}  // namespace loom::metrics

#if defined(LOOM_HEADER_ONLY)
#include <loom/metrics/impl/regression.ipp>
#endif
