#pragma once
// Definitions of metrics/regression.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/metrics/regression.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace loom::metrics {

namespace detail {
// (predictions, labels) as double [N, K] on the CPU, checked: one shape, finite.
inline std::pair<torch::Tensor, torch::Tensor> outputs(const torch::Tensor& predictions, const torch::Tensor& labels) {
  check(predictions.defined() && labels.defined(), "metrics: predictions and labels must be defined");
  auto p = predictions.detach().to(torch::kCPU, torch::kDouble);
  auto y = labels.detach().to(torch::kCPU, torch::kDouble);
  if (p.dim() == 2 && p.size(1) == 1 && y.dim() == 1) p = p.squeeze(1);
  check(p.sizes() == y.sizes() && (y.dim() == 1 || y.dim() == 2) && y.size(0) > 0, "metrics: regression takes "
        "predictions and labels of one shape, [N] or [N, outputs], N > 0; got {} and {}",
        c10::str(predictions.sizes()), c10::str(labels.sizes()));
  check(p.isfinite().all().item<bool>() && y.isfinite().all().item<bool>(), "metrics: regression predictions and "
        "labels must be finite (a NaN or infinity is there)");
  if (y.dim() == 1) return {p.unsqueeze(1), y.unsqueeze(1)};
  return {p, y};
}
}  // namespace detail

LOOM_INLINE double mean_squared_error(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto [p, y] = detail::outputs(predictions, labels);
  return (p - y).square().mean().item<double>();
}

LOOM_INLINE double root_mean_squared_error(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto [p, y] = detail::outputs(predictions, labels);
  return (p - y).square().mean(0).sqrt().mean().item<double>();
}

LOOM_INLINE double mean_absolute_error(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto [p, y] = detail::outputs(predictions, labels);
  return (p - y).abs().mean().item<double>();
}

LOOM_INLINE double r2_score(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto [p, y] = detail::outputs(predictions, labels);
  const auto residual = (y - p).square().sum(0);
  const auto total = (y - y.mean(0)).square().sum(0);
  // sklearn's force_finite: a constant output scores 1 if predicted exactly, else 0.
  const auto score = torch::where(total.ne(0), 1 - residual / total.clamp_min(1e-300),
                                  residual.eq(0).to(torch::kDouble));
  return score.mean().item<double>();
}

LOOM_INLINE double pearson(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto [p, y] = detail::outputs(predictions, labels);
  check(p.size(1) == 1, "metrics: pearson takes one output, got {}", p.size(1));
  const auto a = p.squeeze(1) - p.mean();
  const auto b = y.squeeze(1) - y.mean();
  const double denominator = std::sqrt(a.square().sum().item<double>() * b.square().sum().item<double>());
  if (denominator == 0) return std::numeric_limits<double>::quiet_NaN();
  return std::clamp(a.mul(b).sum().item<double>() / denominator, -1.0, 1.0);
}

}  // namespace loom::metrics
