#pragma once
// What the Trainer's signature and members name, apart from the class itself: the dataset
// arguments (NoTrainDataset, EvalDatasets), TrainOutput, the typed dataset holder, and the
// helpers its constructor uses (the callback pack with the built-in callbacks, the module of
// a model holder, group_by_length's example lengths).

#include <loom/callbacks/default_flow.hpp>
#include <loom/callbacks/progress.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataset.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/trainer/events.hpp>
#include <loom/trainer/hooks.hpp>

#include <torch/torch.h>

#include <concepts>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

/// Given instead of a training dataset: a Trainer for evaluate() and predict() only (HF's
/// Trainer without train_dataset). train() then fails with a loom::Error.
struct NoTrainDataset {};
inline constexpr NoTrainDataset no_train_dataset{};

/// Several named evaluation datasets (HF's dict of eval datasets): each is evaluated in turn
/// and its metrics are named `eval_<name>_<metric>` (eval_<name>_loss, ...).
template <data::Dataset D>
using EvalDatasets = std::vector<std::pair<std::string, D>>;

/// What train() returns (HF's TrainOutput).
struct TrainOutput {
  int64_t global_step = 0;     ///< optimizer steps taken
  double training_loss = 0.0;  ///< mean loss over all steps
  Metrics metrics;             ///< train_runtime, train_samples_per_second, ...
};

namespace detail {

template <class Cbs>
struct callback_set;
template <class... Cbs>
struct callback_set<Callbacks<Cbs...>> {
  using type = CallbackSet<DefaultFlowCallback, ProgressCallback, Cbs...>;
};

template <class Model>
torch::nn::Module& module_of(Model& model) {
  if constexpr (requires { model.ptr(); }) return *model.ptr();
  else return *model;
}

// The datasets of a Trainer, typed by its batch type. Named (not instantiated) in the class
// body, where Derived is still incomplete; instantiated in the member functions. `eval`: the
// evaluation sets in order, by name ("" for a single unnamed set).
template <class Self, class Model>
struct Datasets {
  using Batch = typename batch_type_of<Self, Model>::type;
  std::optional<data::AnyDataset<Batch>> train;
  std::vector<std::pair<std::string, data::AnyDataset<Batch>>> eval;
};

template <class T>
concept TrainSource = data::Dataset<T> || std::is_same_v<T, NoTrainDataset>;

// Each example's length for group_by_length: the dataset's lengths() when it has one, else
// its `column` field (HF's length_column_name), read over the whole dataset.
template <data::Dataset D>
std::vector<int64_t> example_lengths(const D& dataset, const std::string& column) {
  std::vector<int64_t> out;
  const auto assign_from = [&out](const torch::Tensor& lengths) {
    const auto host = lengths.to(torch::kCPU, torch::kLong).reshape({-1}).contiguous();
    out.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  };
  if constexpr (requires { { dataset.lengths() } -> std::convertible_to<torch::Tensor>; }) {
    assign_from(dataset.lengths());  // a tensor of lengths (TokenSequenceDataset's)
  } else if constexpr (requires { dataset.lengths(); }) {
    for (auto len : dataset.lengths()) out.push_back(static_cast<int64_t>(len));
  } else {
    const int64_t n = dataset.size();
    std::vector<int64_t> all(static_cast<std::size_t>(n));
    for (int64_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    const auto batch = data::fetch(dataset, all);
    const torch::Tensor* field = data::field_named(batch, column);
    check(field != nullptr && field->defined(),
          "--train_sampling_strategy group_by_length needs each example's length: a lengths() member of the "
          "training dataset, or a field named {} (--length_column_name)", column);
    assign_from(*field);
  }
  check(static_cast<int64_t>(out.size()) == dataset.size(), "group_by_length: {} lengths for {} examples",
        out.size(), dataset.size());
  return out;
}

}  // namespace detail

}  // namespace loom
