#pragma once
// What the code calling a model's forward needs back from it, for the calling thread.
//
// The Trainer's default compute_loss reads only the loss of a training forward (and of an
// evaluation under --prediction_loss_only); it says so with a ForwardRequestScope, and a model
// that can skip work a loss does not need reads forward_request(). loom::models' causal LMs
// then run the LM head only at the positions whose shifted label is scored, and may run it
// and the cross-entropy in chunks (models::linear_cross_entropy), never holding the float32
// logits of every position. Code outside the Trainer (a loop of its own, a compute_loss
// override) gets full outputs unless it opens a scope itself.
//
// The Trainer also hands a training forward the group's item count (HF's num_items_in_batch):
// a model that declares `accepts_num_items_in_batch` (loom::models' causal LMs) divides its
// summed token loss by it, as transformers' ForCausalLMLoss does, so the Trainer divides by
// nothing more.
//
// The chunking rule lives here too, beside the request, so that the models and the memory
// plan's estimate (models/activation_memory.hpp) read one rule.

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <utility>

namespace loom {

/// What a model's forward is asked to return on this thread.
struct ForwardRequest {
  /// false: the caller reads only the loss (a causal LM then returns no logits when its batch
  /// has labels, and runs its LM head only where a label is scored).
  bool logits = true;
  /// --chunked_lm_loss: with `logits` false, the LM head and the cross-entropy in chunks of
  /// positions (true), over all scored positions at once (false), or by size (nullopt:
  /// chunked_lm_loss_by_default).
  std::optional<bool> chunked_lm_loss;
  /// HF's num_items_in_batch: the items of the whole accumulation group (over every rank under
  /// --average_tokens_across_devices), a float32 scalar on the model's device. Defined: the loss
  /// is the summed token loss divided by it (transformers' fixed_cross_entropy with a count);
  /// undefined: the mean over this batch's tokens.
  torch::Tensor num_items_in_batch{};
};

/// This thread's request (the default, full outputs, unless a ForwardRequestScope is open).
[[nodiscard]] inline ForwardRequest& forward_request() {
  thread_local ForwardRequest request;
  return request;
}

/// Sets this thread's ForwardRequest for its lifetime, and restores the one before.
class ForwardRequestScope {
 public:
  explicit ForwardRequestScope(ForwardRequest request) : saved_(std::exchange(forward_request(), request)) {}
  ~ForwardRequestScope() { forward_request() = saved_; }
  ForwardRequestScope(const ForwardRequestScope&) = delete;
  ForwardRequestScope& operator=(const ForwardRequestScope&) = delete;

 private:
  ForwardRequest saved_;
};

/// The float32 logits of the scored positions above which the chunked LM loss is the default:
/// 64 MiB (a GPT-2 micro-batch of 8 x 1024 tokens holds 1.6 GB of them, the tests' tiny
/// models a few KB, which keeps them bit for bit with transformers' unchunked loss).
inline constexpr int64_t chunked_lm_loss_threshold_bytes = int64_t{64} << 20;

/// Whether --chunked_lm_loss's default chunks `rows` scored positions over `vocab` columns.
[[nodiscard]] inline bool chunked_lm_loss_by_default(int64_t rows, int64_t vocab) {
  return rows * vocab * 4 > chunked_lm_loss_threshold_bytes;
}

/// The positions in one chunk of the chunked LM loss: Liger's rule (one chunk's logits about
/// as large as the hidden states of all `rows`: rows / ceil(vocab / hidden), to a power of two)
/// or, when more, as many positions as `hidden` up to an eighth of the rows (a chunk's logits
/// then about the size of the head's weight gradient, which each chunk adds to: fewer, larger
/// chunks spend less time on that sum); at least 64 positions (fewer makes the products too
/// thin to run at speed), at most `rows`.
[[nodiscard]] inline int64_t chunked_lm_loss_rows(int64_t rows, int64_t hidden, int64_t vocab) {
  if (rows <= 0) return 1;
  const int64_t factor = std::max<int64_t>(1, (vocab + hidden - 1) / std::max<int64_t>(1, hidden));
  const auto liger =
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(1, (rows + factor - 1) / factor))));
  return std::min(rows, std::max<int64_t>(64, std::max(liger, std::min(hidden, rows / 8))));
}

}  // namespace loom
