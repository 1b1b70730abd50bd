#pragma once
// What the Trainer's signature and members name, apart from the class itself: the dataset
// arguments (NoTrainDataset, EvalDatasets), TrainOutput, the typed dataset holder, and the
// helpers its constructor uses (the callback pack with the built-in callbacks, the module of
// a model holder, group_by_length's example lengths).

#include <loom/callbacks/default_flow.hpp>
#include <loom/callbacks/progress.hpp>
#include <loom/core/error.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/neftune.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/iterable.hpp>
#include <loom/data/text.hpp>
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

/// A model that estimates one micro-batch's saved activations for the memory plan:
/// activation_bytes(batch, seq, bytes_per_element, recompute) (loom::models' GPT-2, BERT, Llama).
template <class Model>
concept EstimatesActivations = requires(Model& model, int64_t n, bool recompute) {
  { model->activation_bytes(n, n, n, recompute) } -> std::convertible_to<double>;
};

/// The sequence length of the memory plan's activation estimate.
struct TrainSequenceLength {
  int64_t tokens = 0;
  bool longest = false;  ///< the longest row a batch can have (ragged data), not every batch's length
};

/// The training sequence length a dataset states: its block_size() (token-file windows), else
/// its max_sequence_length() (ragged examples padded per batch, instruction data), else none.
template <class Train>
std::optional<TrainSequenceLength> train_sequence_length(const Train& train) {
  if constexpr (requires { { train.block_size() } -> std::convertible_to<int64_t>; }) {
    return TrainSequenceLength{train.block_size(), false};
  } else if constexpr (requires { { train.max_sequence_length() } -> std::convertible_to<int64_t>; }) {
    const int64_t n = train.max_sequence_length();
    if (n > 0) return TrainSequenceLength{n, true};
    return std::nullopt;
  } else {
    return std::nullopt;
  }
}

template <class Model>
torch::nn::Module& module_of(Model& model) {
  if constexpr (requires { model.ptr(); }) return *model.ptr();
  else return *model;
}

// The model's module declares `accepts_num_items_in_batch` (HF's model_accepts_loss_kwargs):
// its loss divides by the num_items_in_batch a training forward hands it (forward_request()).
template <class Model>
consteval bool accepts_num_items_in_batch() {
  if constexpr (requires(Model& m) { *m; }) {
    using Impl = std::decay_t<decltype(*std::declval<Model&>())>;
    if constexpr (requires { bool(Impl::accepts_num_items_in_batch); }) return bool(Impl::accepts_num_items_in_batch);
    else return false;
  } else {
    return false;
  }
}

// The Trainer's default num_items: a causal-LM batch's predicted tokens, else its rows.
template <class Batch>
int64_t default_num_items(const Batch& batch) {
  if constexpr (std::is_same_v<Batch, data::CausalLMBatch>) return data::predicted_tokens(batch);
  else return data::batch_rows(batch);
}

// --bf16_full_eval / --fp16_full_eval: casts `module` to `dtype` (parameters and floating
// buffers) for the scope; each tensor gets its own storage back when it ends (also on an
// error), so the parameters are the optimizer's again, and views into a sharding engine's
// buffers are views again.
struct CastForEvaluation {
  CastForEvaluation(torch::nn::Module& module, torch::ScalarType dtype) {
    for (auto& p : module.parameters()) kept_.emplace_back(p, p.data());
    for (auto& b : module.buffers()) kept_.emplace_back(b, b.data());
    module.to(dtype);
  }
  ~CastForEvaluation() {
    for (auto& [tensor, data] : kept_) tensor.set_data(data);
  }
  CastForEvaluation(const CastForEvaluation&) = delete;
  CastForEvaluation& operator=(const CastForEvaluation&) = delete;

 private:
  std::vector<std::pair<torch::Tensor, torch::Tensor>> kept_;  // (tensor, its data before the cast)
};

// --neftune_noise_alpha for the length of train() (HF activates NEFTune in train() and
// deactivates it when training ends); nothing for a model without NEFTune.
template <class Model>
struct NeftuneScope {
  NeftuneScope(const TrainingArguments& args, Model& model) {
    if constexpr (ExposesNEFTune<Model>) {
      if (args.neftune_noise_alpha) {
        noise = &neftune_of(model);
        noise->noise_alpha = *args.neftune_noise_alpha;
      }
    }
  }
  NeftuneScope(const NeftuneScope&) = delete;
  NeftuneScope& operator=(const NeftuneScope&) = delete;
  ~NeftuneScope() {
    if (noise) noise->noise_alpha = 0;
  }
  NEFTune* noise = nullptr;
};

// The datasets of a Trainer, typed by its batch type. Named (not instantiated) in the class
// body, where Derived is still incomplete; instantiated in the member functions. `eval`: the
// evaluation sets in order, by name ("" for a single unnamed set).
template <class Self, class Model>
struct Datasets {
  using Batch = typename batch_type_of<Self, Model>::type;
  std::optional<data::AnyDataset<Batch>> train;
  std::optional<data::AnyStream<Batch>> train_stream;  // a training stream (iterable dataset) instead
  std::vector<std::pair<std::string, data::AnyDataset<Batch>>> eval;
};

template <class T>
concept TrainSource = data::Dataset<T> || data::IterableDataset<T> || std::is_same_v<T, NoTrainDataset>;

}  // namespace detail

}  // namespace loom
