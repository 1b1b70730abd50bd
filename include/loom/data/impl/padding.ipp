#pragma once
// Definitions of data/padding.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/data/padding.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace loom::data {

LOOM_INLINE int64_t DataCollatorWithPadding::padded_length(int64_t longest) const {
  int64_t length = padding == PaddingStrategy::max_length && max_length ? std::max(longest, *max_length) : longest;
  if (pad_to_multiple_of && *pad_to_multiple_of > 0 && length % *pad_to_multiple_of != 0)
    length = (length / *pad_to_multiple_of + 1) * *pad_to_multiple_of;
  return length;
}

LOOM_INLINE SequenceBatch DataCollatorWithPadding::operator()(std::span<const TokenSequence> examples) const {
  check(!examples.empty(), "DataCollatorWithPadding needs at least one example");
  check(!pad_to_multiple_of || *pad_to_multiple_of > 0, "DataCollatorWithPadding: pad_to_multiple_of must be "
        "positive, got {}", pad_to_multiple_of.value_or(0));
  const auto batch = static_cast<int64_t>(examples.size());
  int64_t longest = 0;
  std::size_t labelled = 0, per_token = 0;
  for (std::size_t b = 0; b < examples.size(); ++b) {
    const TokenSequence& e = examples[b];
    check(e.input_ids.defined() && e.input_ids.dim() == 1 && !e.input_ids.is_floating_point() &&
              !e.input_ids.is_complex(),
          "DataCollatorWithPadding: example {} of the batch: input_ids must be a 1-D integer tensor", b);
    const int64_t length = e.input_ids.size(0);
    longest = std::max(longest, length);
    if (!e.labels.defined()) continue;
    ++labelled;
    check(e.labels.dim() <= 1, "DataCollatorWithPadding: example {} of the batch: labels must be one value, one "
          "row of floats or one per token, got {} dimensions", b, e.labels.dim());
    // A floating-point row is one example's targets (multi-hot or regression), stacked, not padded.
    if (e.labels.dim() == 1 && !e.labels.is_floating_point()) {
      ++per_token;
      check(e.labels.size(0) == length, "DataCollatorWithPadding: example {} of the batch has {} tokens but {} "
            "per-token labels", b, length, e.labels.size(0));
    }
  }
  check(longest > 0, "DataCollatorWithPadding: every example of this batch of {} is empty; a batch needs a token "
        "(empty examples can only be padded beside others)", examples.size());
  check(labelled == 0 || labelled == examples.size(), "DataCollatorWithPadding: labels are set in {} of {} "
        "examples; set them in every example or in none", labelled, examples.size());
  check(per_token == 0 || per_token == examples.size(), "DataCollatorWithPadding: {} of {} examples have one label "
        "per token, the others one per sequence", per_token, examples.size());

  if (padding == PaddingStrategy::max_length) {
    check(max_length.has_value() && *max_length > 0, "DataCollatorWithPadding: padding to max_length needs a "
          "positive max_length");
    check(longest <= *max_length, "DataCollatorWithPadding: a sequence of {} tokens is longer than max_length {}; "
          "truncate the examples first (TokenSequenceOptions::max_length)", longest, *max_length);
  }
  const int64_t length = padded_length(longest);

  SequenceBatch out;
  out.input_ids = torch::full({batch, length}, pad_token_id, torch::kLong);
  out.attention_mask = torch::zeros({batch, length}, torch::kLong);
  if (per_token > 0) out.labels = torch::full({batch, length}, label_pad_token_id, torch::kLong);
  auto* ids = out.input_ids.data_ptr<int64_t>();
  auto* mask = out.attention_mask.data_ptr<int64_t>();
  auto* token_labels = per_token > 0 ? out.labels.data_ptr<int64_t>() : nullptr;
  std::vector<torch::Tensor> sequence_labels;
  for (int64_t b = 0; b < batch; ++b) {
    const TokenSequence& e = examples[static_cast<std::size_t>(b)];
    const int64_t n = e.input_ids.size(0);
    const int64_t start = b * length + (padding_side == PaddingSide::left ? length - n : 0);
    const auto src = e.input_ids.to(torch::kLong).contiguous();
    if (n > 0) std::memcpy(ids + start, src.data_ptr<int64_t>(), static_cast<std::size_t>(n) * sizeof(int64_t));
    std::fill_n(mask + start, n, int64_t{1});
    if (token_labels != nullptr) {
      const auto lab = e.labels.to(torch::kLong).contiguous();
      if (n > 0) std::memcpy(token_labels + start, lab.data_ptr<int64_t>(), static_cast<std::size_t>(n) * sizeof(int64_t));
    } else if (labelled > 0) {
      sequence_labels.push_back(e.labels);
    }
  }
  if (!sequence_labels.empty()) out.labels = torch::stack(sequence_labels);
  return out;
}

}  // namespace loom::data
