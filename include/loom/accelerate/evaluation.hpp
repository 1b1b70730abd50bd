#pragma once
// The non-template part of HF's evaluation_loop: the loss weighted by batch rows, the
// predictions and labels (and, per include_for_metrics, inputs and losses) kept for
// compute_metrics, and, with W ranks, the split of the batches (rank r evaluates batches r,
// r+W, ...), the all-reduced loss sums and the all-gather that puts every rank's
// predictions back into batch order, so every rank computes the same metrics over the whole
// set. Batches whose dim 1 differs (token-level logits of different sequence lengths) are
// concatenated padded with -100, as HF's nested_concat and pad_across_processes do. No batch
// is evaluated twice, so there is no even-batches padding to drop. The loop itself, which
// calls the hooks, is the Trainer's.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/env.hpp>
#include <loom/accelerate/outputs.hpp>

#include <torch/torch.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace loom {

/// What predict() returns (HF's PredictionOutput).
struct PredictResult {
  torch::Tensor predictions;  ///< every batch's logits, concatenated (CPU; dim 1 padded with -100 where batches differ)
  torch::Tensor label_ids;    ///< every batch's labels (the first of label_names), concatenated (CPU)
  std::vector<torch::Tensor> all_label_ids;  ///< one per label_names field, in order (HF's tuple of label_ids)
  torch::Tensor inputs;       ///< the batches' main input (include_for_metrics inputs; else undefined)
  torch::Tensor losses;       ///< each row's batch loss (include_for_metrics loss; else undefined)
  Metrics metrics;            ///< test_loss, test_<metric>, test_runtime, ...
};

/// `parts` concatenated on dim 0, as HF's nested_concat / torch_pad_and_concatenate: parts
/// of 2 or more dimensions whose dim 1 differs are first padded there to the largest with
/// `padding_index`; every later dimension must agree (a loom::Error naming `what` otherwise).
/// 0-d parts count as 1-d. Empty `parts` give an undefined tensor.
LOOM_INLINE torch::Tensor pad_and_concatenate(std::vector<torch::Tensor> parts, int64_t padding_index = -100,
                                              const char* what = "predictions");

/// `t` with dim 1 padded to `width` with `padding_index` (t itself when it is that wide already).
LOOM_INLINE torch::Tensor pad_dim1(const torch::Tensor& t, int64_t width, int64_t padding_index = -100);

/// Every rank's part of a per-batch result, back in batch order (on the CPU), for an
/// evaluation of `num_batches` batches where rank r evaluated batches r, r+W, ...: `local` is
/// this rank's batches concatenated along dim 0 (undefined when it has none), `sizes` their
/// dim-0 sizes. Ranks may differ in dim 1 (padded with -100 to the widest of all, as
/// accelerate's pad_across_processes), not in the other dims nor in dtype. Every rank calls it.
LOOM_INLINE torch::Tensor gather_in_batch_order(dist::Engine& engine, const dist::World& world, int64_t num_batches,
                                                const torch::Tensor& local, const std::vector<int64_t>& sizes,
                                                const char* what);

/// HF's eval_loss: every batch's loss `losses[i]` repeated `rows[i]` times (losses.repeat(batch_size)),
/// the non-finite ones dropped when `nan_inf_filter` and any is finite, and the float32 array
/// averaged as numpy's mean does (pairwise float32 sums, then float32 division by the count).
/// None when no batch has rows.
LOOM_INLINE std::optional<double> mean_of_repeated_losses(const std::vector<float>& losses,
                                                          const std::vector<int64_t>& rows, bool nan_inf_filter);

class EvalAccumulator {
 public:
  /// An evaluation of `num_batches` batches on this rank's share of them. `accumulate` false
  /// (--batch_eval_metrics in evaluate()): only the loss sums are kept, no per-batch outputs;
  /// round_prediction hands each round's outputs out instead.
  LOOM_INLINE EvalAccumulator(const TrainingArguments& args, const dist::World& world, dist::Engine& engine,
                              torch::Device device, int64_t num_batches, bool accumulate = true);
  /// Rounds of the loop: in round k, rank r evaluates batch k * W + r.
  [[nodiscard]] int64_t rounds() const { return (num_batches_ + world_.size - 1) / world_.size; }
  /// The batch of round k on this rank; none in a last round with fewer batches than ranks.
  [[nodiscard]] std::optional<int64_t> batch_of(int64_t round) const {
    const int64_t b = round * world_.size + world_.rank;
    if (b >= num_batches_) return std::nullopt;
    return b;
  }
  /// Adds one batch's prediction_step output; `rows` is the batch's dim 0; `inputs`: the
  /// batch's main input (kept when include_for_metrics names inputs).
  LOOM_INLINE void add(const PredictionOutput& p, int64_t rows, const torch::Tensor& inputs = {});
  /// After round k: moves predictions to the host every eval_accumulation_steps rounds.
  LOOM_INLINE void end_round(int64_t round);
  /// Batches kept and not yet moved to the host (what end_round moves), over every kind of
  /// output (predictions, each label field, inputs, losses).
  [[nodiscard]] LOOM_INLINE int64_t batches_on_device() const;
  /// --batch_eval_metrics: what compute_metrics gets for round k, when this rank evaluated
  /// `p` (null: no batch this round) of `rows` rows with main input `inputs`: that batch's
  /// predictions, labels (`label_fields` of them), and per include_for_metrics inputs and
  /// losses; with W ranks, the round's W batches gathered in batch order (on the CPU, dim 1
  /// padded with -100), the same on every rank. None when no batch of the round has both
  /// predictions and labels (HF then makes no call). Every rank calls it every round.
  [[nodiscard]] LOOM_INLINE std::optional<EvalPrediction> round_prediction(int64_t round, const PredictionOutput* p,
                                                                           int64_t rows, const torch::Tensor& inputs,
                                                                           std::size_t label_fields);
  /// Sums over ranks and gathers the predictions and labels in batch order (CPU).
  LOOM_INLINE PredictResult finish();
  /// `raw` (compute_metrics' output) plus the loss, each prefixed `<prefix>_`, plus HF's
  /// speed metrics since `start`. Call after finish().
  [[nodiscard]] LOOM_INLINE Metrics metrics(Metrics raw, const std::string& prefix,
                                            std::chrono::steady_clock::time_point start) const;

 private:
  // One kind of per-batch result (predictions, one label field, inputs, losses): the
  // batches not yet moved to the host, the host parts, and dim 0 of each batch kept.
  struct Stream {
    explicit Stream(const char* name) : what(name) {}
    const char* what;
    std::vector<torch::Tensor> device, host;
    std::vector<int64_t> rows;
    void add(const torch::Tensor& t) {
      device.push_back(t.detach());
      rows.push_back(t.dim() > 0 ? t.size(0) : 1);
    }
    void flush() {
      if (!device.empty()) host.push_back(pad_and_concatenate(std::move(device), -100, what).cpu());
      device.clear();
    }
  };

  LOOM_INLINE void flush();
  LOOM_INLINE torch::Tensor collect(Stream& stream);

  const TrainingArguments* args_;
  dist::World world_;
  dist::Engine* engine_;
  int64_t num_batches_;
  bool outputs_;  // predictions exist (not --prediction_loss_only)
  bool want_inputs_, want_losses_;  // include_for_metrics inputs / loss
  bool keep_preds_, keep_inputs_, keep_losses_;  // the above, accumulated
  // Each batch's loss (float32 [1], on the device) and rows, in this rank's order: eval_loss is
  // their mean as HF computes it (mean_of_repeated_losses), at finish().
  std::vector<torch::Tensor> batch_losses_;
  std::vector<int64_t> batch_loss_rows_;
  std::optional<double> loss_;
  int64_t rows_ = 0;
  torch::Device engine_device_;  // where the all-reduce's tensor lives (NCCL: the GPU)
  Stream preds_{"predictions"}, inputs_{"inputs"}, losses_{"losses"};
  std::vector<Stream> labels_;  // one per label field
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/evaluation.ipp>
#endif
