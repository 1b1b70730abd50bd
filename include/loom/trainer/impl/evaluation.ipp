#pragma once
#include <loom/core/error.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/metrics/speed.hpp>
#include <loom/trainer/evaluation.hpp>

#include <algorithm>
#include <cmath>

namespace loom {

LOOM_INLINE EvalAccumulator::EvalAccumulator(const TrainingArguments& args, const dist::World& world,
                                             dist::Engine& engine, torch::Device device, int64_t num_batches)
    : args_(&args), world_(world), engine_(&engine), num_batches_(num_batches), keep_preds_(!args.prediction_loss_only) {
  loss_sum_ = torch::zeros({}, torch::TensorOptions().device(device).dtype(torch::kDouble));
}

LOOM_INLINE void EvalAccumulator::add(const PredictionOutput& p, int64_t n) {
  if (p.loss.defined()) {
    loss_sum_ += p.loss.to(torch::kDouble).reshape({}) * static_cast<double>(n);
    loss_rows_ += n;
  }
  if (keep_preds_ && p.logits.defined()) {
    logits_.push_back(p.logits.detach());
    logit_rows_.push_back(p.logits.dim() > 0 ? p.logits.size(0) : 1);
  }
  if (keep_preds_ && p.labels.defined()) {
    labels_.push_back(p.labels.detach());
    label_rows_.push_back(p.labels.dim() > 0 ? p.labels.size(0) : 1);
  }
  rows_ += n;
}

LOOM_INLINE void EvalAccumulator::end_round(int64_t round) {
  if (args_->eval_accumulation_steps && (round + 1) % *args_->eval_accumulation_steps == 0) flush();
}

LOOM_INLINE void EvalAccumulator::flush() {
  if (!logits_.empty()) host_logits_.push_back(torch::cat(logits_).cpu());
  if (!labels_.empty()) host_labels_.push_back(torch::cat(labels_).cpu());
  logits_.clear();
  labels_.clear();
}

LOOM_INLINE PredictResult EvalAccumulator::finish() {
  flush();
  PredictResult result;
  if (!host_logits_.empty()) result.predictions = torch::cat(host_logits_);
  if (!host_labels_.empty()) result.label_ids = torch::cat(host_labels_);
  if (world_.size > 1) {
    auto totals = torch::stack({loss_sum_, torch::full({}, static_cast<double>(loss_rows_), loss_sum_.options()),
                                torch::full({}, static_cast<double>(rows_), loss_sum_.options())});
    engine_->all_reduce(totals, "the evaluation all-reduce");
    const auto host = totals.cpu();
    loss_sum_ = host[0].to(loss_sum_.device());
    loss_rows_ = static_cast<int64_t>(host[1].item<double>());
    rows_ = static_cast<int64_t>(host[2].item<double>());
    if (keep_preds_) {
      result.predictions = gather_batches(result.predictions, logit_rows_);
      result.label_ids = gather_batches(result.label_ids, label_rows_);
    }
  }
  return result;
}

LOOM_INLINE Metrics EvalAccumulator::metrics(Metrics raw, const std::string& prefix,
                                             std::chrono::steady_clock::time_point start) const {
  if (loss_rows_ > 0) raw.set("loss", loss_sum_.item<double>() / static_cast<double>(loss_rows_));
  Metrics metrics;
  for (const auto& [k, v] : raw) metrics.set(k.rfind(prefix + "_", 0) == 0 ? k : prefix + "_" + k, v);
  const double steps = std::ceil(static_cast<double>(rows_) / static_cast<double>(args_->per_device_eval_batch_size));
  metrics.merge(speed_metrics(prefix, start, static_cast<double>(rows_), steps));
  return metrics;
}

// Every rank's part of a per-batch result, back in batch order. `local` is this rank's
// batches r, r+W, ... concatenated along dim 0, `sizes` their dim-0 sizes. Batches may
// differ in dim 0 but not in the other dims, nor in dtype, across ranks.
LOOM_INLINE torch::Tensor EvalAccumulator::gather_batches(const torch::Tensor& local,
                                                          const std::vector<int64_t>& sizes) {
  auto* comm = engine_->comm();
  const int64_t world = world_.size, rank = world_.rank, nb = num_batches_;
  constexpr int64_t kMeta = 10;  // has data, dims, 7 trailing sizes, dtype + 1
  auto meta = torch::zeros({nb + world * kMeta}, torch::TensorOptions().dtype(torch::kLong));
  int64_t* m = meta.data_ptr<int64_t>();
  for (std::size_t j = 0; j < sizes.size(); ++j) m[rank + static_cast<int64_t>(j) * world] = sizes[j];
  if (local.defined()) {
    check(local.dim() >= 1 && local.dim() <= 8,
          "predictions and labels must have 1 to 8 dimensions to be gathered across ranks, got {}", local.dim());
    int64_t* row = m + nb + rank * kMeta;
    row[0] = 1;
    row[1] = local.dim();
    for (int64_t d = 1; d < local.dim(); ++d) row[1 + d] = local.size(d);
    row[9] = static_cast<int64_t>(local.scalar_type()) + 1;
  }
  auto on_device = meta.to(comm->device());
  engine_->all_reduce(on_device, "the prediction-shape all-reduce");
  meta = on_device.cpu();
  m = meta.data_ptr<int64_t>();
  int64_t ref = -1;
  for (int64_t q = 0; q < world; ++q) {
    const int64_t* row = m + nb + q * kMeta;
    if (row[0] == 0) continue;
    if (ref < 0) ref = q;
    check(std::equal(row + 1, row + kMeta, m + nb + ref * kMeta + 1),
          "ranks {} and {} produced predictions or labels of different shapes or types; evaluation gathers them "
          "along dim 0 only", ref, q);
  }
  if (ref < 0) return {};
  const int64_t* row = m + nb + ref * kMeta;
  const auto dtype = static_cast<c10::ScalarType>(row[9] - 1);
  const auto wire = c10::isFloatingType(dtype) ? torch::kFloat : torch::kLong;
  std::vector<int64_t> count(static_cast<std::size_t>(world), 0);
  for (int64_t b = 0; b < nb; ++b) count[static_cast<std::size_t>(b % world)] += m[b];
  const int64_t most = *std::max_element(count.begin(), count.end());
  std::vector<int64_t> shape{most};
  for (int64_t d = 1; d < row[1]; ++d) shape.push_back(row[1 + d]);
  const auto opts = torch::TensorOptions().device(comm->device()).dtype(wire);
  auto mine = torch::zeros(shape, opts);
  if (local.defined() && local.size(0) > 0) mine.narrow(0, 0, local.size(0)).copy_(local.to(wire));
  shape[0] = most * world;
  auto all = torch::empty(shape, opts);
  comm->all_gather(all, mine, "the prediction all-gather").wait();
  all = all.cpu();
  std::vector<int64_t> offset(static_cast<std::size_t>(world), 0);
  std::vector<torch::Tensor> parts;
  for (int64_t b = 0; b < nb; ++b) {
    const auto q = static_cast<std::size_t>(b % world);
    if (m[b] > 0) parts.push_back(all.narrow(0, static_cast<int64_t>(q) * most + offset[q], m[b]));
    offset[q] += m[b];
  }
  if (parts.empty()) return all.narrow(0, 0, 0).to(dtype);
  return torch::cat(parts).to(dtype);
}

}  // namespace loom
