#pragma once
// --auto_find_batch_size (HF's, through accelerate's find_executable_batch_size): when a
// training attempt fails with an out-of-memory error, train again with the per-device batch
// size multiplied by 0.9 (rounded down), until an attempt finishes or the size reaches 0.
//
// Where loom goes further than HF: before each new attempt the model's parameters and buffers
// and torch's random generators are put back as they were when train() was called, so the
// run that finally fits is the same, bit for bit, as one started with that batch size (HF
// keeps whatever steps the failed attempt took). The snapshot is a CPU copy of the model,
// taken only with --auto_find_batch_size. Single process only (startup.ipp says why).
//
// As in HF, the size found is TrainerState::train_batch_size (trainer_state.json), and a run
// resumed with --auto_find_batch_size starts from the checkpoint's size, not the flag's.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace loom {

/// accelerate's should_reduce_batch_size: a c10::OutOfMemoryError, or an error whose message
/// says " out of memory.", "DefaultCPUAllocator: can't allocate memory" or cuDNN's
/// "CUDNN_STATUS_NOT_SUPPORTED.".
LOOM_INLINE bool is_out_of_memory(const std::exception_ptr& error);

/// The next batch size to try after an out-of-memory error: int(size x 0.9), accelerate's rule.
constexpr int64_t reduced_batch_size(int64_t size) {
  return static_cast<int64_t>(static_cast<double>(size) * 0.9);
}

class BatchSizeFinder {
 public:
  /// Snapshots `module` and the generators. `resume`: the checkpoint this train() resumes from:
  /// its trainer_state.json's train_batch_size becomes the first size tried, and the folder is
  /// pinned for the retries (a failed attempt may have saved a later checkpoint-N).
  LOOM_INLINE BatchSizeFinder(TrainingArguments& args, const std::optional<std::filesystem::path>& resume,
                              torch::nn::Module& module);
  BatchSizeFinder(const BatchSizeFinder&) = delete;
  BatchSizeFinder& operator=(const BatchSizeFinder&) = delete;
  /// Puts back the flags it changed (per_device_train_batch_size, resume_from_checkpoint).
  LOOM_INLINE ~BatchSizeFinder();

  /// After a failed attempt: false when `error` is not an out-of-memory error (rethrow it);
  /// else restores the model and generators and lowers the batch size. Throws a loom::Error
  /// when no smaller size is left.
  LOOM_INLINE bool retry(const std::exception_ptr& error);
  /// The batch size of the current attempt.
  [[nodiscard]] int64_t batch_size() const { return args_->per_device_train_batch_size; }

 private:
  TrainingArguments* args_;
  torch::nn::Module* module_;
  int64_t original_batch_size_;
  std::optional<std::string> original_resume_;
  std::vector<torch::Tensor> params_, buffers_;
  std::vector<std::pair<torch::Device, torch::Tensor>> generators_;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/batch_size_finder.ipp>
#endif
