#pragma once
// DataLoader: batches of a dataset in the order of a sampler. Batches are addressed by
// (epoch, index), so resuming at batch k of an epoch never reads the batches before it.
//
// With a Shard of W ranks, rank r reads batches r, r+W, r+2W, ... of the order cut into
// batches of batch_size (accelerate's BatchSamplerShard): one step of W ranks reads the
// same examples as one process with W x batch_size. Every rank gets the same number of
// batches: without drop_last the order is read cyclically past its end (accelerate's
// even_batches); with drop_last only rounds where every rank has a full batch are kept.

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/sampler.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <variant>
#include <vector>

namespace loom::data {

/// Which of several data-parallel readers a DataLoader is.
struct Shard {
  int64_t rank = 0;   ///< this reader
  int64_t world = 1;  ///< readers in all
};

/// Batches of `Batch` from a type-erased dataset.
template <TensorAggregate Batch>
class DataLoader {
 public:
  using Sampler = data::Sampler;

  /// Loader over `dataset` with `batch_size` rows per batch in `sampler`'s order; `shard`
  /// picks this reader's batches when several ranks read the same order.
  DataLoader(AnyDataset<Batch> dataset, int64_t batch_size, bool drop_last, Sampler sampler, Shard shard = {})
      : dataset_(std::move(dataset)), batch_size_(batch_size), drop_last_(drop_last), sampler_(sampler),
        shard_(shard) {
    check(batch_size_ > 0, "batch size must be positive, got {}", batch_size_);
    check(static_cast<bool>(dataset_), "the DataLoader has no dataset");
    check(shard_.world >= 1 && shard_.rank >= 0 && shard_.rank < shard_.world, "bad DataLoader shard {} of {}",
          shard_.rank, shard_.world);
  }

  /// Batches per epoch on this reader (HF's len(dataloader)).
  [[nodiscard]] int64_t size() const {
    const int64_t n = dataset_.size();
    const int64_t batches = drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
    if (shard_.world == 1) return batches;
    return drop_last_ ? batches / shard_.world : (batches + shard_.world - 1) / shard_.world;
  }
  /// The reader's place among all readers.
  [[nodiscard]] const Shard& shard() const { return shard_; }
  /// Examples in the dataset.
  [[nodiscard]] int64_t num_examples() const { return dataset_.size(); }
  /// Rows per full batch.
  [[nodiscard]] int64_t batch_size() const { return batch_size_; }

  /// Fixes the order for `epoch`; batch(i) then reads from it.
  void set_epoch(int64_t epoch) {
    if (epoch == epoch_ && order_.defined()) return;
    epoch_ = epoch;
    order_ = std::visit([&](const auto& s) { return s.order(dataset_.size(), epoch); }, sampler_).contiguous();
  }
  /// The order of the current epoch (call set_epoch first).
  [[nodiscard]] const torch::Tensor& order() const { return order_; }

  /// Batch `i` of the current epoch (the dataset sees its place: this epoch, index
  /// i * world + rank).
  [[nodiscard]] Batch batch(int64_t i) const {
    check(order_.defined(), "DataLoader::batch called before set_epoch");
    check(i >= 0 && i < size(), "batch index {} out of range [0, {})", i, size());
    const int64_t n = dataset_.size();
    if (shard_.world == 1) {
      const int64_t begin = i * batch_size_;
      const int64_t end = std::min(begin + batch_size_, n);
      std::span<const int64_t> idx(order_.data_ptr<int64_t>() + begin, static_cast<std::size_t>(end - begin));
      return dataset_.get_batch(idx, {epoch_, i});
    }
    const int64_t begin = (i * shard_.world + shard_.rank) * batch_size_;
    std::vector<int64_t> idx(static_cast<std::size_t>(batch_size_));
    const int64_t* order = order_.data_ptr<int64_t>();
    for (int64_t k = 0; k < batch_size_; ++k) idx[static_cast<std::size_t>(k)] = order[(begin + k) % n];
    return dataset_.get_batch(std::span<const int64_t>(idx), {epoch_, i * shard_.world + shard_.rank});
  }

 private:
  AnyDataset<Batch> dataset_;
  int64_t batch_size_;
  bool drop_last_;
  Sampler sampler_;
  Shard shard_;
  int64_t epoch_ = -1;
  torch::Tensor order_;
};

}  // namespace loom::data
