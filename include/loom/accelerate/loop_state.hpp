#pragma once
// LoopState: the training loop's running totals, which the loop owns and a checkpoint saves
// (loop_state.json) so that the logs after a resume match an uninterrupted run.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

/// The training losses since the last log. Each micro-step's loss stays a device scalar (no
/// op, no sync); the window is summed on the host at the next logging step, where HF's
/// logging_nan_inf_filter is applied in order: a nan/inf loss counts as the mean of the
/// window so far, tr_loss / (1 + steps logged in the window).
class LossWindow {
 public:
  void add(const torch::Tensor& loss, int64_t steps_in_window) { items_.emplace_back(loss, steps_in_window); }
  /// Sums each step's loss over ranks before it is read (distributed runs; a collective,
  /// so every rank calls total() at the same points).
  void set_reducer(std::function<void(torch::Tensor&)> reduce) { reduce_ = std::move(reduce); }
  /// The window's total (one device-to-host copy).
  [[nodiscard]] LOOM_INLINE double total(bool nan_filter) const;
  /// Starts a new window holding `carry` (a checkpoint's unlogged total).
  void reset(double carry = 0.0) {
    carry_ = carry;
    items_.clear();
  }

 private:
  double carry_ = 0.0;
  std::vector<std::pair<torch::Tensor, int64_t>> items_;
  std::function<void(torch::Tensor&)> reduce_;
};

/// The loop's totals between logs and over the run.
struct LoopState {
  LossWindow tr_loss;          ///< losses since the last log (device scalars)
  double total_loss = 0.0;     ///< sum of every logged window (train_loss = total / steps)
  int64_t last_logged = 0;     ///< global_step of the last log (HF's _globalstep_last_logged)
  int64_t items_seen = 0;      ///< num_items of this run's micro-batches (tokens, for token losses)
  int64_t skipped_logged = 0;  ///< fp16 skipped steps counted in the logs so far
  /// Training on a stream: where it stood after the last optimizer step (DataLoader::
  /// position_after), saved as loop_state.json's "train_stream"; null for a sized dataset.
  nlohmann::json train_stream;

  /// loop_state.json's loss fields: the unlogged window is summed (a collective when
  /// distributed). OptimizerStep adds its skipped_steps to the same file.
  [[nodiscard]] LOOM_INLINE nlohmann::json state_dict(bool nan_filter) const;
  /// Restores state_dict() output.
  LOOM_INLINE void load_state_dict(const nlohmann::json& j);
};

/// The warning for a resume whose batch layout differs from the checkpoint's (HF warns too):
/// `saved` is the checkpoint's loop_state.json. Empty when nothing changed or the checkpoint
/// predates these fields.
LOOM_INLINE std::string resume_warning(const nlohmann::json& saved, const TrainingArguments& args, int world_size,
                                       int64_t global_step);

/// How long a run is, from the arguments and the training loader (HF's _inner_training_loop
/// preamble).
struct TrainingPlan {
  int64_t batches_per_epoch = 0;   ///< micro-batches per epoch on this rank
  int64_t updates_per_epoch = 0;   ///< optimizer steps per epoch
  int64_t max_steps = 0;           ///< optimizer steps in the run
  int64_t num_epochs = 0;          ///< epochs started
  double num_train_samples = 0;    ///< samples, for train_samples_per_second

  /// The plan for a loader of `batches` batches over `examples` examples; a loader with no
  /// batch is a loom::Error.
  LOOM_INLINE static TrainingPlan make(const TrainingArguments& args, int64_t batches, int64_t examples, int world_size);
  /// The plan for a training stream (a loader without a length): HF's rule, --max_steps
  /// optimizer steps (without it, a loom::Error) over epochs of max_steps x
  /// gradient_accumulation_steps batches (the length HF gives state.epoch's fraction), as many
  /// epochs as the steps take (num_epochs: the largest int64, HF's sys.maxsize).
  LOOM_INLINE static TrainingPlan for_stream(const TrainingArguments& args, int world_size);
  /// A fresh TrainerState for this plan (HF's, with the resolved logging/eval/save intervals).
  [[nodiscard]] LOOM_INLINE TrainerState initial_state(const TrainingArguments& args, bool world_zero,
                                                       bool local_zero) const;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/loop_state.ipp>
#endif
