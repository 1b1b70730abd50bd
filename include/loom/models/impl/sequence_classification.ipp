#pragma once
// Definitions of models/sequence_classification.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/models/sequence_classification.hpp>

#include <torch/torch.h>

#include <fmt/format.h>

#include <string>
#include <vector>

namespace loom::models {

LOOM_INLINE void validate_labels(int64_t num_labels, const std::optional<std::string>& problem_type,
                                 std::string_view where) {
  check_config_size(where, "num_labels", num_labels, ConfigLimits::labels);
  if (!problem_type) return;
  const auto& p = *problem_type;
  check(p == "regression" || p == "single_label_classification" || p == "multi_label_classification",
        "{}: field 'problem_type' is \"{}\"; HF's are regression, single_label_classification, "
        "multi_label_classification",
        where, p);
  check(!(p == "single_label_classification" && num_labels == 1),
        "{}: problem_type single_label_classification needs num_labels > 1 (for one output use regression)", where);
}

LOOM_INLINE torch::Tensor last_token_positions(const torch::Tensor& input_ids, std::optional<int64_t> pad_token_id,
                                               std::string_view model_class) {
  const int64_t batch = input_ids.size(0), seq = input_ids.size(1);
  if (!pad_token_id) {
    check(batch == 1, "{} without pad_token_id in its config classifies batches of one (it cannot tell padding "
                      "from tokens); got a batch of {}: set pad_token_id",
          model_class, batch);
    return torch::full({1}, seq - 1, input_ids.options().dtype(torch::kLong));
  }
  const auto not_pad = input_ids.ne(*pad_token_id).to(torch::kInt);
  return (torch::arange(seq, input_ids.options().dtype(torch::kInt)) * not_pad).argmax(-1);
}

LOOM_INLINE torch::Tensor states_at(const torch::Tensor& hidden, const torch::Tensor& positions) {
  const auto rows = torch::arange(hidden.size(0), positions.options().dtype(torch::kLong));
  return hidden.index({rows, positions.to(torch::kLong)});
}

LOOM_INLINE torch::Tensor sequence_classification_loss(const std::optional<std::string>& problem_type,
                                                       int64_t num_labels, const torch::Tensor& logits,
                                                       const torch::Tensor& labels, std::string_view model_class) {
  // ForSequenceClassificationLoss's rules. Labels that do not fit the problem type stop here
  // with one line, before libtorch's shape errors (or its broadcasting warning).
  const int64_t n = num_labels, batch = logits.size(0);
  const bool integer = labels.scalar_type() == torch::kLong || labels.scalar_type() == torch::kInt;  // HF's test
  std::string problem = problem_type.value_or("");
  std::string which = "problem_type " + problem;
  if (problem.empty()) {
    problem = n == 1 ? "regression" : integer ? "single_label_classification" : "multi_label_classification";
    which = fmt::format("problem_type unset (inferred: {}, from num_labels {} and {} labels)", problem, n,
                        c10::toString(labels.scalar_type()));
  }
  const auto refuse = [&](const std::string& want) {
    fail("{} with {} takes {}; got {} labels of shape {}", model_class, which, want, c10::toString(labels.scalar_type()),
         c10::str(labels.sizes()));
  };
  const auto shape = [](std::vector<int64_t> s) { return c10::str(torch::IntArrayRef(s)); };
  namespace F = torch::nn::functional;
  const auto target = labels.to(logits.device());
  if (problem == "regression") {
    if (n == 1) {  // MSE of the squeezed logits and labels
      if (!labels.is_floating_point() || labels.numel() != batch)
        refuse("floating-point labels, one per example (shape " + shape({batch}) + " or " + shape({batch, 1}) + ")");
      return F::mse_loss(logits.squeeze(), target.to(logits.scalar_type()).squeeze());
    }
    if (!labels.is_floating_point() || labels.sizes() != logits.sizes())
      refuse("floating-point labels, num_labels targets per example (shape " + shape({batch, n}) + ")");
    return F::mse_loss(logits, target.to(logits.scalar_type()));
  }
  if (problem == "single_label_classification") {
    if (!integer || labels.numel() != batch)
      refuse("integer class ids (int64 or int32), one per example (shape " + shape({batch}) + ")");
    return F::cross_entropy(logits.view({-1, n}), target.view({-1}).to(torch::kLong));
  }
  if (!labels.is_floating_point() || labels.sizes() != logits.sizes())
    refuse("floating-point 0/1 targets, one per label (shape " + shape({batch, n}) + ")");
  return F::binary_cross_entropy_with_logits(logits, target.to(logits.scalar_type()));
}

}  // namespace loom::models
