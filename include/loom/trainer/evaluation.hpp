#pragma once
// The non-template part of HF's evaluation_loop: the loss weighted by batch rows, the
// predictions and labels kept for compute_metrics, and, with W ranks, the split of the
// batches (rank r evaluates batches r, r+W, ...), the all-reduced loss sums and the
// all-gather that puts every rank's predictions back into batch order, so every rank
// computes the same metrics over the whole set. The loop itself, which calls the hooks,
// is the Trainer's.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/env.hpp>
#include <loom/trainer/hooks.hpp>

#include <torch/torch.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace loom {

/// What predict() returns (HF's PredictionOutput).
struct PredictResult {
  torch::Tensor predictions;  ///< every batch's logits, concatenated (CPU)
  torch::Tensor label_ids;    ///< every batch's labels, concatenated (CPU)
  Metrics metrics;            ///< test_loss, test_<metric>, test_runtime, ...
};

class EvalAccumulator {
 public:
  /// An evaluation of `num_batches` batches on this rank's share of them.
  LOOM_INLINE EvalAccumulator(const TrainingArguments& args, const dist::World& world, dist::Engine& engine,
                              torch::Device device, int64_t num_batches);
  /// Rounds of the loop: in round k, rank r evaluates batch k * W + r.
  [[nodiscard]] int64_t rounds() const { return (num_batches_ + world_.size - 1) / world_.size; }
  /// The batch of round k on this rank; none in a last round with fewer batches than ranks.
  [[nodiscard]] std::optional<int64_t> batch_of(int64_t round) const {
    const int64_t b = round * world_.size + world_.rank;
    if (b >= num_batches_) return std::nullopt;
    return b;
  }
  /// Adds one batch's prediction_step output; `rows` is the batch's dim 0.
  LOOM_INLINE void add(const PredictionOutput& p, int64_t rows);
  /// After round k: moves predictions to the host every eval_accumulation_steps rounds.
  LOOM_INLINE void end_round(int64_t round);
  /// Sums over ranks and gathers the predictions and labels in batch order (CPU).
  LOOM_INLINE PredictResult finish();
  /// `raw` (compute_metrics' output) plus the loss, each prefixed `<prefix>_`, plus HF's
  /// speed metrics since `start`. Call after finish().
  [[nodiscard]] LOOM_INLINE Metrics metrics(Metrics raw, const std::string& prefix,
                                            std::chrono::steady_clock::time_point start) const;

 private:
  LOOM_INLINE void flush();
  LOOM_INLINE torch::Tensor gather_batches(const torch::Tensor& local, const std::vector<int64_t>& sizes);

  const TrainingArguments* args_;
  dist::World world_;
  dist::Engine* engine_;
  int64_t num_batches_;
  bool keep_preds_;
  torch::Tensor loss_sum_;
  int64_t loss_rows_ = 0, rows_ = 0;
  std::vector<torch::Tensor> logits_, labels_, host_logits_, host_labels_;
  std::vector<int64_t> logit_rows_, label_rows_;  // dim 0 of each batch this rank kept
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/evaluation.ipp>
#endif
