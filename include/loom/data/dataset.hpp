#pragma once
// The dataset concept and its type-erased handle.
//
// A dataset is any type with `size()` and either `get_batch(std::span<const int64_t>)`
// returning a batch aggregate (the fast path: one gather per field) or `get(int64_t)`
// returning one example aggregate. Examples are batched by the dataset's own
// `collate(const std::vector<Example>&)` when it has one (e.g. padding variable-length
// sequences, data/padding.hpp), else stacked field by field by loom::data::collate();
// with_collator() gives any example dataset a collator of the caller's choice.
//
// A batch dataset may instead take `get_batch(indices, BatchPlace)`: the epoch and the batch's
// place in it, which the DataLoader passes. A dataset that draws randomness per batch (the
// masked-LM masking of data/mlm.hpp) keys it on the place, so a batch is the same whichever
// thread reads it and whenever (a resumed run reads what the uninterrupted one read).

#include <loom/core/error.hpp>
#include <loom/data/collate.hpp>

#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::data {

/// Where a batch sits in a run: its epoch and its index in the epoch's whole order (the
/// index over every rank's batches: batch i of rank r of W is i * W + r). Evaluation reads
/// its batches in epoch 0.
struct BatchPlace {
  int64_t epoch = 0;  ///< the epoch the DataLoader reads
  int64_t index = 0;  ///< the batch's index in that epoch's order, over all ranks
};

/// A batch dataset whose get_batch also takes the batch's place (per-batch randomness).
template <class D>
concept PlacedBatchDataset = requires(const D& d, std::span<const int64_t> idx, BatchPlace place) {
  { d.size() } -> std::convertible_to<int64_t>;
  { d.get_batch(idx, place) } -> TensorAggregate;
};

/// A dataset that gathers whole batches from a list of indices (and maybe their place).
template <class D>
concept BatchDataset = PlacedBatchDataset<D> || requires(const D& d, std::span<const int64_t> idx) {
  { d.size() } -> std::convertible_to<int64_t>;
  { d.get_batch(idx) } -> TensorAggregate;
};

/// A dataset that returns one example at a time.
template <class D>
concept ExampleDataset = requires(const D& d, int64_t i) {
  { d.size() } -> std::convertible_to<int64_t>;
  { d.get(i) } -> TensorAggregate;
};

/// Anything the Trainer can read batches from.
template <class D>
concept Dataset = BatchDataset<D> || ExampleDataset<D>;

/// The example aggregate an example dataset returns.
template <ExampleDataset D>
using example_t = std::decay_t<decltype(std::declval<const D&>().get(int64_t{}))>;

/// A function object that makes one batch of a list of examples (a collator).
template <class C, class Example>
concept Collator = requires(const C& c, const std::vector<Example>& examples) {
  { c(examples) } -> TensorAggregate;
};

/// An example dataset that batches its examples itself: `collate(examples)`.
template <class D>
concept CollatingDataset = ExampleDataset<D> && requires(const D& d, const std::vector<example_t<D>>& examples) {
  { d.collate(examples) } -> TensorAggregate;
};

namespace detail {
template <class D>
struct batch_of {
  using type = example_t<D>;
};
template <CollatingDataset D>
  requires(!BatchDataset<D>)
struct batch_of<D> {
  using type = std::decay_t<decltype(std::declval<const D&>().collate(std::declval<const std::vector<example_t<D>>&>()))>;
};
template <BatchDataset D>
struct batch_of<D> {
  using type = std::decay_t<decltype(std::declval<const D&>().get_batch(std::span<const int64_t>{}))>;
};
template <PlacedBatchDataset D>
struct batch_of<D> {
  using type = std::decay_t<decltype(std::declval<const D&>().get_batch(std::span<const int64_t>{}, BatchPlace{}))>;
};
}  // namespace detail

/// The batch aggregate a dataset produces: get_batch's result, else collate's, else the example type.
template <Dataset D>
using batch_t = typename detail::batch_of<D>::type;

/// The batch of rows `indices` of `dataset`, at `place`: get_batch(indices, place) or
/// get_batch(indices) when the dataset has one, else its examples get(i) batched by its
/// collate() or, without one, stacked by collate().
template <Dataset D>
batch_t<D> fetch(const D& dataset, std::span<const int64_t> indices, BatchPlace place = {}) {
  if constexpr (PlacedBatchDataset<D>) {
    return dataset.get_batch(indices, place);
  } else if constexpr (BatchDataset<D>) {
    return dataset.get_batch(indices);
  } else {
    std::vector<example_t<D>> examples;
    examples.reserve(indices.size());
    for (int64_t i : indices) examples.push_back(dataset.get(i));
    if constexpr (CollatingDataset<D>) return dataset.collate(examples);
    else return collate(examples);
  }
}

/// An example dataset whose batches a collator makes (what with_collator() returns).
template <ExampleDataset D, Collator<example_t<D>> C>
class Collated {
 public:
  /// `dataset`'s examples, batched by `collator`.
  Collated(D dataset, C collator) : dataset_(std::move(dataset)), collator_(std::move(collator)) {}
  /// Number of examples.
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(dataset_.size()); }
  /// Example `i` of the wrapped dataset.
  [[nodiscard]] example_t<D> get(int64_t i) const { return dataset_.get(i); }
  /// One batch of `examples`, made by the collator.
  [[nodiscard]] auto collate(const std::vector<example_t<D>>& examples) const { return collator_(examples); }
  /// The wrapped dataset.
  [[nodiscard]] const D& dataset() const { return dataset_; }
  /// The collator.
  [[nodiscard]] const C& collator() const { return collator_; }

 private:
  D dataset_;
  C collator_;
};

/// `dataset` with its examples batched by `collator` (HF's `data_collator`): the result is a
/// dataset whose batches are `collator(examples)`, usable wherever a dataset is (the
/// Trainer, DataLoader, AnyDataset). The collator replaces the dataset's own collate().
template <ExampleDataset D, Collator<example_t<D>> C>
Collated<D, C> with_collator(D dataset, C collator) {
  return Collated<D, C>(std::move(dataset), std::move(collator));
}

/// A type-erased, shared, read-only dataset yielding `Batch`.
template <TensorAggregate Batch>
class AnyDataset {
 public:
  AnyDataset() = default;
  /// Takes ownership of `dataset` (moved into shared storage).
  template <Dataset D>
    requires std::same_as<batch_t<D>, Batch>
  explicit AnyDataset(D dataset)
      : impl_(std::make_shared<const D>(std::move(dataset))),
        size_(static_cast<int64_t>(static_cast<const D&>(*static_cast<const D*>(impl_.get())).size())),
        fetch_([](const void* self, std::span<const int64_t> idx, BatchPlace place) {
          return fetch(*static_cast<const D*>(self), idx, place);
        }) {}

  /// True when a dataset is held.
  [[nodiscard]] explicit operator bool() const { return impl_ != nullptr; }
  /// Number of examples.
  [[nodiscard]] int64_t size() const { return size_; }
  /// The batch of rows `indices`, read at `place`.
  [[nodiscard]] Batch get_batch(std::span<const int64_t> indices, BatchPlace place = {}) const {
    return fetch_(impl_.get(), indices, place);
  }

 private:
  std::shared_ptr<const void> impl_;
  int64_t size_ = 0;
  Batch (*fetch_)(const void*, std::span<const int64_t>, BatchPlace) = nullptr;
};

/// An in-memory dataset: a batch aggregate of whole tensors whose rows are the examples.
template <TensorAggregate Batch>
class TensorDataset {
 public:
  /// Wraps `tensors`; every field must have the same first dimension. A field other than
  /// the first may be left undefined (a column the data does not have, e.g. the labels of a
  /// test set for predict()); its batches then leave it undefined too.
  explicit TensorDataset(Batch tensors) : tensors_(std::move(tensors)) {
    size_ = batch_rows(tensors_);
    constexpr auto names = boost::pfr::names_as_array<Batch>();
    boost::pfr::for_each_field(tensors_, [&](const torch::Tensor& t, std::size_t i) {
      check(i > 0 || (t.defined() && t.dim() > 0),
            "TensorDataset's first field '{}' must be a tensor of at least one dimension: its rows are the examples",
            names[i]);
      if (!t.defined()) return;
      check(t.dim() > 0 && t.size(0) == size_,
            "TensorDataset field '{}' has {} rows but the first field has {}", names[i],
            t.dim() > 0 ? t.size(0) : 0, size_);
    });
  }
  /// Number of rows.
  [[nodiscard]] int64_t size() const { return size_; }
  /// The rows `indices` of every field (one index_select per field).
  [[nodiscard]] Batch get_batch(std::span<const int64_t> indices) const {
    auto index = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                  {static_cast<int64_t>(indices.size())}, torch::kLong);
    return index_rows(tensors_, index);
  }
  /// The whole data.
  [[nodiscard]] const Batch& tensors() const { return tensors_; }

 private:
  Batch tensors_;
  int64_t size_ = 0;
};

}  // namespace loom::data
