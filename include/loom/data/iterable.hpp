#pragma once
// Iterable datasets: data without a size, read front to back (HF's IterableDataset), such as
// a corpus streamed from disk or a generator function. The Trainer trains on one with
// --max_steps (HF's rule: a loader without a length needs max_steps).
//
// A stream is any copyable type with
//   std::optional<Example> next();            the next example; nullopt: the stream (the epoch) ends
//   void set_epoch(int64_t epoch);            back to the start of `epoch` (HF's set_epoch: a stream
//                                             that shuffles keys its order on the epoch)
//   nlohmann::json state_dict() const;        where it stands (torchdata's Stateful protocol) ...
//   void load_state_dict(const nlohmann::json&);  ... and a seek back there
// and optionally `int64_t skip(int64_t n)` (pass over up to n examples without reading them;
// returns how many there were) and `collate(const std::vector<Example>&)` (else the examples
// are stacked field by field, data/collate.hpp).
//
// Sharding (read_shard): the examples are cut into chunks of world x batch_size and rank r
// keeps positions [r x batch_size, (r + 1) x batch_size) of each chunk, skipping the others:
// accelerate's IterableDatasetShard with split_batches=False, which is also the data each
// rank gets from accelerate's DataLoaderDispatcher (HF Trainer's default for an iterable
// dataset), without rank 0 reading for everyone and broadcasting. Each rank ends a chunk at
// the same place of the stream, so every rank's state_dict() after a batch is the same. At
// the end of the stream a short chunk is dropped under drop_last; else, with several ranks,
// it is completed with the first examples of the epoch, cyclically (IterableDatasetShard's
// rule); one rank keeps a short last batch (torch's DataLoader).

#include <loom/core/error.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataset.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::data {

namespace detail {
template <class T>
struct optional_aggregate : std::false_type {};
template <TensorAggregate T>
struct optional_aggregate<std::optional<T>> : std::true_type {};
}  // namespace detail

/// A dataset without a size, read in order (HF's IterableDataset); see the top of this file.
template <class S>
concept IterableDataset = std::copy_constructible<S> &&
                          requires(S& s, const S& cs, int64_t epoch, const nlohmann::json& state) {
                            requires detail::optional_aggregate<std::decay_t<decltype(s.next())>>::value;
                            s.set_epoch(epoch);
                            { cs.state_dict() } -> std::convertible_to<nlohmann::json>;
                            s.load_state_dict(state);
                          };

/// HF's rule for a training stream: it trains for --max_steps optimizer steps, which must
/// be positive (else the loom: line of docs/errors.md).
inline void check_stream_max_steps(int64_t max_steps) {
  check(max_steps > 0,
        "the training dataset is a stream (an iterable dataset: no size()), so set --max_steps to a positive number "
        "of optimizer steps (HF's rule for a dataloader without a length); got --max_steps {}",
        max_steps);
}

/// The example type a stream yields.
template <IterableDataset S>
using stream_example_t = typename std::decay_t<decltype(std::declval<S&>().next())>::value_type;

namespace detail {
template <class S>
struct stream_batch_of {
  using type = stream_example_t<S>;
};
template <class S>
  requires requires(const S& s, const std::vector<stream_example_t<S>>& e) {
    { s.collate(e) } -> TensorAggregate;
  }
struct stream_batch_of<S> {
  using type = std::decay_t<decltype(std::declval<const S&>().collate(
      std::declval<const std::vector<stream_example_t<S>>&>()))>;
};
template <class D>
struct train_batch_of {
  using type = batch_t<D>;
};
template <class S>
  requires(!Dataset<S> && IterableDataset<S>)
struct train_batch_of<S> {
  using type = typename stream_batch_of<S>::type;
};

// Passes over up to `n` examples; how many there were.
template <IterableDataset S>
int64_t skip_examples(S& s, int64_t n) {
  if constexpr (requires { { s.skip(n) } -> std::convertible_to<int64_t>; }) {
    return n > 0 ? static_cast<int64_t>(s.skip(n)) : 0;
  } else {
    int64_t k = 0;
    while (k < n && s.next()) ++k;
    return k;
  }
}

// Appends examples to `out` until it holds `n` or the stream ends.
template <IterableDataset S>
void take_examples(S& s, int64_t n, std::vector<stream_example_t<S>>& out) {
  while (static_cast<int64_t>(out.size()) < n) {
    auto e = s.next();
    if (!e) return;
    out.push_back(std::move(*e));
  }
}
}  // namespace detail

/// The batch a stream's examples make: its collate()'s result, else the example type (stacked).
template <IterableDataset S>
using stream_batch_t = typename detail::stream_batch_of<S>::type;

/// The batch type of a training source: batch_t of a sized dataset, stream_batch_t of a stream.
template <class D>
using train_batch_t = typename detail::train_batch_of<D>::type;

/// The next batch of rank `rank` of `world` from `stream` in epoch `epoch` (the chunk rule at
/// the top of this file); nullopt when the stream has no more batch for this epoch.
template <IterableDataset S>
std::optional<stream_batch_t<S>> read_shard(S& stream, int64_t epoch, int64_t batch_size, int64_t rank,
                                            int64_t world, bool drop_last) {
  const int64_t chunk = world * batch_size;
  std::vector<stream_example_t<S>> mine;
  mine.reserve(static_cast<std::size_t>(batch_size));
  const int64_t before = detail::skip_examples(stream, rank * batch_size);
  if (before == rank * batch_size) detail::take_examples(stream, batch_size, mine);
  const auto own = static_cast<int64_t>(mine.size());
  const int64_t after = own == batch_size ? detail::skip_examples(stream, chunk - (rank + 1) * batch_size) : 0;
  const int64_t in_chunk = before + own + after;
  if (in_chunk == 0 || (in_chunk < chunk && drop_last)) return std::nullopt;
  if (in_chunk < chunk && world > 1 && own < batch_size) {
    // Positions in_chunk, in_chunk + 1, ... are the epoch's first chunk again, cyclically
    // (its first examples when it is this short chunk). Read from the epoch's start, then
    // seek back to the end, so the next read finds the stream ended.
    const nlohmann::json end = stream.state_dict();
    stream.set_epoch(epoch);
    std::vector<stream_example_t<S>> first;
    detail::take_examples(stream, chunk, first);
    check(!first.empty(), "the stream yields no example after set_epoch({}) although it did before", epoch);
    for (int64_t p = rank * batch_size + own; p < (rank + 1) * batch_size; ++p)
      mine.push_back(first[static_cast<std::size_t>((p - in_chunk) % static_cast<int64_t>(first.size()))]);
    stream.load_state_dict(end);
  }
  if constexpr (requires { stream.collate(mine); }) return stream.collate(mine);
  else return collate(mine);
}

/// A type-erased stream yielding batches of `Batch`. Copies are independent streams (each a
/// copy of the stream as it stood).
template <TensorAggregate Batch>
class AnyStream {
 public:
  AnyStream() = default;
  /// Takes `stream` (moved).
  template <class S>
    requires(!std::same_as<S, AnyStream> && IterableDataset<S> && std::same_as<stream_batch_t<S>, Batch>)
  explicit AnyStream(S stream) : impl_(std::make_unique<Impl<S>>(std::move(stream))) {}
  AnyStream(const AnyStream& other) : impl_(other.impl_ ? other.impl_->clone() : nullptr) {}
  AnyStream& operator=(const AnyStream& other) {
    if (this != &other) impl_ = other.impl_ ? other.impl_->clone() : nullptr;
    return *this;
  }
  AnyStream(AnyStream&&) noexcept = default;
  AnyStream& operator=(AnyStream&&) noexcept = default;

  /// True when a stream is held.
  [[nodiscard]] explicit operator bool() const { return impl_ != nullptr; }
  /// Back to the start of `epoch`.
  void set_epoch(int64_t epoch) { impl_->set_epoch(epoch); }
  /// read_shard() on the held stream.
  [[nodiscard]] std::optional<Batch> read(int64_t epoch, int64_t batch_size, int64_t rank, int64_t world,
                                          bool drop_last) {
    return impl_->read(epoch, batch_size, rank, world, drop_last);
  }
  /// The stream's position.
  [[nodiscard]] nlohmann::json state_dict() const { return impl_->state_dict(); }
  /// Seeks to a position state_dict() returned.
  void load_state_dict(const nlohmann::json& state) { impl_->load_state_dict(state); }

 private:
  struct Base {
    virtual ~Base() = default;
    virtual std::unique_ptr<Base> clone() const = 0;
    virtual void set_epoch(int64_t epoch) = 0;
    virtual std::optional<Batch> read(int64_t epoch, int64_t batch_size, int64_t rank, int64_t world, bool drop_last) = 0;
    virtual nlohmann::json state_dict() const = 0;
    virtual void load_state_dict(const nlohmann::json& state) = 0;
  };
  template <class S>
  struct Impl final : Base {
    explicit Impl(S s) : stream(std::move(s)) {}
    std::unique_ptr<Base> clone() const override { return std::make_unique<Impl>(stream); }
    void set_epoch(int64_t epoch) override { stream.set_epoch(epoch); }
    std::optional<Batch> read(int64_t epoch, int64_t batch_size, int64_t rank, int64_t world, bool drop_last) override {
      return read_shard(stream, epoch, batch_size, rank, world, drop_last);
    }
    nlohmann::json state_dict() const override { return nlohmann::json(stream.state_dict()); }
    void load_state_dict(const nlohmann::json& state) override { stream.load_state_dict(state); }
    S stream;
  };
  std::unique_ptr<Base> impl_;
};

/// A stream of the examples a function makes: `fn(epoch, i)` returns example i of `epoch`, or
/// nullopt where the epoch ends. Its position is the index of the next example, so a resumed
/// run calls fn from there, and fn may be a generator as long as it is a function of (epoch, i)
/// (draw from a generator seeded on them).
template <class F>
  requires requires(const F& f, int64_t e, int64_t i) {
    requires detail::optional_aggregate<std::decay_t<decltype(f(e, i))>>::value;
  }
class GeneratorStream {
 public:
  /// The stream of `fn`'s examples.
  explicit GeneratorStream(F fn) : fn_(std::move(fn)) {}
  /// The next example (nullopt once the epoch has ended).
  auto next() {
    auto e = ended_ ? decltype(fn_(epoch_, index_))() : fn_(epoch_, index_);
    if (e) ++index_;
    else ended_ = true;
    return e;
  }
  /// Back to example 0 of `epoch`.
  void set_epoch(int64_t epoch) {
    epoch_ = epoch;
    index_ = 0;
    ended_ = false;
  }
  /// {"epoch", "index", "ended"}.
  [[nodiscard]] nlohmann::json state_dict() const { return {{"epoch", epoch_}, {"index", index_}, {"ended", ended_}}; }
  /// Seeks to a state_dict().
  void load_state_dict(const nlohmann::json& state) {
    check(state.is_object() && state.contains("epoch") && state.contains("index") && state.contains("ended"),
          "a GeneratorStream state needs epoch, index and ended; got {}", state.dump());
    epoch_ = state.at("epoch").get<int64_t>();
    index_ = state.at("index").get<int64_t>();
    ended_ = state.at("ended").get<bool>();
  }

 private:
  F fn_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  bool ended_ = false;
};

/// The stream of `fn(epoch, i)`'s examples (GeneratorStream).
template <class F>
GeneratorStream<F> from_generator(F fn) {
  return GeneratorStream<F>(std::move(fn));
}

}  // namespace loom::data
