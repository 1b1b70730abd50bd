#pragma once
// What every sequence classifier here shares (BERT's and the Llama architecture's): the output
// of forward(batch), HF's label fields (num_labels, id2label, label2id, problem_type) completed
// and checked alike, and transformers' loss by problem_type (ForSequenceClassificationLoss):
// problem_type, or when unset regression (MSE) for num_labels == 1, single-label cross-entropy
// for integer labels, multi-label BCE-with-logits for float labels. Labels of the wrong dtype
// or shape for the problem type are a loom: error naming what it takes:
//   regression                  float [batch] or [batch, 1] (num_labels 1; both squeezed),
//                               float [batch, num_labels] otherwise
//   single_label_classification int64 / int32 class ids [batch] (-100 ignored)
//   multi_label_classification  float 0/1 targets [batch, num_labels]

#include <loom/config/inline.hpp>
#include <loom/models/hf_folder.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::models {

/// What a sequence classifier's forward(batch) returns.
struct SequenceClassifierOutput {
  torch::Tensor loss;    ///< HF's loss for problem_type (undefined when the batch has no labels)
  torch::Tensor logits;  ///< [batch, num_labels]
};

/// HF's label rule for a config with num_labels / id2label / label2id: id2label, when given,
/// sets num_labels; else it is LABEL_0 .. LABEL_{num_labels - 1}; label2id is its inverse.
template <class Config>
void complete_labels(Config& c) {
  if (!c.id2label.empty()) {
    c.num_labels = static_cast<int64_t>(c.id2label.size());
  } else {
    for (int64_t i = 0; i < std::min(c.num_labels, ConfigLimits::labels); ++i) c.id2label[i] = "LABEL_" + std::to_string(i);
  }
  if (c.label2id.empty())
    for (const auto& [id, label] : c.id2label) c.label2id[label] = id;
}

/// transformers' from_pretrained(..., num_labels=N) on a config just read: `num_labels`, when
/// given, replaces the config's, and its label names when their count differs.
template <class Config>
void override_num_labels(Config& c, std::optional<int64_t> num_labels) {
  if (!num_labels || *num_labels == c.num_labels) return;
  c.num_labels = *num_labels;
  if (static_cast<int64_t>(c.id2label.size()) != *num_labels) c.id2label.clear(), c.label2id.clear();
}

/// Checks num_labels and problem_type (one of HF's three; single-label needs two labels or
/// more); errors name `where`.
LOOM_INLINE void validate_labels(int64_t num_labels, const std::optional<std::string>& problem_type,
                                 std::string_view where);

/// The position a decoder classifier reads each row at (transformers' GPT2-, Llama-
/// ForSequenceClassification): the rightmost token that is not `pad_token_id` (argmax of
/// position x not-padding, so 0 for a row of padding alone), int64 [batch]; without
/// pad_token_id only a batch of one, read at its last token (`model_class` names the model in
/// that error).
LOOM_INLINE torch::Tensor last_token_positions(const torch::Tensor& input_ids, std::optional<int64_t> pad_token_id,
                                               std::string_view model_class);

/// Row b's hidden state at positions[b]: [batch, h] of hidden [batch, seq, h]. transformers
/// applies a decoder classifier's score at every position and then takes these; a row of a
/// product does not depend on the others, so loom's apply it to these rows only.
LOOM_INLINE torch::Tensor states_at(const torch::Tensor& hidden, const torch::Tensor& positions);

/// HF's loss of `logits` [batch, num_labels] for `labels` under `problem_type` (see the file
/// comment); `model_class` names the model in the error of labels that do not fit.
LOOM_INLINE torch::Tensor sequence_classification_loss(const std::optional<std::string>& problem_type,
                                                       int64_t num_labels, const torch::Tensor& logits,
                                                       const torch::Tensor& labels, std::string_view model_class);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/sequence_classification.ipp>
#endif
