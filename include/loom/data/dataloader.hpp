#pragma once
// DataLoader: batches of a dataset in the order of a sampler. Batches are addressed by
// (epoch, index), so resuming at batch k of an epoch never reads the batches before it.

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/sampler.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <span>
#include <variant>

namespace loom::data {

/// Batches of `Batch` from a type-erased dataset.
template <TensorAggregate Batch>
class DataLoader {
 public:
  using Sampler = std::variant<RandomSampler, SequentialSampler>;

  /// Loader over `dataset` with `batch_size` rows per batch in `sampler`'s order.
  DataLoader(AnyDataset<Batch> dataset, int64_t batch_size, bool drop_last, Sampler sampler)
      : dataset_(std::move(dataset)), batch_size_(batch_size), drop_last_(drop_last), sampler_(sampler) {
    check(batch_size_ > 0, "batch size must be positive, got {}", batch_size_);
    check(static_cast<bool>(dataset_), "the DataLoader has no dataset");
  }

  /// Batches per epoch (HF's len(dataloader)).
  [[nodiscard]] int64_t size() const {
    const int64_t n = dataset_.size();
    return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }
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

  /// Batch `i` of the current epoch.
  [[nodiscard]] Batch batch(int64_t i) const {
    check(order_.defined(), "DataLoader::batch called before set_epoch");
    check(i >= 0 && i < size(), "batch index {} out of range [0, {})", i, size());
    const int64_t begin = i * batch_size_;
    const int64_t end = std::min(begin + batch_size_, dataset_.size());
    std::span<const int64_t> idx(order_.data_ptr<int64_t>() + begin, static_cast<std::size_t>(end - begin));
    return dataset_.get_batch(idx);
  }

 private:
  AnyDataset<Batch> dataset_;
  int64_t batch_size_;
  bool drop_last_;
  Sampler sampler_;
  int64_t epoch_ = -1;
  torch::Tensor order_;
};

}  // namespace loom::data
