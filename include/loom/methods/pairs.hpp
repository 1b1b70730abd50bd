#pragma once
// A batch of preference pairs as one forward's rows (TRL's DataCollatorForPreference): the
// chosen rows, then the rejected rows, right-padded to one width, the columns after the last
// token of every row dropped (TRL pads to the batch's longest row). Reward modelling and DPO
// run their model on these.

#include <loom/core/error.hpp>
#include <loom/data/preference.hpp>
#include <loom/data/text.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace loom::methods {

/// A batch of pairs as one forward's rows: rows [0, pairs) the chosen sides, [pairs, 2 pairs)
/// the rejected ones.
struct JoinedPairs {
  torch::Tensor input_ids;       ///< int64 [2 pairs, width], right-padded with the pad id
  torch::Tensor attention_mask;  ///< int64 [2 pairs, width]
  torch::Tensor labels;          ///< int64 [2 pairs, width]: the completions' ids, -100 elsewhere (when asked)
  int64_t pairs = 0;
};

namespace detail {
/// `a` [rows, n] and `b` [rows, m] one above the other, the shorter padded on the right with
/// `value` to the longer's width.
inline torch::Tensor stack_padded(const torch::Tensor& a, const torch::Tensor& b, int64_t value) {
  const int64_t width = std::max(a.size(1), b.size(1));
  const auto pad = [&](const torch::Tensor& t) {
    return t.size(1) == width ? t : torch::constant_pad_nd(t, {0, width - t.size(1)}, static_cast<double>(value));
  };
  return torch::cat({pad(a), pad(b)});
}
}  // namespace detail

/// `batch`'s pairs as one forward's rows, padded with `pad`; with `labels`, the completions'
/// labels too (a loom::Error naming `who` when the batch has none).
inline JoinedPairs join_pairs(const data::PreferenceBatch& batch, int64_t pad, bool labels, std::string_view who) {
  check(batch.chosen_input_ids.defined() && batch.rejected_input_ids.defined() &&
            batch.chosen_input_ids.dim() == 2 && batch.rejected_input_ids.dim() == 2 &&
            batch.chosen_input_ids.size(0) == batch.rejected_input_ids.size(0),
        "{}: a batch of pairs needs chosen_input_ids and rejected_input_ids of [pairs, length], as many of each", who);
  const auto mask_of = [](const torch::Tensor& m, const torch::Tensor& ids) {
    return m.defined() ? m : torch::ones_like(ids);
  };
  JoinedPairs j;
  j.pairs = batch.chosen_input_ids.size(0);
  j.input_ids = detail::stack_padded(batch.chosen_input_ids, batch.rejected_input_ids, pad);
  j.attention_mask = detail::stack_padded(mask_of(batch.chosen_attention_mask, batch.chosen_input_ids),
                                          mask_of(batch.rejected_attention_mask, batch.rejected_input_ids), 0);
  if (labels) {
    check(batch.chosen_labels.defined() && batch.rejected_labels.defined(),
          "{}: the pairs have no chosen_labels / rejected_labels (each completion's ids, -100 on the prompt and the "
          "padding), which say what is scored; data::PreferenceDataset gives them", who);
    j.labels = detail::stack_padded(batch.chosen_labels, batch.rejected_labels, data::ignore_index);
    check(j.labels.sizes() == j.input_ids.sizes(), "{}: labels of shape {} for input_ids of shape {}", who,
          c10::str(j.labels.sizes()), c10::str(j.input_ids.sizes()));
  }
  if (const auto used = j.attention_mask.ne(0).any(0).nonzero(); used.numel() > 0) {
    const int64_t width = used.max().template item<int64_t>() + 1;
    if (width < j.input_ids.size(1)) {
      j.input_ids = j.input_ids.narrow(1, 0, width);
      j.attention_mask = j.attention_mask.narrow(1, 0, width);
      if (j.labels.defined()) j.labels = j.labels.narrow(1, 0, width);
    }
  }
  return j;
}

}  // namespace loom::methods
