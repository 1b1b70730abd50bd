#pragma once
// DataLoader: batches of a dataset in the order of a sampler. Batches are addressed by
// (epoch, index), so resuming at batch k of an epoch never reads the batches before it.
//
// With a Shard of W ranks, rank r reads batches r, r+W, r+2W, ... of the order cut into
// batches of batch_size (accelerate's BatchSamplerShard): one step of W ranks reads the
// same examples as one process with W x batch_size. Every rank gets the same number of
// batches: without drop_last the order is read cyclically past its end (accelerate's
// even_batches); with drop_last only rounds where every rank has a full batch are kept.
//
// Over a stream (an iterable dataset, data/iterable.hpp) the loader has no length
// (has_length() is false) and reads its batches in order, one after the other: batch(i)
// must follow batch(i - 1) of the same epoch; each rank keeps its slice of every chunk
// (read_shard). The loader records the stream's position after every batch
// (position_after), which a checkpoint saves and seek() restores.

#include <loom/core/error.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterable.hpp>
#include <loom/data/sampler.hpp>

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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

  /// Loader over the stream `stream` with `batch_size` rows per batch (shorter or dropped at
  /// the stream's end: data/iterable.hpp); `shard` picks this reader's slice of each chunk.
  /// Copies of the loader share one reading of the stream.
  DataLoader(AnyStream<Batch> stream, int64_t batch_size, bool drop_last, Shard shard = {})
      : batch_size_(batch_size), drop_last_(drop_last), sampler_(SequentialSampler{}), shard_(shard),
        reader_(std::make_shared<StreamReader>()) {
    check(batch_size_ > 0, "batch size must be positive, got {}", batch_size_);
    check(static_cast<bool>(stream), "the DataLoader has no stream");
    check(shard_.world >= 1 && shard_.rank >= 0 && shard_.rank < shard_.world, "bad DataLoader shard {} of {}",
          shard_.rank, shard_.world);
    reader_->stream = std::move(stream);
  }

  /// False over a stream: it has no size() (HF's len(dataloader) raises).
  [[nodiscard]] bool has_length() const { return reader_ == nullptr; }

  /// Batches per epoch on this reader (HF's len(dataloader)); a stream has none (a loom::Error).
  [[nodiscard]] int64_t size() const {
    check(has_length(), "a DataLoader over a stream (an iterable dataset) has no length");
    const int64_t n = dataset_.size();
    const int64_t batches = drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
    if (shard_.world == 1) return batches;
    return drop_last_ ? batches / shard_.world : (batches + shard_.world - 1) / shard_.world;
  }
  /// The reader's place among all readers.
  [[nodiscard]] const Shard& shard() const { return shard_; }
  /// Examples in the dataset; a stream has no count (a loom::Error).
  [[nodiscard]] int64_t num_examples() const {
    check(has_length(), "a DataLoader over a stream (an iterable dataset) has no example count");
    return dataset_.size();
  }
  /// Rows per full batch.
  [[nodiscard]] int64_t batch_size() const { return batch_size_; }

  /// Fixes the order for `epoch`; batch(i) then reads from it.
  /// Over a stream: starts `epoch` at its beginning, unless the loader already reads it (seek).
  void set_epoch(int64_t epoch) {
    if (reader_) {
      std::lock_guard lock(reader_->mutex);
      if (epoch == reader_->epoch) return;
      reader_->epoch = epoch;
      reader_->next = 0;
      reader_->positions.clear();
      reader_->stream.set_epoch(epoch);
      return;
    }
    if (epoch == epoch_ && order_.defined()) return;
    epoch_ = epoch;
    order_ = std::visit([&](const auto& s) { return s.order(dataset_.size(), epoch); }, sampler_).contiguous();
  }
  /// The order of the current epoch (call set_epoch first).
  [[nodiscard]] const torch::Tensor& order() const { return order_; }

  /// Batch `i` of the current epoch (the dataset sees its place: this epoch, index
  /// i * world + rank).
  [[nodiscard]] Batch batch(int64_t i) const {
    if (reader_) {
      auto b = try_batch(i);
      check(b.has_value(), "the stream ended before batch {} of epoch {}", i, reader_->epoch);
      return std::move(*b);
    }
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

  /// Batch `i` of the current epoch, or nullopt where a stream has ended (a sized loader:
  /// batch(i)). Over a stream, i must be the batch after the last one read.
  [[nodiscard]] std::optional<Batch> try_batch(int64_t i) const {
    if (!reader_) return batch(i);
    std::lock_guard lock(reader_->mutex);
    auto& r = *reader_;
    check(r.epoch >= 0, "DataLoader::batch called before set_epoch");
    check(i == r.next, "a stream's batches are read in order: batch {} asked for after batch {}", i, r.next - 1);
    auto b = r.stream.read(r.epoch, batch_size_, shard_.rank, shard_.world, drop_last_);
    ++r.next;
    r.positions[i] = nlohmann::json{{"epoch", r.epoch}, {"batches", r.next}, {"stream", r.stream.state_dict()}};
    return b;
  }

  /// Over a stream: where it stood after batch `i` of the current epoch ({"epoch", "batches"
  /// read in it, "stream": its state_dict()}), what seek() takes. Positions up to i are then
  /// forgotten (ask in increasing order).
  [[nodiscard]] nlohmann::json position_after(int64_t i) const {
    check(reader_ != nullptr, "position_after: this DataLoader reads no stream");
    std::lock_guard lock(reader_->mutex);
    auto& positions = reader_->positions;
    const auto it = positions.find(i);
    check(it != positions.end(), "position_after({}): that batch has not been read", i);
    nlohmann::json out = std::move(it->second);
    positions.erase(positions.begin(), std::next(it));
    return out;
  }

  /// The position of the start of `epoch` (what seek() takes; "stream" null: set_epoch).
  [[nodiscard]] static nlohmann::json epoch_start(int64_t epoch) {
    return {{"epoch", epoch}, {"batches", 0}, {"stream", nullptr}};
  }

  /// Over a stream: continues where position_after() (or epoch_start()) was: its epoch, after
  /// its batches; set_epoch of that epoch then keeps the place.
  void seek(const nlohmann::json& position) {
    check(reader_ != nullptr, "seek: this DataLoader reads no stream");
    check(position.is_object() && position.contains("epoch") && position.contains("batches") &&
              position.contains("stream"),
          "a stream position needs epoch, batches and stream; got {}", position.dump());
    std::lock_guard lock(reader_->mutex);
    reader_->epoch = position.at("epoch").get<int64_t>();
    if (position.at("stream").is_null()) reader_->stream.set_epoch(reader_->epoch);
    else reader_->stream.load_state_dict(position.at("stream"));
    reader_->next = position.at("batches").get<int64_t>();
    reader_->positions.clear();
  }

 private:
  AnyDataset<Batch> dataset_;
  int64_t batch_size_;
  bool drop_last_;
  Sampler sampler_;
  Shard shard_;
  int64_t epoch_ = -1;
  torch::Tensor order_;
  // A stream's reading, shared by copies of the loader.
  struct StreamReader {
    AnyStream<Batch> stream;
    std::mutex mutex;
    int64_t epoch = -1;  // the epoch read
    int64_t next = 0;    // batches of it read
    std::map<int64_t, nlohmann::json> positions;  // batch -> the position after it
  };
  std::shared_ptr<StreamReader> reader_;  // null: a sized dataset
};

}  // namespace loom::data
