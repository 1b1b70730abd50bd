#pragma once
// loom::Trainer: the one training loop, and the only place where policies meet.
//
//   struct MyTrainer : loom::Trainer<MyTrainer, Net, loom::schedule::Cosine> {
//     using Trainer::Trainer;
//     torch::Tensor compute_loss(Net& model, Batch& batch) { ... }
//   };
//
// This file is the front end: the hooks (found by CRTP, called only through call_hook,
// trainer/hooks.hpp) and the loops that depend on the batch and model types. The loop follows
// transformers.Trainer._inner_training_loop; docs/semantics.md lists where loom differs. The
// work that does not depend on those types is done by components, each owning its state and
// its part of a checkpoint:
//   accelerator.hpp     the parts a step needs, public for hand-written loops (HF's Accelerate):
//                       engine, precision, optimizer step, checkpointer, the run's state
//   startup.hpp         arguments against policies, world, device, process group
//   loop_state.hpp      the run's plan and the loop's loss totals (loop_state.json)
//   optimizer_step.hpp  optimizer sharding and unscale -> clip -> step -> skip bookkeeping
//   checkpointer.hpp    the checkpoint format: save, resume, resharding
//   evaluation.hpp      evaluation sums and the cross-rank gather in batch order
//   best_model.hpp      metric_for_best_model tracking
//   run_files.hpp       save_metrics / save_state
//   preemption.hpp      SIGTERM/SIGUSR1/SIGINT: stop at an agreed step, save, throw Preempted
// and the sharding engine behind dist::Engine (distributed/engine.hpp).

#include <loom/callbacks/default_flow.hpp>
#include <loom/checkpoint/folders.hpp>
#include <loom/callbacks/progress.hpp>
#include <loom/config/json.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/prefetch.hpp>
#include <loom/data/dataset.hpp>
#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/metrics/speed.hpp>
#include <loom/core/neftune.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/optim/param_groups.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/precision/bf16.hpp>
#include <loom/precision/fp16.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/schedule/from_args.hpp>
#include <loom/accelerate/accelerator.hpp>
#include <loom/trainer/batch_size_finder.hpp>
#include <loom/trainer/best_model.hpp>
#include <loom/accelerate/evaluation.hpp>
#include <loom/trainer/events.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/trainer/label_smoother.hpp>
#include <loom/accelerate/loop_state.hpp>
#include <loom/trainer/preemption.hpp>
#include <loom/trainer/report_to.hpp>
#include <loom/trainer/run_files.hpp>
#include <loom/trainer/trainer_types.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

/// The Trainer. Derived: your subclass (CRTP) or void; Model: a torch::nn module holder;
/// Policies: tags from loom::sharding, loom::precision, loom::schedule, loom::Callbacks<...>.
template <class Derived, class Model, class... Policies>
class Trainer {
 public:
  using policies = PolicyBundle<Policies...>;
  using sharding_policy = typename policies::sharding;
  using precision_policy = typename policies::precision;
  using schedule_policy = typename policies::schedule;
  using scheduler_type = schedule::LRScheduler<schedule_policy>;
  using callbacks_type = typename detail::callback_set<typename policies::callbacks>::type;

  using precision_type = precision::PrecisionImpl<precision_policy>;
  /// This base class, as the hooks' dispatch calls the defaults (`self.loom_trainer::name`).
  using loom_trainer = Trainer;
  /// The parts the Trainer is built from (accelerate/accelerator.hpp): accelerator().
  using accelerator_type = Accelerator<sharding_policy, precision_policy>;
  /// What set_preprocess_logits_for_metrics takes: (logits, labels) -> the tensor kept.
  using PreprocessLogitsFn = std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& labels)>;

  /// A trainer without datasets: evaluate(dataset) and predict(dataset) only.
  Trainer(TrainingArguments args, Model model) : args_(std::move(args)), model_(std::move(model)) {
    init(no_train_dataset);
  }
  /// A trainer with a training dataset (or a stream: an iterable dataset, data/iterable.hpp,
  /// which trains with --max_steps; or loom::no_train_dataset).
  template <detail::TrainSource Train>
  Trainer(TrainingArguments args, Model model, Train train_dataset)
      : args_(std::move(args)), model_(std::move(model)) {
    init(std::move(train_dataset));
  }
  /// A trainer with a training dataset (or loom::no_train_dataset) and an evaluation dataset.
  template <detail::TrainSource Train, data::Dataset Eval>
  Trainer(TrainingArguments args, Model model, Train train_dataset, Eval eval_dataset)
      : args_(std::move(args)), model_(std::move(model)) {
    add_eval_dataset("", std::move(eval_dataset));
    init(std::move(train_dataset));
  }
  /// A trainer with a training dataset (or loom::no_train_dataset) and several named
  /// evaluation datasets, evaluated in their order.
  template <detail::TrainSource Train, data::Dataset Eval>
  Trainer(TrainingArguments args, Model model, Train train_dataset, EvalDatasets<Eval> eval_datasets);

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // ---- hooks: override in the subclass; call these as Trainer::name(...) for the default ---

  /// Loss of one batch: the model's forward(batch), a tensor or an aggregate with `loss`.
  /// With --label_smoothing_factor and a defined `labels` field, HF's rule: the model runs on
  /// the batch without its labels and the loss is label_smoothed_loss of its logits (labels
  /// shifted when the model declares `static constexpr bool is_causal_lm = true`).
  template <class Batch>
  auto compute_loss(Model& model, Batch& batch);

  /// Forward and backward of one micro-batch; the loss is divided by `loss_divisor`: the group's
  /// items over the micro-batch's, as HF divides, or 1 when the model divides its summed loss by
  /// HF's num_items_in_batch itself (model_divides_by_items). Returns the divided loss, detached.
  template <class Batch>
  torch::Tensor training_step(Model& model, Batch& batch, double loss_divisor);

  /// Backpropagates `loss` through the precision policy (fp16: the scaled loss). Call this
  /// instead of loss.backward() in a training_step override: the sharding engine sees the
  /// loss first (--ddp_find_unused_parameters).
  void backward(const torch::Tensor& loss) { acc_->backward(loss); }

  /// Items a batch contributes to the loss normalization: a CausalLMBatch's predicted tokens
  /// (data::predicted_tokens, HF's num_items_in_batch), else its rows.
  template <class Batch>
  int64_t num_items(const Batch& batch) { return detail::default_num_items(batch); }

  /// Floating-point operations of one training micro-batch, summed into total_flos: the
  /// model's `floating_point_ops(batch)` when it has one, else 0 (unknown).
  template <class Batch>
  double floating_point_ops(const Batch& batch);

  /// Loss, logits and labels of one evaluation batch (labels: the batch fields --label_names
  /// names, `labels` by default; with several, `all_labels` holds each, as HF's tuple). The
  /// batch has labels when every one of those fields is defined (HF's has_labels). On a batch
  /// without labels (a test set given to predict()) compute_loss may return a ModelOutput
  /// without a loss: there is then no loss.
  template <class Batch>
  PredictionOutput prediction_step(Model& model, Batch& batch);

  /// The --optim rule (with --optim_args) over HF's decay / no-decay parameter groups. An
  /// override may return its own groups (each with its own lr and weight decay) or any
  /// torch::optim::Optimizer through optim::Optimizer::wrap.
  optim::Optimizer create_optimizer() { return optim::make_optimizer(args_, detail::module_of(model_)); }

  /// The schedule policy's scheduler over `num_training_steps` optimizer steps.
  scheduler_type create_scheduler(int64_t num_training_steps);

  /// Training batches: seeded shuffle (data_seed, else seed), per_device_train_batch_size;
  /// --train_sampling_strategy sequential reads in order, group_by_length groups by length
  /// (HF's LengthGroupedSampler over per_device_train_batch_size x gradient_accumulation_steps).
  /// A training stream (an iterable dataset) is read in its own order, each rank its slice
  /// (data/iterable.hpp).
  template <class Batch = void>
  auto get_train_dataloader();

  /// Batches of an evaluation dataset: in order, per_device_eval_batch_size, nothing dropped.
  template <class Batch>
  data::DataLoader<Batch> get_eval_dataloader(const data::AnyDataset<Batch>& dataset) {
    return data::DataLoader<Batch>(dataset, args_.per_device_eval_batch_size, false, data::SequentialSampler{});
  }

  /// Batches of a dataset given to predict(): in order, per_device_eval_batch_size.
  template <class Batch>
  data::DataLoader<Batch> get_test_dataloader(const data::AnyDataset<Batch>& dataset) {
    return data::DataLoader<Batch>(dataset, args_.per_device_eval_batch_size, false, data::SequentialSampler{});
  }

  /// Records `logs` (plus epoch, step, and num_input_tokens_seen when counted) in
  /// log_history and fires on_log.
  void log(const Metrics& logs);

  /// Metrics from the concatenated predictions (default: none).
  Metrics compute_metrics(const EvalPrediction&) { return {}; }
  /// HF's compute_metrics(eval_pred, compute_result): with --batch_eval_metrics, once per batch
  /// (per round of W gathered batches), compute_result true on the last, whose metrics are the
  /// evaluation's (docs/semantics.md). Declared alone, it also serves the whole-set call.
  Metrics compute_metrics(const EvalPrediction&, bool /*compute_result*/) { return {}; }

  /// HF's preprocess_logits_for_metrics: one evaluation batch's (logits, first label field) to
  /// the tensor kept instead of the logits (an argmax: [N, T] ids, not [N, T, vocab]), per batch
  /// before batches are joined; its dim 0 must be the batch's rows. Default: the function of
  /// set_preprocess_logits_for_metrics, else the logits.
  torch::Tensor preprocess_logits_for_metrics(const torch::Tensor& logits, const torch::Tensor& labels) {
    return preprocess_logits_ ? preprocess_logits_(logits, labels) : logits;
  }
  /// The function the default preprocess_logits_for_metrics applies (HF's Trainer argument of
  /// that name, given here at run time); an empty function switches it off.
  void set_preprocess_logits_for_metrics(PreprocessLogitsFn fn) { preprocess_logits_ = std::move(fn); }

  // ---- entry points -------------------------------------------------------------------

  /// Runs the training loop; writes trainer_state.json and *_results.json to output_dir.
  /// With --auto_find_batch_size, again from the start with a smaller batch after an
  /// out-of-memory error (trainer/batch_size_finder.hpp).
  TrainOutput train() {
    const detail::NeftuneScope neftune(args_, model_);
    if (!args_.auto_find_batch_size) return train_impl<batch_type<>>();
    BatchSizeFinder finder(args_, acc_->resume_dir(), detail::module_of(model_));
    for (;;) {
      try {
        return train_impl<batch_type<>>();
      } catch (...) {
        if (!finder.retry(std::current_exception())) throw;
      }
    }
  }

  /// Evaluates on the Trainer's evaluation dataset; metrics are named `<metric_key_prefix>_<name>`.
  /// With several named sets (EvalDatasets), each in turn, as `<metric_key_prefix>_<set>_<name>`.
  Metrics evaluate(const std::string& metric_key_prefix = "eval");

  /// Evaluates on `dataset` instead of the Trainer's (HF's evaluate(eval_dataset=...)).
  template <data::Dataset D>
  Metrics evaluate(D dataset, const std::string& metric_key_prefix = "eval");

  /// Evaluates on each of `datasets` in turn, as `<metric_key_prefix>_<set>_<name>`.
  template <data::Dataset D>
  Metrics evaluate(EvalDatasets<D> datasets, const std::string& metric_key_prefix = "eval");

  /// Predictions, label ids and `test_`-prefixed metrics on `test_dataset` (HF's predict);
  /// fires on_predict, logs nothing.
  /// A dataset without labels (a `labels` field left undefined) gives predictions only.
  template <data::Dataset D>
  PredictResult predict(D test_dataset, const std::string& metric_key_prefix = "test");

  /// Writes `<split>_results.json` and merges the metrics into `all_results.json` (HF's save_metrics).
  void save_metrics(const std::string& split, const Metrics& metrics) const {
    if (acc_->state().is_world_process_zero) detail::save_metrics(args_.output_dir, split, metrics);
  }

  /// Writes trainer_state.json to output_dir (HF's save_state).
  void save_state() const {
    if (acc_->state().is_world_process_zero) detail::save_trainer_state(args_.output_dir, acc_->state());
  }

  /// Writes the model to `output_dir` (default: --output_dir): model.safetensors (every
  /// parameter and buffer, gathered from every rank under a sharding policy),
  /// training_args.json, config.json (a loom model's hf_config(), or a reflectable `config`
  /// member) and the tokenizer files (set_tokenizer_files), so transformers opens the folder;
  /// every checkpoint-N holds the same. A model training a LoRA adapter writes PEFT's
  /// adapter_config.json and adapter_model.safetensors instead of the weights and config.json.
  /// Every rank must call it (the gather is a collective); rank 0 writes (HF's save_model).
  void save_model(std::optional<std::string> output_dir = std::nullopt);
  /// A model training a LoRA adapter, merged into a plain model folder (default:
  /// <output_dir>/merged) that transformers opens; training may go on. Every rank calls it.
  void save_merged_model(std::optional<std::string> output_dir = std::nullopt);
  /// Files copied into save_model's folder and every checkpoint (tokenizer.json,
  /// tokenizer_config.json), as HF's Trainer saves its processing_class.
  void set_tokenizer_files(std::vector<std::filesystem::path> files) {
    for (const auto& f : files) check_path(f, PathKind::file, "a tokenizer file saved with the model");
    tokenizer_files_ = std::move(files);
    acc_->set_model_files(model_config_json(), tokenizer_files_);
  }

  /// Prints `metrics` as HF's log_metrics does ("***** <split> metrics *****", then one
  /// aligned line per metric, sorted, formatted by metrics_format), on world process zero.
  void log_metrics(const std::string& split, const Metrics& metrics) const {
    if (acc_->state().is_world_process_zero) std::fputs(format_metrics_report(split, metrics).c_str(), stdout);
  }
  /// The metrics as HF's metrics_format shows them: memory in MB, runtimes as h:mm:ss.cc,
  /// total_flos in GF, other values rounded to 4 digits.
  [[nodiscard]] static std::vector<std::pair<std::string, std::string>> metrics_format(const Metrics& metrics) {
    return loom::metrics_format(metrics);
  }

  // ---- access ---------------------------------------------------------------------------

  /// The arguments (validated and finalized).
  [[nodiscard]] const TrainingArguments& args() const { return args_; }
  /// The model.
  [[nodiscard]] Model& model() { return model_; }
  /// The run's state.
  [[nodiscard]] const TrainerState& state() const { return acc_->state(); }
  /// The control flags.
  [[nodiscard]] TrainerControl& control() { return control_; }
  /// The device the model lives on.
  [[nodiscard]] const torch::Device& device() const { return acc_->device(); }
  /// True on the process of global rank 0 (the one that writes shared files).
  [[nodiscard]] bool is_world_process_zero() const { return acc_->state().is_world_process_zero; }
  /// True on the process of local rank 0 of each node.
  [[nodiscard]] bool is_local_process_zero() const { return acc_->state().is_local_process_zero; }
  /// Examples in a data loader's dataset (HF's num_examples).
  template <class Batch>
  [[nodiscard]] int64_t num_examples(const data::DataLoader<Batch>& loader) const {
    return loader.num_examples();
  }
  /// The batch field that is the model's main input (HF's main_input_name): the model's
  /// `main_input_name` when it declares one, else "input_ids".
  [[nodiscard]] std::string_view main_input_name() const {
    using Impl = std::decay_t<decltype(*model_)>;
    if constexpr (requires { std::string_view(Impl::main_input_name); }) return Impl::main_input_name;
    else return "input_ids";
  }
  /// The main input of `batch`: its main_input_name field, else (a batch without one, e.g.
  /// {x, labels}) its first field. What include_for_metrics inputs keeps and
  /// include_num_input_tokens_seen counts.
  template <class Batch>
  [[nodiscard]] const torch::Tensor& main_input(const Batch& batch) const {
    if (const torch::Tensor* t = data::field_named(batch, main_input_name())) return *t;
    return boost::pfr::get<0>(batch);
  }
  /// The batch fields that hold the labels (--label_names; default `labels`).
  [[nodiscard]] const std::vector<std::string>& label_names() const { return label_names_; }
  /// The callback of type `Cb` (from the Callbacks<...> pack or a built-in).
  template <class Cb>
  Cb& callback() {
    return callbacks_.template get<Cb>();
  }

  // ---- run-time callbacks (HF's add_callback / pop_callback / remove_callback) -----------

  /// Adds a run-time callback, called after the compiled ones, in the order added.
  void add_callback(std::shared_ptr<TrainerCallback> cb) { callbacks_.add(std::move(cb)); }
  /// Adds a default-constructed `Cb` (a TrainerCallback subclass); for a compiled callback
  /// type, switches it back on.
  template <class Cb>
  void add_callback();
  /// Removes and returns the first run-time callback of type `Cb` (null when there is none).
  template <class Cb>
  std::shared_ptr<Cb> pop_callback();
  /// Removes `cb` and returns it (null when it is not there).
  std::shared_ptr<TrainerCallback> pop_callback(const std::shared_ptr<TrainerCallback>& cb) {
    return callbacks_.pop_if([&](const std::shared_ptr<TrainerCallback>& c) { return c == cb; });
  }
  /// Removes the first run-time callback of type `Cb`; for a compiled callback type (e.g.
  /// ProgressCallback, the printer) switches it off.
  template <class Cb>
  void remove_callback();
  /// Removes `cb`.
  void remove_callback(const std::shared_ptr<TrainerCallback>& cb) { (void)pop_callback(cb); }
  /// The run-time callbacks, in call order.
  [[nodiscard]] const std::vector<std::shared_ptr<TrainerCallback>>& runtime_callbacks() const {
    return callbacks_.dynamic();
  }
  /// What callbacks receive as HF's keyword arguments, as of now.
  [[nodiscard]] const CallbackArgs& callback_args() const { return kwargs_; }
  /// The precision policy's state (fp16: the loss scaler).
  [[nodiscard]] precision_type& precision() { return acc_->precision(); }
  /// Optimizer steps the fp16 scaler skipped in the last train().
  [[nodiscard]] int64_t skipped_steps() const { return acc_->skipped_steps(); }
  /// This process's place in the job (torchrun's environment; one process without it).
  [[nodiscard]] const dist::World& world() const { return acc_->world(); }
  /// The sharding engine (its process group: sharding().comm(), null for NoShard).
  [[nodiscard]] dist::Engine& sharding() { return acc_->sharding(); }
  /// Bytes of parameters, gradients and optimizer state here after the last train()'s first step.
  [[nodiscard]] const dist::StateBytes& model_state_bytes() const { return acc_->model_state_bytes(); }
  /// The memory plan printed at start-up (docs/distributed.md "Memory plan"); none before the model is prepared.
  [[nodiscard]] const std::optional<MemoryPlan>& memory_plan() const { return acc_->memory_plan(); }
  /// The optimizer (after train() created it).
  [[nodiscard]] optim::Optimizer& optimizer() { return acc_->optimizer(); }
  [[nodiscard]] accelerator_type& accelerator() { return *acc_; }  ///< engine, precision, steps, checkpoints (HF's)

 protected:
  /// The object hooks are called on: the subclass, or this Trainer when Derived is void.
  auto& self() {
    if constexpr (std::is_void_v<Derived>) return *this;
    else return static_cast<Derived&>(*this);
  }

 private:
  using Self = std::conditional_t<std::is_void_v<Derived>, Trainer, Derived>;
  using datasets_type = detail::Datasets<Self, Model>;
  // Lazily evaluated so Derived is complete; the parameter only delays instantiation.
  template <class Delay = void>
  using batch_type = typename detail::batch_type_of<std::conditional_t<true, Self, Delay>, Model>::type;

  static_assert(precision::PrecisionPolicy<precision_type>,
                "loom: the precision policy's PrecisionImpl does not provide the PrecisionPolicy interface");
  static_assert(requires { std::string_view(schedule_policy::name); },
                "loom: a schedule tag needs `static constexpr std::string_view name` (what --lr_scheduler_type "
                "and training_args.json call it)");

  template <class Eval>
  void add_eval_dataset(std::string name, Eval dataset);

  template <class Train>
  void init(Train train_dataset);

  // --report_to: the built-in loggers it names, as run-time callbacks (once: not when the
  // Trainer's Callbacks<...> compiles them in).
  void add_reporters();

  // Every --label_names entry is a field of the batch (a typo would silently drop the labels).
  template <class Batch>
  void check_label_names() const;

  // The training loop (HF's _inner_training_loop), in trainer/training_loop.hpp.
  template <class Batch>
  TrainOutput train_impl();

  [[nodiscard]] bool model_divides_by_items() const;  // HF's rule: who divides (trainer_steps.hpp)

  // Fires `Event` on every callback with HF's keyword arguments (and the event's extra).
  template <class Event, class... X>
  void fire(const X&... x);

  // The stateful callbacks' states and the TrainerControl flags, as trainer_state.json keeps them.
  void record_callback_states();

  // Input tokens of a training batch (include_num_input_tokens_seen): the attention_mask's
  // sum for non_padding when the batch has one, else the main input's elements (HF's rule).
  template <class Batch>
  int64_t input_tokens(const Batch& batch) const;

  // Adds the tokens counted since the last call, summed over ranks, to num_input_tokens_seen.
  // Called on logging, evaluation and saving steps and at the end (the same steps on every
  // rank), so counting costs no host-device sync on other steps.
  void sync_tokens();

  template <class Batch>
  void maybe_log_save_evaluate(const torch::Tensor& grad_norm, double lr);

  // checkpoint-<global_step>, then on_save.
  void save_checkpoint();

  // The end of a run stopped by a signal: a checkpoint of this step (unless one was just
  // saved), on_save, on_train_end, trainer_state.json, then loom::Preempted.
  [[noreturn]] void stop_for_preemption(int signal);

  // HF's _evaluate: after an evaluation in training, ReduceLROnPlateau steps with
  // metric_for_best_model (prefixed eval_) from the metrics of every evaluation set.
  void step_plateau(const Metrics& metrics);

  // One evaluation of one dataset (HF's evaluate on a single set).
  template <class Batch>
  Metrics evaluate_impl(const data::AnyDataset<Batch>& dataset, const std::string& prefix);

  // TrainingArguments' dataloader_* flags (pinned memory only helps copies to a GPU).
  [[nodiscard]] data::PrefetchOptions prefetch_options() const;

  // HF's evaluation_loop over this rank's batches (evaluation.hpp does the sums and the
  // gather). When every forward is a collective (FullShard), a rank without a batch in the
  // last round runs a discarded forward.
  // `predicting`: predict() keeps every batch's outputs also under --batch_eval_metrics (HF's
  // "Prediction" loop), as it returns them.
  template <class Batch>
  PredictResult evaluation_loop(data::DataLoader<Batch>& loader, const std::string& prefix, bool predicting = false);

  // config.json of save_model and the checkpoints (model_config_json) and the tokenizer's files.
  [[nodiscard]] nlohmann::json model_config_json() const;

  TrainingArguments args_;
  Model model_;
  std::vector<std::filesystem::path> tokenizer_files_;
  TrainerControl control_;
  callbacks_type callbacks_;
  std::unique_ptr<datasets_type> data_;
  std::optional<scheduler_type> scheduler_;
  BestModel best_{args_};
  bool in_train_ = false;
  int64_t last_saved_step_ = -1;  // global_step of the last checkpoint this run saved
  CallbackArgs kwargs_;                 // what callbacks get as HF's keyword arguments
  std::vector<std::string> label_names_;  // --label_names as a list
  std::shared_ptr<const std::vector<int64_t>> train_lengths_;  // group_by_length: each training example's length
  int64_t tokens_pending_ = 0;            // input tokens counted on this rank since the last sync_tokens
  torch::Tensor num_items_in_batch_;      // the open accumulation group's count when the model divides by it
  int64_t tokens_at_start_ = 0;           // num_input_tokens_seen when this train() began (resumed runs)
  std::chrono::steady_clock::time_point train_start_{};
  LoaderInfo train_loader_info_, eval_loader_info_;
  PreprocessLogitsFn preprocess_logits_;  // set_preprocess_logits_for_metrics
  // The job's parts (accelerate/accelerator.hpp), reached through their public API only. Last, so
  // it goes first: its engine unhooks the model's parameters while model_ lives.
  std::optional<accelerator_type> acc_;
};

/// A Trainer with no overrides.
template <class Model, class... Policies>
using DefaultTrainer = Trainer<void, Model, Policies...>;

}  // namespace loom

// The member functions defined out of line: trainer_steps.hpp, and the training loop.
#include <loom/trainer/trainer_steps.hpp>
#include <loom/trainer/training_loop.hpp>
