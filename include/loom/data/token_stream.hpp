#pragma once
// TokenStream: a flat token file (data/token_file.hpp) read front to back as a stream
// (data/iterable.hpp) of causal-LM windows, memory-mapped: a window is copied out of the
// mapping when it is read, so the file is never loaded and may be larger than memory (the
// kernel pages it in, and may drop the pages again, as the reader moves on). The windows are
// TokenFileDataset's (block_size tokens every `stride`), in file order, the same every epoch;
// its position is the index of the next window, so a resume seeks there, and skip() passes
// over the other ranks' windows without touching their pages. Every 32 MiB of progress the
// stream drops its pages behind it (MappedFile::release), so its resident memory stays near
// that, not the file's size (docs/building.md has the figure).

#include <loom/core/error.hpp>
#include <loom/data/text.hpp>
#include <loom/data/token_file.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

namespace loom::data {

/// The windows of a flat token file as a stream: each a CausalLMBatch example (input_ids and
/// labels int64 [block_size], labels a copy: the model shifts).
class TokenStream {
 public:
  /// Maps `file` (the errors of TokenFileDataset: a missing file, a size that is not a
  /// multiple of the element, fewer tokens than one block, an id >= options.vocab_size).
  TokenStream(const std::filesystem::path& file, const TokenFileOptions& options)
      : windows_(std::make_shared<const TokenFileDataset>(file, options)) {}
  /// The next window (nullopt past the last).
  std::optional<CausalLMBatch> next() {
    if (next_ >= windows_->size()) return std::nullopt;
    const int64_t begin = next_++ * windows_->stride();
    auto ids = windows_->file().slice(begin, windows_->block_size());
    if (begin - released_ >= kReleaseTokens) {
      windows_->file().release(released_, begin);
      released_ = begin;
    }
    return CausalLMBatch{ids, ids.clone()};
  }
  /// Passes over up to `n` windows without reading them; how many there were.
  int64_t skip(int64_t n) {
    const int64_t k = std::clamp<int64_t>(windows_->size() - next_, 0, n);
    next_ += k;
    return k;
  }
  /// Back to the first window (the order is the same every epoch).
  void set_epoch(int64_t /*epoch*/) { next_ = released_ = 0; }
  /// {"window": the next window's index}.
  [[nodiscard]] nlohmann::json state_dict() const { return {{"window", next_}}; }
  /// Seeks to a state_dict() (a window index within the file).
  void load_state_dict(const nlohmann::json& state) {
    check(state.is_object() && state.contains("window") && state.at("window").is_number_integer(),
          "a TokenStream state is {{\"window\": <index>}}; got {}", state.dump());
    const auto w = state.at("window").get<int64_t>();
    check(w >= 0 && w <= windows_->size(), "{}: the saved stream position, window {}, lies outside its {} windows",
          windows_->file().path().string(), w, windows_->size());
    next_ = w;
    released_ = std::min(released_, next_ * windows_->stride());
  }
  /// Windows in the file (a stream need not know; this one does).
  [[nodiscard]] int64_t windows() const { return windows_->size(); }

 private:
  static constexpr int64_t kReleaseTokens = int64_t{16} << 20;  // ids per release (32 MiB of uint16)
  std::shared_ptr<const TokenFileDataset> windows_;
  int64_t next_ = 0;
  int64_t released_ = 0;  // ids before this were dropped from memory
};

}  // namespace loom::data
