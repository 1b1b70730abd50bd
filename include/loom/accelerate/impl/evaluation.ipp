#pragma once
#include <loom/config/validate.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/metrics/speed.hpp>
#include <loom/accelerate/evaluation.hpp>

#include <algorithm>
#include <cmath>

namespace loom {

LOOM_INLINE torch::Tensor pad_dim1(const torch::Tensor& t, int64_t width, int64_t padding_index) {
  if (t.dim() < 2 || t.size(1) == width) return t;
  auto shape = t.sizes().vec();
  shape[1] = width;
  auto out = torch::full(shape, padding_index, t.options());
  out.narrow(1, 0, t.size(1)).copy_(t);
  return out;
}

LOOM_INLINE torch::Tensor pad_and_concatenate(std::vector<torch::Tensor> parts, int64_t padding_index,
                                              const char* what) {
  if (parts.empty()) return {};
  for (auto& t : parts)
    if (t.dim() == 0) t = t.reshape({1});
  const auto& first = parts.front();
  int64_t width = first.dim() >= 2 ? first.size(1) : 0;
  for (const auto& t : parts) {
    const bool same_rest = t.dim() == first.dim() && (t.dim() < 2 || t.sizes().slice(2) == first.sizes().slice(2));
    check(same_rest,
          "evaluation {} of shapes {} and {} cannot be concatenated: batches may differ in dim 0, and in dim 1 "
          "(padded with -100, as HF's nested_concat), but not in the number of dimensions nor in later ones",
          what, c10::str(first.sizes()), c10::str(t.sizes()));
    if (t.dim() >= 2) width = std::max(width, t.size(1));
  }
  if (first.dim() >= 2)
    for (auto& t : parts) t = pad_dim1(t, width, padding_index);
  return parts.size() == 1 ? parts.front() : torch::cat(parts);
}

namespace detail {
// numpy's pairwise summation of float32 values (its add.reduce on a contiguous array): fewer
// than 8 summed in order; up to 128 in 8 running sums combined as ((0+1)+(2+3))+((4+5)+(6+7)),
// then the rest in order; more split in two halves (the first a multiple of 8) summed so.
inline float numpy_pairwise_sum(const float* a, std::size_t n) {
  if (n < 8) {
    float sum = 0.0F;
    for (std::size_t i = 0; i < n; ++i) sum += a[i];
    return sum;
  }
  if (n <= 128) {
    float r[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = a[j];
    std::size_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (std::size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    float sum = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) sum += a[i];
    return sum;
  }
  std::size_t half = n / 2;
  half -= half % 8;
  return numpy_pairwise_sum(a, half) + numpy_pairwise_sum(a + half, n - half);
}
}  // namespace detail

LOOM_INLINE std::optional<double> mean_of_repeated_losses(const std::vector<float>& losses,
                                                          const std::vector<int64_t>& rows, bool nan_inf_filter) {
  check(losses.size() == rows.size(), "mean_of_repeated_losses: {} losses for {} row counts", losses.size(),
        rows.size());
  std::vector<float> all;
  for (std::size_t i = 0; i < losses.size(); ++i) all.insert(all.end(), static_cast<std::size_t>(rows[i]), losses[i]);
  if (nan_inf_filter && std::any_of(all.begin(), all.end(), [](float x) { return std::isfinite(x); }))
    std::erase_if(all, [](float x) { return !std::isfinite(x); });
  if (all.empty()) return std::nullopt;
  // numpy's mean: the float32 sum (0 + pairwise sum) divided in float32 by the count.
  const float sum = 0.0F + detail::numpy_pairwise_sum(all.data(), all.size());
  return static_cast<double>(sum / static_cast<float>(all.size()));
}

LOOM_INLINE EvalAccumulator::EvalAccumulator(const TrainingArguments& args, const dist::World& world,
                                             dist::Engine& engine, torch::Device device, int64_t num_batches,
                                             bool accumulate)
    : args_(&args), world_(world), engine_(&engine), num_batches_(num_batches), outputs_(!args.prediction_loss_only),
      want_inputs_(outputs_ && detail::list_has(args.include_for_metrics, "inputs")),
      want_losses_(outputs_ && detail::list_has(args.include_for_metrics, "loss")),
      keep_preds_(outputs_ && accumulate), keep_inputs_(want_inputs_ && accumulate),
      keep_losses_(want_losses_ && accumulate), engine_device_(device) {}

LOOM_INLINE void EvalAccumulator::add(const PredictionOutput& p, int64_t n, const torch::Tensor& inputs) {
  if (p.loss.defined()) {
    batch_losses_.push_back(p.loss.detach().to(torch::kFloat).reshape({1}));
    batch_loss_rows_.push_back(n);
    // HF repeats each batch's loss once per row (losses.repeat(batch_size)).
    if (keep_losses_) losses_.add(p.loss.detach().to(torch::kFloat).reshape({1}).expand({n}));
  }
  if (keep_preds_ && p.logits.defined()) preds_.add(p.logits);
  if (keep_preds_) {
    // Several label fields (label_names): all_labels; one: labels.
    const std::vector<torch::Tensor> one{p.labels};
    const auto& labels = p.all_labels.empty() ? one : p.all_labels;
    for (std::size_t i = 0; i < labels.size(); ++i) {
      if (!labels[i].defined()) continue;
      while (labels_.size() <= i) labels_.push_back(Stream{"labels"});
      labels_[i].add(labels[i]);
    }
  }
  if (keep_inputs_ && inputs.defined()) inputs_.add(inputs);
  rows_ += n;
}

LOOM_INLINE void EvalAccumulator::end_round(int64_t round) {
  if (args_->eval_accumulation_steps && (round + 1) % *args_->eval_accumulation_steps == 0) flush();
}

LOOM_INLINE int64_t EvalAccumulator::batches_on_device() const {
  auto n = static_cast<int64_t>(preds_.device.size() + inputs_.device.size() + losses_.device.size());
  for (const auto& s : labels_) n += static_cast<int64_t>(s.device.size());
  return n;
}

LOOM_INLINE std::optional<EvalPrediction> EvalAccumulator::round_prediction(int64_t round, const PredictionOutput* p,
                                                                            int64_t rows, const torch::Tensor& inputs,
                                                                            std::size_t label_fields) {
  if (!outputs_) return std::nullopt;
  // The round's batches: round * W + q for the ranks q below `in_round`.
  const int64_t in_round = std::min<int64_t>(world_.size, num_batches_ - round * world_.size);
  const auto piece = [&](const torch::Tensor& t, const char* what) -> torch::Tensor {
    const torch::Tensor local = p != nullptr && t.defined() ? t.detach() : torch::Tensor();
    if (world_.size == 1) return local;
    const std::vector<int64_t> sizes =
        local.defined() ? std::vector<int64_t>{local.dim() > 0 ? local.size(0) : 1} : std::vector<int64_t>{};
    return gather_in_batch_order(*engine_, world_, in_round, local.dim() == 0 ? local.reshape({1}) : local, sizes,
                                 what);
  };
  EvalPrediction out;
  out.predictions = piece(p != nullptr ? p->logits : torch::Tensor(), "predictions");
  for (std::size_t i = 0; i < label_fields; ++i) {
    torch::Tensor t;
    if (p != nullptr) t = p->all_labels.empty() ? (i == 0 ? p->labels : torch::Tensor()) : p->all_labels.at(i);
    out.all_label_ids.push_back(piece(t, "labels"));
  }
  if (!out.all_label_ids.empty()) out.label_ids = out.all_label_ids.front();
  if (want_inputs_) out.inputs = piece(inputs, "inputs");
  if (want_losses_) {
    torch::Tensor losses;
    if (p != nullptr && p->loss.defined()) losses = p->loss.detach().to(torch::kFloat).reshape({1}).expand({rows});
    out.losses = piece(losses, "losses");
  }
  if (!out.predictions.defined() || !out.label_ids.defined()) return std::nullopt;
  return out;
}

LOOM_INLINE void EvalAccumulator::flush() {
  preds_.flush();
  inputs_.flush();
  losses_.flush();
  for (auto& s : labels_) s.flush();
}

// A stream's batches, in batch order over every rank.
LOOM_INLINE torch::Tensor EvalAccumulator::collect(Stream& stream) {
  torch::Tensor local = pad_and_concatenate(std::move(stream.host), -100, stream.what);
  stream.host.clear();
  if (world_.size == 1) return local;
  return gather_in_batch_order(*engine_, world_, num_batches_, local, stream.rows, stream.what);
}

LOOM_INLINE PredictResult EvalAccumulator::finish() {
  flush();
  PredictResult result;
  // The batches' losses and rows ([batches, 2], float32 losses exactly in double), every rank's
  // in batch order (HF gathers each batch's repeated loss in its round).
  {
    torch::Tensor local;
    if (!batch_losses_.empty())
      local = torch::stack({torch::cat(batch_losses_).to(torch::kCPU, torch::kDouble),
                            torch::tensor(batch_loss_rows_, torch::kLong).to(torch::kDouble)},
                           1);
    const std::vector<int64_t> sizes(batch_losses_.size(), 1);
    batch_losses_.clear();
    if (world_.size > 1) local = gather_in_batch_order(*engine_, world_, num_batches_, local, sizes, "losses");
    std::vector<float> losses;
    std::vector<int64_t> rows;
    if (local.defined()) {
      const auto host = local.to(torch::kCPU, torch::kDouble).contiguous();
      const auto a = host.accessor<double, 2>();
      for (int64_t i = 0; i < a.size(0); ++i) {
        losses.push_back(static_cast<float>(a[i][0]));
        rows.push_back(static_cast<int64_t>(a[i][1]));
      }
    }
    loss_ = mean_of_repeated_losses(losses, rows, args_->logging_nan_inf_filter);
  }
  // Every rank must run the same gathers: the label fields any rank kept are agreed on in
  // the all-reduce of the row counts (a rank may have had no batch at all).
  constexpr int64_t kMaxLabelFields = 16;
  check(labels_.size() <= static_cast<std::size_t>(kMaxLabelFields), "evaluation keeps at most {} label fields, got {}",
        kMaxLabelFields, labels_.size());
  if (world_.size > 1) {
    auto totals = torch::zeros({1 + kMaxLabelFields}, torch::kDouble);
    totals[0] = static_cast<double>(rows_);
    for (std::size_t i = 0; i < labels_.size(); ++i) totals[1 + static_cast<int64_t>(i)] = 1.0;
    totals = totals.to(engine_device_);
    engine_->all_reduce(totals, "the evaluation all-reduce");
    const auto host = totals.cpu();
    rows_ = static_cast<int64_t>(host[0].item<double>());
    for (int64_t i = 0; i < kMaxLabelFields; ++i)
      if (host[1 + i].item<double>() > 0 && static_cast<int64_t>(labels_.size()) <= i)
        labels_.resize(static_cast<std::size_t>(i) + 1, Stream{"labels"});
  }
  if (!keep_preds_) return result;
  result.predictions = collect(preds_);
  for (auto& s : labels_) result.all_label_ids.push_back(collect(s));
  if (!result.all_label_ids.empty()) result.label_ids = result.all_label_ids.front();
  if (keep_inputs_) result.inputs = collect(inputs_);
  if (keep_losses_) result.losses = collect(losses_);
  return result;
}

LOOM_INLINE Metrics EvalAccumulator::metrics(Metrics raw, const std::string& prefix,
                                             std::chrono::steady_clock::time_point start) const {
  if (loss_) raw.set("loss", *loss_);
  Metrics metrics;
  for (const auto& [k, v] : raw) metrics.set(k.rfind(prefix + "_", 0) == 0 ? k : prefix + "_" + k, v);
  const double steps = std::ceil(static_cast<double>(rows_) / static_cast<double>(args_->per_device_eval_batch_size));
  metrics.merge(speed_metrics(prefix, start, static_cast<double>(rows_), steps));
  return metrics;
}

LOOM_INLINE torch::Tensor gather_in_batch_order(dist::Engine& engine, const dist::World& world_info,
                                                int64_t num_batches, const torch::Tensor& local,
                                                const std::vector<int64_t>& sizes, const char* what) {
  auto* comm = engine.comm();
  const int64_t world = world_info.size, rank = world_info.rank, nb = num_batches;
  constexpr int64_t kMeta = 10;  // has data, dims, 7 trailing sizes, dtype + 1
  auto meta = torch::zeros({nb + world * kMeta}, torch::TensorOptions().dtype(torch::kLong));
  int64_t* m = meta.data_ptr<int64_t>();
  for (std::size_t j = 0; j < sizes.size(); ++j) m[rank + static_cast<int64_t>(j) * world] = sizes[j];
  if (local.defined()) {
    check(local.dim() >= 1 && local.dim() <= 8,
          "evaluation {} must have 1 to 8 dimensions to be gathered across ranks, got {}", what, local.dim());
    int64_t* row = m + nb + rank * kMeta;
    row[0] = 1;
    row[1] = local.dim();
    for (int64_t d = 1; d < local.dim(); ++d) row[1 + d] = local.size(d);
    row[9] = static_cast<int64_t>(local.scalar_type()) + 1;
  }
  auto on_device = meta.to(comm->device());
  engine.all_reduce(on_device, "the prediction-shape all-reduce");
  meta = on_device.cpu();
  m = meta.data_ptr<int64_t>();
  int64_t ref = -1, width = 0;
  for (int64_t q = 0; q < world; ++q) {
    const int64_t* row = m + nb + q * kMeta;
    if (row[0] == 0) continue;
    if (ref < 0) ref = q;
    const int64_t* first = m + nb + ref * kMeta;
    // dims and dtype agree; dim 1 may differ (it is padded); dims 2.. agree.
    check(row[1] == first[1] && row[9] == first[9] && std::equal(row + 3, row + 9, first + 3),
          "ranks {} and {} produced evaluation {} of different types or shapes beyond dim 1; evaluation pads dim 1 "
          "and gathers along dim 0 only", ref, q, what);
    width = std::max(width, row[2]);
  }
  if (ref < 0) return {};
  const int64_t* row = m + nb + ref * kMeta;
  const auto dtype = static_cast<c10::ScalarType>(row[9] - 1);
  const auto wire = c10::isFloatingType(dtype) ? torch::kFloat : torch::kLong;
  std::vector<int64_t> count(static_cast<std::size_t>(world), 0);
  for (int64_t b = 0; b < nb; ++b) count[static_cast<std::size_t>(b % world)] += m[b];
  const int64_t most = *std::max_element(count.begin(), count.end());
  std::vector<int64_t> shape{most};
  for (int64_t d = 1; d < row[1]; ++d) shape.push_back(d == 1 ? width : row[1 + d]);
  const auto opts = torch::TensorOptions().device(comm->device()).dtype(wire);
  auto mine = torch::zeros(shape, opts);
  if (local.defined() && local.size(0) > 0) mine.narrow(0, 0, local.size(0)).copy_(pad_dim1(local.to(wire), width));
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
