#pragma once
// Instruction data (supervised fine-tuning, as TRL's SFTTrainer trains on prompt-completion
// pairs): examples of prompt + completion tokens with a loss mask (SftFiles in
// token_file.hpp; examples/text_data/prepare.py writes them), served as CausalLMBatch with the
// prompt labelled -100, so the loss counts completion tokens only (completion-only loss).
//
// Two ways to batch them:
// - padded (the default): one example per row, right-padded to the batch's longest with the
//   pad id (labels -100 there) and, when a row is padded, an attention_mask (1 on the
//   example's tokens, 0 on the padding: TRL's collator's). The token loss needs no mask for
//   right padding; a sparse MoE model's load-balancing loss reads it to leave the padding out,
//   as transformers' does with the collator's mask.
// - packed (`packing = block_size`): examples laid one after another into windows of
//   block_size tokens, first fit in file order without splitting an example (the rest of a
//   window is padding); position_ids restart at 0 at each example, so a model that takes them
//   (the Llama architecture) attends within each example only, and the label of each
//   example's first token is -100 (no token of the same example predicts it). Packed and
//   padded batches give the same loss per completion token. No attention_mask, as TRL's
//   padding-free batches carry none: a window's padding tail counts in a sparse MoE model's
//   load-balancing loss (TRL's padding-free rows have no padding to count).
//
// An example longer than the longest allowed (max_length, or block_size when packing) keeps
// its first tokens; truncated() counts them.

#include <loom/config/inline.hpp>
#include <loom/data/text.hpp>
#include <loom/data/token_file.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace loom::data {

/// How SftDataset reads and batches instruction files.
struct SftOptions {
  TokenDtype dtype = TokenDtype::uint16;  ///< the ids' element type (meta.json's "dtype")
  std::optional<int64_t> vocab_size;      ///< when given, every id must be below it (checked once at open)
  int64_t pad_token_id = 0;               ///< what fills padding (its label is -100)
  std::optional<int64_t> max_length;      ///< padded rows: an example keeps its first max_length ids
  std::optional<int64_t> packing;         ///< pack examples into windows of this many tokens
};

/// Instruction examples with loss masks as CausalLMBatch: padded rows, or packed windows
/// with position_ids (see the header comment).
class SftDataset {
 public:
  /// Maps the files and checks them (offsets as a ragged file's; one mask byte per id, each 0
  /// or 1; ids below vocab_size): a loom::Error names the file.
  LOOM_INLINE SftDataset(const SftFiles& files, const SftOptions& options);
  /// Rows: examples, or packed windows.
  [[nodiscard]] int64_t size() const { return packed() ? static_cast<int64_t>(windows_.size()) : examples_; }
  /// Examples in the files.
  [[nodiscard]] int64_t examples() const { return examples_; }
  /// Examples cut to max_length (or block_size when packing).
  [[nodiscard]] int64_t truncated() const { return truncated_; }
  /// Completion tokens the loss counts over the whole split (after truncation, without each
  /// example's first token).
  [[nodiscard]] int64_t completion_tokens() const { return completion_tokens_; }
  /// True when examples are packed into windows.
  [[nodiscard]] bool packed() const { return block_size_ > 0; }
  /// Tokens of row `i` (an example's, after truncation; a window's block_size).
  [[nodiscard]] LOOM_INLINE int64_t length(int64_t i) const;
  /// The longest row a batch can have: block_size when packing, else the longest example after
  /// truncation (the memory plan's sequence length); 0 without rows.
  [[nodiscard]] LOOM_INLINE int64_t max_sequence_length() const;
  /// Rows `indices`: input_ids, labels (-100 on prompt and padding) and, packed, position_ids;
  /// padded rows, an attention_mask when one is shorter than the batch (undefined otherwise).
  [[nodiscard]] LOOM_INLINE CausalLMBatch get_batch(std::span<const int64_t> indices) const;

 private:
  // Example `i`'s ids [begin, end) in the files, truncated.
  [[nodiscard]] LOOM_INLINE std::pair<int64_t, int64_t> span_of(int64_t i) const;
  // Writes example `i` at `row` + `at`: ids, labels (mask 1 -> id, else -100; the first -100),
  // positions 0.. when `positions` is not null. Returns its length.
  LOOM_INLINE int64_t write(int64_t i, int64_t* ids, int64_t* labels, int64_t* positions) const;

  std::shared_ptr<const TokenFile> ids_;
  std::shared_ptr<const MappedFile> offsets_, mask_;
  int64_t examples_ = 0, truncated_ = 0, completion_tokens_ = 0;
  int64_t pad_ = 0, limit_ = 0, block_size_ = 0;
  std::vector<std::vector<int64_t>> windows_;  // packed: the examples of each window
};

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/sft.ipp>
#endif
