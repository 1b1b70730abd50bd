#pragma once
// Definitions of data/sft.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/data/sft.hpp>

#include <algorithm>
#include <limits>
#include <string>

namespace loom::data {

LOOM_INLINE SftDataset::SftDataset(const SftFiles& files, const SftOptions& options) : pad_(options.pad_token_id) {
  check(!options.max_length || *options.max_length > 1, "SftDataset({}): max_length must be at least 2, got {}",
        files.ids.string(), options.max_length.value_or(0));
  check(!options.packing || *options.packing > 1, "SftDataset({}): the packing block size must be at least 2, got {}",
        files.ids.string(), options.packing.value_or(0));
  check(pad_ >= 0 && (!options.vocab_size || pad_ < *options.vocab_size),
        "SftDataset({}): pad_token_id {} is not a token of the vocabulary", files.ids.string(), pad_);
  ids_ = std::make_shared<const TokenFile>(files.ids, options.dtype);
  offsets_ = std::make_shared<const MappedFile>(files.offsets);
  examples_ = detail::checked_offsets(*offsets_, *ids_, /*allow_empty=*/false);
  mask_ = std::make_shared<const MappedFile>(files.mask);
  const auto mask = mask_->bytes();
  check(static_cast<int64_t>(mask.size()) == ids_->size(), "{}: {} bytes, expected one mask byte per id of {} ({})",
        files.mask.string(), mask.size(), files.ids.string(), ids_->size());
  for (std::size_t k = 0; k < mask.size(); ++k)
    check(mask[k] == std::byte{0} || mask[k] == std::byte{1}, "{}: byte {} is {}, but a loss mask holds 0 or 1",
          files.mask.string(), k, static_cast<int>(mask[k]));
  if (options.vocab_size) ids_->check_ids_below(*options.vocab_size);
  block_size_ = options.packing.value_or(0);
  limit_ = options.packing ? *options.packing : options.max_length.value_or(std::numeric_limits<int64_t>::max());
  int64_t used = 0;  // tokens in the window being filled
  for (int64_t i = 0; i < examples_; ++i) {
    const auto begin = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i));
    const auto end = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i + 1));
    const auto [b, e] = span_of(i);
    if (e - b < end - begin) ++truncated_;
    for (int64_t k = b + 1; k < e; ++k) completion_tokens_ += mask[static_cast<std::size_t>(k)] == std::byte{1} ? 1 : 0;
    if (!packed() || e == b) continue;
    if (windows_.empty() || used + (e - b) > block_size_) {
      windows_.emplace_back();
      used = 0;
    }
    windows_.back().push_back(i);
    used += e - b;
  }
  check(size() > 0, "{}: no examples", files.ids.string());
  // Every label -100: the loss and its gradient would be zero, and a run would learn nothing.
  check(completion_tokens_ > 0,
        "{}: no example keeps a completion token (a loss-mask 1 after its first id){}, so every label is -100 and "
        "training would learn nothing; check {}{}",
        files.ids.string(),
        truncated_ > 0 ? " once " + std::to_string(truncated_) + " examples are cut to " + std::to_string(limit_) + " tokens"
                       : std::string(),
        files.mask.string(), truncated_ > 0 ? ", or raise the packing window / max_length" : "");
}

LOOM_INLINE std::pair<int64_t, int64_t> SftDataset::span_of(int64_t i) const {
  check(i >= 0 && i < examples_, "{}: example {} out of range [0, {})", ids_->path().string(), i, examples_);
  const auto begin = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i));
  const auto end = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i + 1));
  return {begin, end - begin > limit_ ? begin + limit_ : end};
}

LOOM_INLINE int64_t SftDataset::length(int64_t i) const {
  if (packed()) {
    check(i >= 0 && i < size(), "{}: window {} out of range [0, {})", ids_->path().string(), i, size());
    return block_size_;
  }
  const auto [b, e] = span_of(i);
  return e - b;
}

LOOM_INLINE int64_t SftDataset::write(int64_t i, int64_t* ids, int64_t* labels, int64_t* positions) const {
  const auto [b, e] = span_of(i);
  ids_->read(b, e - b, ids);
  const auto mask = mask_->bytes();
  for (int64_t k = b; k < e; ++k) {
    const bool counted = k > b && mask[static_cast<std::size_t>(k)] == std::byte{1};
    labels[k - b] = counted ? ids[k - b] : -100;
    if (positions != nullptr) positions[k - b] = k - b;
  }
  return e - b;
}

LOOM_INLINE int64_t SftDataset::max_sequence_length() const {
  if (packed()) return size() > 0 ? block_size_ : 0;
  int64_t longest = 0;
  for (int64_t i = 0; i < examples_; ++i) longest = std::max(longest, length(i));
  return longest;
}

LOOM_INLINE CausalLMBatch SftDataset::get_batch(std::span<const int64_t> indices) const {
  const auto rows = static_cast<int64_t>(indices.size());
  int64_t width = block_size_;
  if (!packed())
    for (const int64_t i : indices) width = std::max(width, length(i));
  auto ids = torch::full({rows, width}, pad_, torch::kLong);
  auto labels = torch::full({rows, width}, int64_t{-100}, torch::kLong);
  torch::Tensor positions, attention_mask;
  if (packed()) positions = torch::empty({rows, width}, torch::kLong);
  else attention_mask = torch::ones({rows, width}, torch::kLong);
  bool padding = false;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = indices[static_cast<std::size_t>(r)];
    int64_t* id = ids.data_ptr<int64_t>() + r * width;
    int64_t* label = labels.data_ptr<int64_t>() + r * width;
    if (!packed()) {
      // TRL's collator's attention_mask: 1 on the example's tokens, 0 on the padding after them.
      const int64_t length = write(i, id, label, nullptr);
      std::fill(attention_mask.data_ptr<int64_t>() + r * width + length,
                attention_mask.data_ptr<int64_t>() + (r + 1) * width, int64_t{0});
      padding = padding || length < width;
      continue;
    }
    check(i >= 0 && i < size(), "{}: window {} out of range [0, {})", ids_->path().string(), i, size());
    int64_t* position = positions.data_ptr<int64_t>() + r * width;
    int64_t at = 0;
    for (const int64_t example : windows_[static_cast<std::size_t>(i)])
      at += write(example, id + at, label + at, position + at);
    for (int64_t k = at; k < width; ++k) position[k] = k - at;  // the padding: a document of its own
  }
  // A batch without padding goes without a mask: the model reads one it finds all ones as none
  // (transformers' sdpa path), so only the host's check is saved.
  if (!padding) attention_mask = torch::Tensor();
  return {std::move(ids), std::move(labels), std::move(positions), std::move(attention_mask)};
}

}  // namespace loom::data
