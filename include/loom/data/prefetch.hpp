#pragma once
// BatchPrefetcher: a DataLoader's batches prepared ahead of the loop on background threads
// (HF's dataloader_num_workers / dataloader_prefetch_factor / dataloader_pin_memory), handed
// out in the order asked for, whatever thread finished first. The batches are the ones
// DataLoader::batch(i) returns, so a run with workers reads exactly what one without reads.
//
// Workers are threads of this process, not processes: loom's datasets are C++ objects whose
// reads are const and thread-safe (a mapped file, index_select on tensors), so there is no
// interpreter lock to escape and nothing to copy between processes. At most
// workers x prefetch_factor batches wait ready or in preparation at any time (torch's
// DataLoader bound). An exception thrown while preparing a batch is rethrown by next() for
// that batch, in order.
//
// With 0 workers, next() reads the batch on the caller's thread: the loop has one code path.
//
// A loader over a stream (data/iterable.hpp) reads its batches in order, so at most one
// worker reads it ahead; try_next() says where the stream ends.

#include <loom/core/device.hpp>
#include <loom/core/error.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

namespace loom::data {

/// How batches are prepared ahead (TrainingArguments' dataloader_* flags).
struct PrefetchOptions {
  int64_t num_workers = 0;      ///< background threads (0: each batch read when asked for)
  int64_t prefetch_factor = 2;  ///< batches in flight per worker
  bool pin_memory = false;      ///< page-lock each prepared batch (for asynchronous copies to a GPU)
  torch::Device device = torch::kCPU;  ///< made current on each worker thread (pinned memory uses its context)
};

/// Batches of a DataLoader, read ahead on `num_workers` threads.
template <TensorAggregate Batch>
class BatchPrefetcher {
 public:
  /// Prefetches from `loader`, which must outlive this object.
  BatchPrefetcher(DataLoader<Batch>& loader, PrefetchOptions options) : loader_(loader), options_(options) {
    check(options_.num_workers >= 0, "--dataloader_num_workers must not be negative, got {}", options_.num_workers);
    check(options_.prefetch_factor >= 1, "--dataloader_prefetch_factor must be positive, got {}",
          options_.prefetch_factor);
  }
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;
  ~BatchPrefetcher() { stop(); }

  /// Sets the loader's epoch and starts reading batches `indices` of it, in that order.
  void start(int64_t epoch, std::vector<int64_t> indices) {
    const auto count = static_cast<int64_t>(indices.size());
    begin(epoch, std::move(indices), 0, count);
  }

  /// Sets the loader's epoch and starts reading batches [first, last) of it.
  void start(int64_t epoch, int64_t first, int64_t last) { begin(epoch, {}, first, std::max<int64_t>(last - first, 0)); }

  /// The next batch of the started sequence (waits for it when a worker still prepares it).
  Batch next() {
    auto batch = try_next();
    check(batch.has_value(), "the stream ended before batch {}", index_at(consumed_ - 1));
    return std::move(*batch);
  }

  /// The next batch, or nullopt where the loader's stream has ended (a sized loader always has one).
  std::optional<Batch> try_next() {
    check(consumed_ < count_, "BatchPrefetcher::next past the end of its {} batches", count_);
    if (workers_.empty()) return prepare(index_at(consumed_++));
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.contains(consumed_); });
    auto node = ready_.extract(consumed_++);
    lock.unlock();
    changed_.notify_all();  // a slot is free
    if (auto* error = std::get_if<std::exception_ptr>(&node.mapped())) std::rethrow_exception(*error);
    return std::move(std::get<std::optional<Batch>>(node.mapped()));
  }

  /// Stops the workers (batches not yet taken are dropped).
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

 private:
  void begin(int64_t epoch, std::vector<int64_t> indices, int64_t first, int64_t count) {
    stop();  // no worker may read the loader's order while set_epoch replaces it
    loader_.set_epoch(epoch);
    indices_ = std::move(indices);
    first_ = first;
    count_ = count;
    issued_ = consumed_ = 0;
    ready_.clear();
    stopping_ = false;
    const int64_t workers = loader_.has_length() ? options_.num_workers : std::min<int64_t>(options_.num_workers, 1);
    for (int64_t w = 0; w < workers; ++w) workers_.emplace_back([this] { work(); });
  }

  // The loader's index of position k of the started sequence.
  int64_t index_at(int64_t k) const { return indices_.empty() ? first_ + k : indices_[static_cast<std::size_t>(k)]; }

  std::optional<Batch> prepare(int64_t i) const {
    std::optional<Batch> batch = loader_.try_batch(i);
    if (options_.pin_memory && batch)
      boost::pfr::for_each_field(*batch, [](torch::Tensor& t) {
        if (t.defined() && t.device().is_cpu()) t = t.pin_memory();
      });
    return batch;
  }

  void work() {
    make_current(options_.device);
    const auto in_flight = options_.num_workers * options_.prefetch_factor;
    for (;;) {
      int64_t k = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] {
          return stopping_ || (issued_ < count_ && issued_ - consumed_ < in_flight);
        });
        if (stopping_) return;
        k = issued_++;
      }
      std::variant<std::optional<Batch>, std::exception_ptr> result;
      try {
        result = prepare(index_at(k));
      } catch (...) {
        result = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        ready_.emplace(k, std::move(result));
      }
      changed_.notify_all();
    }
  }

  DataLoader<Batch>& loader_;
  PrefetchOptions options_;
  std::vector<int64_t> indices_;  // the loader's batches to read; empty: first_, first_ + 1, ...
  int64_t first_ = 0;
  int64_t count_ = 0;  // batches in the started sequence
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int64_t, std::variant<std::optional<Batch>, std::exception_ptr>> ready_;  // position in indices_ -> batch
  int64_t issued_ = 0;    // positions handed to workers
  int64_t consumed_ = 0;  // positions returned by next()
  bool stopping_ = false;
};

}  // namespace loom::data
