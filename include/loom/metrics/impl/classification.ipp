#pragma once
// Definitions of metrics/classification.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/metrics/classification.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::metrics {

namespace detail {

// HF's ignored label (data::ignore_index; metrics/ does not include data/, its sibling).
inline constexpr int64_t ignored_label = -100;

// `t` as int64 on the CPU; floating-point values must be whole numbers (class ids, 0/1 indicators).
inline torch::Tensor class_ids(const torch::Tensor& t, const char* what) {
  check(t.defined(), "metrics: {} are undefined", what);
  auto cpu = t.detach().to(torch::kCPU);
  if (cpu.is_floating_point()) {
    check(cpu.isfinite().all().item<bool>() && cpu.eq(cpu.round()).all().item<bool>(),
          "metrics: {} hold values that are not class ids (whole numbers); pass logits with a trailing class "
          "dimension, or multi_label_predictions(logits) for multi-label", what);
  }
  check(!cpu.is_complex(), "metrics: {} are complex", what);
  return cpu.to(torch::kLong);
}

// (predicted classes, labels), flattened, without the positions labelled -100.
inline std::pair<torch::Tensor, torch::Tensor> counted(const torch::Tensor& predictions, const torch::Tensor& labels) {
  const auto y_true = class_ids(labels, "labels").reshape({-1});
  const auto y_pred = class_ids(predicted_classes(predictions, labels), "predictions").reshape({-1});
  const auto keep = y_true.ne(detail::ignored_label);
  return {y_pred.masked_select(keep), y_true.masked_select(keep)};
}

// Multi-label (predictions, labels) as int64 [N, L] 0/1 indicators.
inline std::pair<torch::Tensor, torch::Tensor> indicators(const torch::Tensor& predictions, const torch::Tensor& labels,
                                                          const ClassificationOptions& options) {
  const auto y_true = class_ids(labels, "labels");
  const auto y_pred = class_ids(predictions, "predictions");
  check(y_true.dim() == 2 && y_pred.sizes() == y_true.sizes(), "metrics: multi-label predictions and labels are "
        "[examples, num_labels] indicators of one shape, got predictions {} and labels {} (threshold logits with "
        "multi_label_predictions)", c10::str(predictions.sizes()), c10::str(labels.sizes()));
  check(!options.num_labels || *options.num_labels == y_true.size(1), "metrics: num_labels is {} but the multi-label "
        "indicators have {} columns", options.num_labels.value_or(0), y_true.size(1));
  for (const auto& [t, what] : {std::pair{y_true, "labels"}, std::pair{y_pred, "predictions"}})
    check(t.eq(0).logical_or(t.eq(1)).all().item<bool>(), "metrics: multi-label {} must be 0 or 1", what);
  return {y_pred, y_true};
}

inline std::string listed(const std::vector<int64_t>& values) {
  std::string out;
  for (const auto v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

// Per-class counts: true positives, predicted, true.
struct Counts {
  std::vector<double> tp, predicted, truth;
};

// a / b, or the zero_division value; counts the zero denominators in `undefined`.
inline std::vector<double> divide(const std::vector<double>& a, const std::vector<double>& b, double zero_value,
                                  int64_t& undefined) {
  std::vector<double> out(a.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    if (b[k] == 0) {
      out[k] = zero_value;
      ++undefined;
    } else {
      out[k] = a[k] / b[k];
    }
  }
  return out;
}

// sklearn's _nanaverage: the (weighted) mean of the values that are not NaN; NaN when none is;
// weights that sum to 0 are dropped.
inline double nan_average(const std::vector<double>& values, const std::vector<double>* weights) {
  double sum = 0, weight = 0, plain = 0;
  int64_t n = 0;
  for (std::size_t k = 0; k < values.size(); ++k) {
    if (std::isnan(values[k])) continue;
    const double w = weights != nullptr ? (*weights)[k] : 1.0;
    sum += w * values[k];
    weight += w;
    plain += values[k];
    ++n;
  }
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  return weight != 0 ? sum / weight : plain / static_cast<double>(n);
}

inline Counts count_classes(const torch::Tensor& y_pred, const torch::Tensor& y_true,
                            const ClassificationOptions& options) {
  const auto* p = y_pred.data_ptr<int64_t>();
  const auto* t = y_true.data_ptr<int64_t>();
  const int64_t n = y_true.numel();
  std::set<int64_t> seen(t, t + n);
  seen.insert(p, p + n);
  std::vector<int64_t> classes;
  if (options.num_labels) {
    check(*options.num_labels > 0, "metrics: num_labels must be positive, got {}", *options.num_labels);
    check(seen.empty() || (*seen.begin() >= 0 && *seen.rbegin() < *options.num_labels), "metrics: classes {} lie "
          "outside [0, num_labels {})", listed({seen.begin(), seen.end()}), *options.num_labels);
  }
  if (options.average == "binary") {
    check(seen.size() <= 2, "metrics: average \"binary\" takes two classes, got {} ({}); choose \"micro\", "
          "\"macro\" or \"weighted\"", seen.size(), listed({seen.begin(), seen.end()}));
    check(seen.size() < 2 || seen.contains(options.pos_label), "metrics: pos_label {} is not one of the classes {}",
          options.pos_label, listed({seen.begin(), seen.end()}));
    classes = {options.pos_label};
  } else if (options.num_labels) {
    for (int64_t c = 0; c < *options.num_labels; ++c) classes.push_back(c);
  } else {
    classes.assign(seen.begin(), seen.end());
  }
  Counts c;
  for (const int64_t k : classes) {
    double tp = 0, predicted = 0, truth = 0;
    for (int64_t i = 0; i < n; ++i) {
      predicted += p[i] == k;
      truth += t[i] == k;
      tp += p[i] == k && t[i] == k;
    }
    c.tp.push_back(tp);
    c.predicted.push_back(predicted);
    c.truth.push_back(truth);
  }
  return c;
}

inline Counts count_columns(const torch::Tensor& y_pred, const torch::Tensor& y_true) {
  Counts c;
  const auto tp = y_pred.mul(y_true).sum(0).to(torch::kDouble).contiguous();
  const auto predicted = y_pred.sum(0).to(torch::kDouble).contiguous();
  const auto truth = y_true.sum(0).to(torch::kDouble).contiguous();
  const auto vec = [](const torch::Tensor& x) {
    return std::vector<double>(x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
  };
  c.tp = vec(tp);
  c.predicted = vec(predicted);
  c.truth = vec(truth);
  return c;
}

}  // namespace detail

LOOM_INLINE torch::Tensor predicted_classes(const torch::Tensor& predictions, const torch::Tensor& labels) {
  check(predictions.defined() && labels.defined(), "metrics: predictions and labels must be defined");
  if (predictions.sizes() == labels.sizes()) return predictions;
  check(predictions.dim() == labels.dim() + 1 && predictions.sizes().slice(0, labels.dim()) == labels.sizes() &&
            predictions.size(-1) > 0,
        "metrics: predictions of shape {} fit neither labels of shape {} (class ids) nor logits of shape {} + "
        "[num_classes]", c10::str(predictions.sizes()), c10::str(labels.sizes()), c10::str(labels.sizes()));
  return predictions.argmax(-1);
}

LOOM_INLINE torch::Tensor multi_label_predictions(const torch::Tensor& logits, double threshold) {
  check(logits.defined() && logits.is_floating_point(), "metrics: multi_label_predictions takes floating-point logits");
  return torch::sigmoid(logits.detach().to(torch::kCPU, torch::kDouble)).gt(threshold).to(torch::kLong);
}

LOOM_INLINE double accuracy(const torch::Tensor& predictions, const torch::Tensor& labels,
                            const ClassificationOptions& options) {
  if (options.multi_label) {
    const auto [y_pred, y_true] = detail::indicators(predictions, labels, options);
    if (y_true.size(0) == 0) return std::numeric_limits<double>::quiet_NaN();
    return y_pred.eq(y_true).all(1).to(torch::kDouble).mean().item<double>();
  }
  const auto [y_pred, y_true] = detail::counted(predictions, labels);
  if (y_true.numel() == 0) return std::numeric_limits<double>::quiet_NaN();
  return y_pred.eq(y_true).to(torch::kDouble).mean().item<double>();
}

LOOM_INLINE PrecisionRecallF1 precision_recall_f1(const torch::Tensor& predictions, const torch::Tensor& labels,
                                                  const ClassificationOptions& options) {
  const std::string& average = options.average;
  check(average == "binary" || average == "micro" || average == "macro" || average == "weighted",
        "metrics: average is \"binary\", \"micro\", \"macro\" or \"weighted\" (sklearn's), got \"{}\"", average);
  const auto zero = options.zero_division.value_or(0.0);
  check(zero == 0 || zero == 1 || std::isnan(zero), "metrics: zero_division is 0, 1 or NaN (unset: sklearn's "
        "\"warn\"), got {}", zero);
  detail::Counts c;
  if (options.multi_label) {
    check(average != "binary", "metrics: multi-label targets take average \"micro\", \"macro\" or \"weighted\", not "
          "\"binary\" (sklearn refuses it too)");
    const auto [y_pred, y_true] = detail::indicators(predictions, labels, options);
    c = detail::count_columns(y_pred, y_true);
  } else {
    const auto [y_pred, y_true] = detail::counted(predictions, labels);
    c = detail::count_classes(y_pred.contiguous(), y_true.contiguous(), options);
  }
  if (average == "micro") {
    const auto total = [](const std::vector<double>& v) { return std::vector<double>{std::accumulate(v.begin(), v.end(), 0.0)}; };
    c = {total(c.tp), total(c.predicted), total(c.truth)};
  }
  int64_t undefined_p = 0, undefined_r = 0, undefined_f = 0;
  const auto p = detail::divide(c.tp, c.predicted, zero, undefined_p);
  const auto r = detail::divide(c.tp, c.truth, zero, undefined_r);
  std::vector<double> two_tp(c.tp.size()), both(c.tp.size());
  for (std::size_t k = 0; k < c.tp.size(); ++k) {
    two_tp[k] = 2 * c.tp[k];
    both[k] = c.truth[k] + c.predicted[k];
  }
  const auto f = detail::divide(two_tp, both, zero, undefined_f);
  if (!options.zero_division) {
    const auto n = c.tp.size();
    if (undefined_p > 0)
      log_message(LogLevel::warning, "precision is ill-defined and set to 0.0 in {} of {} labels with no predicted "
                  "examples; set zero_division to control this (sklearn's UndefinedMetricWarning)", undefined_p, n);
    if (undefined_r > 0)
      log_message(LogLevel::warning, "recall is ill-defined and set to 0.0 in {} of {} labels with no true examples; "
                  "set zero_division to control this (sklearn's UndefinedMetricWarning)", undefined_r, n);
    if (undefined_f > 0)
      log_message(LogLevel::warning, "F-score is ill-defined and set to 0.0 in {} of {} labels with neither true nor "
                  "predicted examples; set zero_division to control this (sklearn's UndefinedMetricWarning)",
                  undefined_f, n);
  }
  const std::vector<double>* weights = average == "weighted" ? &c.truth : nullptr;
  return {detail::nan_average(p, weights), detail::nan_average(r, weights), detail::nan_average(f, weights)};
}

LOOM_INLINE double exact_match(std::span<const std::string> predictions, std::span<const std::string> references,
                               const ExactMatchOptions& options) {
  check(predictions.size() == references.size(), "metrics: exact_match got {} predictions and {} references",
        predictions.size(), references.size());
  if (predictions.empty()) return std::numeric_limits<double>::quiet_NaN();
  const auto normalized = [&](std::string_view s) {
    std::string out;
    for (const char ch : s) {
      const auto u = static_cast<unsigned char>(ch);
      if (options.ignore_punctuation && u < 128 && std::ispunct(u)) continue;  // string.punctuation: ASCII ispunct
      if (options.ignore_numbers && u >= '0' && u <= '9') continue;
      out.push_back(options.ignore_case && u < 128 ? static_cast<char>(std::tolower(u)) : ch);
    }
    return out;
  };
  std::size_t same = 0;
  for (std::size_t i = 0; i < predictions.size(); ++i) same += normalized(predictions[i]) == normalized(references[i]);
  return static_cast<double>(same) / static_cast<double>(predictions.size());
}

LOOM_INLINE double sequence_exact_match(const torch::Tensor& predictions, const torch::Tensor& labels) {
  check(labels.defined() && labels.dim() >= 2, "metrics: sequence_exact_match takes labels [examples, tokens], got {}",
        labels.defined() ? c10::str(labels.sizes()) : std::string("undefined"));
  const auto y_true = detail::class_ids(labels, "labels").reshape({labels.size(0), -1});
  const auto y_pred = detail::class_ids(predicted_classes(predictions, labels), "predictions")
                          .reshape({labels.size(0), -1});
  const auto counted = y_true.ne(detail::ignored_label);
  const auto rows = counted.any(1);
  const auto right = y_pred.eq(y_true).logical_or(counted.logical_not()).all(1);
  const auto n = rows.sum().item<int64_t>();
  if (n == 0) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(right.logical_and(rows).sum().item<int64_t>()) / static_cast<double>(n);
}

LOOM_INLINE double perplexity(double mean_loss) { return std::exp(mean_loss); }  // inf on overflow, as run_clm

LOOM_INLINE double perplexity(const torch::Tensor& logits, const torch::Tensor& labels, bool shift) {
  check(logits.defined() && labels.defined() && logits.dim() == labels.dim() + 1 && labels.dim() >= 1 &&
            logits.sizes().slice(0, labels.dim()) == labels.sizes(),
        "metrics: perplexity takes logits [..., tokens, vocab] and labels [..., tokens], got {} and {}",
        logits.defined() ? c10::str(logits.sizes()) : std::string("undefined"),
        labels.defined() ? c10::str(labels.sizes()) : std::string("undefined"));
  auto x = logits.detach().to(torch::kCPU, torch::kDouble);
  auto y = labels.detach().to(torch::kCPU, torch::kLong);
  if (shift) {
    const int64_t t = labels.size(-1);
    x = x.narrow(-2, 0, std::max<int64_t>(t - 1, 0));
    y = y.narrow(-1, std::min<int64_t>(1, t), std::max<int64_t>(t - 1, 0));
  }
  const auto loss = torch::nn::functional::cross_entropy(
      x.reshape({-1, logits.size(-1)}), y.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(detail::ignored_label));
  return std::exp(loss.item<double>());
}

}  // namespace loom::metrics
