#pragma once
// Preference pairs (TRL's preference data, which reward modelling and DPO train on): the
// chosen and the rejected completion of each prompt, as prepare.py --preference writes them
// (PreferenceFiles in token_file.hpp), served as PreferenceBatch rows: each side right-padded
// to the batch's longest with the pad id, its attention mask, its labels (-100 on the prompt
// and the padding: the completion is what DPO scores), and the pair's margin when the data
// has margins.

#include <loom/config/inline.hpp>
#include <loom/data/sft.hpp>
#include <loom/data/token_file.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>

namespace loom::data {

/// Preference pairs, one a row: each side's token rows (right-padded with the pad id), their
/// attention masks and labels, and an optional margin. A batch of TRL's preference data.
struct PreferenceBatch {
  torch::Tensor chosen_input_ids;         ///< int64 [batch, seq]
  torch::Tensor chosen_attention_mask;    ///< int64 [batch, seq]: 1 on tokens, 0 on padding
  torch::Tensor chosen_labels;            ///< int64 [batch, seq]: the completion's ids, -100 elsewhere (or undefined)
  torch::Tensor rejected_input_ids;       ///< int64 [batch, seq']
  torch::Tensor rejected_attention_mask;  ///< int64 [batch, seq']
  torch::Tensor rejected_labels;          ///< int64 [batch, seq'] (or undefined)
  torch::Tensor margin;                   ///< float [batch], or undefined (TRL's optional margin column)
  /// float [batch]: the reference model's log-probability of each chosen completion, when
  /// computed once before training (DPOTrainer's precompute_ref_log_probs); else undefined.
  torch::Tensor ref_chosen_logps;
  torch::Tensor ref_rejected_logps;  ///< float [batch]: the same for the rejected completions
};

/// The pairs of a preference split as PreferenceBatch rows. SftOptions as for SftDataset:
/// dtype, vocab_size, pad_token_id, and max_length (each side keeps its first max_length ids);
/// packing is refused (a pair's two sides are compared row for row).
class PreferenceDataset {
 public:
  /// Maps and checks both sides' files (SftDataset's checks), and that they hold as many
  /// examples as each other and as there are margins; a loom::Error names the file.
  LOOM_INLINE PreferenceDataset(const PreferenceFiles& files, const SftOptions& options);
  /// Pairs.
  [[nodiscard]] int64_t size() const { return chosen_.size(); }
  /// The longer side's tokens of pair `i` (group_by_length sorts by it).
  [[nodiscard]] int64_t length(int64_t i) const { return std::max(chosen_.length(i), rejected_.length(i)); }
  /// The longest row a batch can have (either side), the memory plan's sequence length.
  [[nodiscard]] int64_t max_sequence_length() const {
    return std::max(chosen_.max_sequence_length(), rejected_.max_sequence_length());
  }
  /// True when the data has margins.
  [[nodiscard]] bool has_margin() const { return margin_ != nullptr; }
  /// Pairs `indices`.
  [[nodiscard]] LOOM_INLINE PreferenceBatch get_batch(std::span<const int64_t> indices) const;

 private:
  SftDataset chosen_, rejected_;
  std::shared_ptr<const MappedFile> margin_;
};

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/preference.ipp>
#endif
