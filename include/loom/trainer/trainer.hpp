#pragma once
// loom::Trainer: the one training loop, and the only place where policies meet.
//
//   struct MyTrainer : loom::Trainer<MyTrainer, Net, loom::schedule::Cosine> {
//     using Trainer::Trainer;
//     torch::Tensor compute_loss(Net& model, Batch& batch) { ... }
//   };
//
// Hooks are found by CRTP and called only through call_hook (trainer/hooks.hpp); events go
// to the callback pack through CallbackSet (trainer/events.hpp). The loop follows
// transformers.Trainer._inner_training_loop; docs/semantics.md lists where loom differs.

#include <loom/callbacks/default_flow.hpp>
#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/callbacks/progress.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/distributed/sharding.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/metrics/speed.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/optim/param_groups.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/precision/bf16.hpp>
#include <loom/precision/fp16.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/schedule/from_args.hpp>
#include <loom/trainer/events.hpp>
#include <loom/trainer/hooks.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <any>
#include <map>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <type_traits>
#include <vector>

namespace loom {

/// Seeds torch's CPU and CUDA generators (HF's set_seed).
inline void set_seed(int64_t seed) { torch::manual_seed(static_cast<uint64_t>(seed)); }

/// What predict() returns (HF's PredictionOutput).
struct PredictResult {
  torch::Tensor predictions;  ///< every batch's logits, concatenated (CPU)
  torch::Tensor label_ids;    ///< every batch's labels, concatenated (CPU)
  Metrics metrics;            ///< test_loss, test_<metric>, test_runtime, ...
};

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

// Writes `j` with sorted keys (as HF's json.dumps(sort_keys=True)) via a temporary file.
inline void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent) {
  const auto tmp = std::filesystem::path(path.string() + ".tmp");
  {
    std::ofstream out(tmp);
    check(static_cast<bool>(out), "cannot write {}", tmp.string());
    out << j.dump(indent) << '\n';
    check(static_cast<bool>(out), "cannot write {}", tmp.string());
  }
  std::filesystem::rename(tmp, path);
}

// The training losses since the last log. Each micro-step's loss stays a device scalar (no
// op, no sync); the window is summed on the host at the next logging step, where HF's
// logging_nan_inf_filter is applied in order: a nan/inf loss counts as the mean of the
// window so far, tr_loss / (1 + steps logged in the window).
class LossWindow {
 public:
  void add(const torch::Tensor& loss, int64_t steps_in_window) { items_.emplace_back(loss, steps_in_window); }
  /// Sums each step's loss over ranks before it is read (distributed runs; a collective,
  /// so every rank calls total() at the same points).
  void set_reducer(std::function<void(torch::Tensor&)> reduce) { reduce_ = std::move(reduce); }
  /// The window's total (one device-to-host copy).
  [[nodiscard]] double total(bool nan_filter) const {
    double tr = carry_;
    if (items_.empty()) return tr;
    std::vector<torch::Tensor> losses;
    losses.reserve(items_.size());
    for (const auto& [l, s] : items_) losses.push_back(l.reshape({}).to(torch::kFloat));
    auto stacked = torch::stack(losses);
    if (reduce_) reduce_(stacked);
    const auto host = stacked.to(torch::kDouble).cpu();
    const double* v = host.data_ptr<double>();
    for (std::size_t i = 0; i < items_.size(); ++i)
      tr += (!nan_filter || std::isfinite(v[i])) ? v[i] : tr / static_cast<double>(1 + items_[i].second);
    return tr;
  }
  /// Starts a new window holding `carry` (a checkpoint's unlogged total).
  void reset(double carry = 0.0) {
    carry_ = carry;
    items_.clear();
  }

 private:
  double carry_ = 0.0;
  std::vector<std::pair<torch::Tensor, int64_t>> items_;
  std::function<void(torch::Tensor&)> reduce_;
};

// Reads a JSON file; a missing or malformed file is a loom::Error naming it.
inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  check(!j.is_discarded(), "{} is not valid JSON", path.string());
  return j;
}

inline int64_t resolve_interval(double value, int64_t max_steps) {
  if (value > 0 && value < 1) return static_cast<int64_t>(std::ceil(value * static_cast<double>(max_steps)));
  return static_cast<int64_t>(value);
}

}  // namespace detail

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
  using sharding_type = dist::ShardingImpl<sharding_policy>;

  /// A trainer with a training dataset and, optionally, an evaluation dataset.
  template <data::Dataset Train>
  Trainer(TrainingArguments args, Model model, Train train_dataset)
      : args_(std::move(args)), model_(std::move(model)) {
    init(std::move(train_dataset));
  }
  /// A trainer with training and evaluation datasets.
  template <data::Dataset Train, data::Dataset Eval>
  Trainer(TrainingArguments args, Model model, Train train_dataset, Eval eval_dataset)
      : args_(std::move(args)), model_(std::move(model)) {
    using Batch = batch_type<Eval>;
    static_assert(std::is_same_v<data::batch_t<Eval>, Batch>,
                  "loom: the evaluation dataset yields another batch type than compute_loss takes");
    eval_data_ = data::AnyDataset<Batch>(std::move(eval_dataset));
    init(std::move(train_dataset));
  }

  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // ---- hooks: override in the subclass; call these as Trainer::name(...) for the default ---

  /// Loss of one batch: the model's forward(batch), a tensor or an aggregate with `loss`.
  template <class Batch>
  auto compute_loss(Model& model, Batch& batch) {
    if constexpr (requires { model->forward(batch); }) {
      using R = decltype(model->forward(batch));
      static_assert(LossResult<R>, "loom: the default compute_loss needs model->forward(batch) to return "
                                   "a loss tensor or an aggregate with a `loss` member; override compute_loss");
      return model->forward(batch);
    } else {
      static_assert(dependent_false_v<Batch>, "loom: the default compute_loss calls model->forward(batch), "
                                              "which does not exist; override compute_loss(Model&, Batch&)");
    }
  }

  /// Forward and backward of one micro-batch; the loss is scaled by `loss_weight`, the
  /// micro-batch's share of the items in its accumulation group. Returns the scaled loss, detached.
  template <class Batch>
  torch::Tensor training_step(Model& model, Batch& batch, double loss_weight) {
    torch::Tensor loss;
    {
      auto autocast = precision_->autocast();
      loss = loss_of(call_hook<hook::compute_loss>(self(), model, batch));
    }
    check(loss.defined() && loss.numel() == 1, "compute_loss must return a scalar loss, got shape {}",
          loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
    if (loss.scalar_type() != torch::kFloat) loss = loss.to(torch::kFloat);
    if (loss_weight != 1.0) loss = loss * loss_weight;
    backward(loss);
    return loss.detach();
  }

  /// Backpropagates `loss` through the precision policy (fp16: the scaled loss). Call this
  /// instead of loss.backward() in a training_step override.
  void backward(const torch::Tensor& loss) { precision_->scale_loss(loss).backward(); }

  /// Items a batch contributes to the loss normalization (default: its rows).
  template <class Batch>
  int64_t num_items(const Batch& batch) {
    return data::batch_rows(batch);
  }

  /// Floating-point operations of one training micro-batch, summed into total_flos: the
  /// model's `floating_point_ops(batch)` when it has one, else 0 (unknown).
  template <class Batch>
  double floating_point_ops(const Batch& batch) {
    if constexpr (requires { model_->floating_point_ops(batch); })
      return static_cast<double>(model_->floating_point_ops(batch));
    else
      return 0.0;
  }

  /// Loss, logits and labels of one evaluation batch (labels: the batch's `labels` field).
  template <class Batch>
  PredictionOutput prediction_step(Model& model, Batch& batch) {
    torch::NoGradGuard no_grad;
    auto autocast = precision_->autocast();
    auto out = call_hook<hook::compute_loss>(self(), model, batch);
    PredictionOutput p;
    p.loss = loss_of(out).detach();
    p.logits = logits_of(out);
    if (const torch::Tensor* labels = data::field_named(batch, "labels")) p.labels = *labels;
    return p;
  }

  /// AdamW (or SGD, per --optim) with HF's decay / no-decay parameter groups.
  optim::Optimizer create_optimizer() {
    optim::OptimizerOptions opts;
    opts.algorithm = optim::algorithm_from_name(args_.optim);
    opts.beta1 = args_.adam_beta1;
    opts.beta2 = args_.adam_beta2;
    opts.eps = args_.adam_epsilon;
    return optim::Optimizer(optim::decay_groups(detail::module_of(model_), args_.weight_decay), opts);
  }

  /// The schedule policy's scheduler over `num_training_steps` optimizer steps.
  scheduler_type create_scheduler(int64_t num_training_steps) {
    schedule::ScheduleParams p;
    p.num_training_steps = num_training_steps;
    p.num_warmup_steps = schedule::resolve_warmup_steps(args_.warmup_steps, args_.warmup_ratio, num_training_steps);
    p.base_lr = args_.learning_rate;
    p.kwargs = nlohmann::json::parse(args_.lr_scheduler_kwargs);
    if constexpr (std::is_same_v<schedule_policy, schedule::FromArgs>)
      return scheduler_type(std::move(p), args_.lr_scheduler_type);
    else
      return scheduler_type(std::move(p));
  }

  /// Training batches: seeded shuffle (data_seed, else seed), per_device_train_batch_size.
  template <class Batch = void>
  auto get_train_dataloader() {
    using B = batch_type<Batch>;
    const int64_t seed = args_.data_seed.value_or(args_.seed);
    return data::DataLoader<B>(std::any_cast<const data::AnyDataset<B>&>(train_data_),
                               args_.per_device_train_batch_size, args_.dataloader_drop_last,
                               data::RandomSampler{seed}, data::Shard{world_.rank, world_.size});
  }

  /// Evaluation batches: in order, per_device_eval_batch_size, nothing dropped.
  template <class Batch = void>
  auto get_eval_dataloader() {
    using B = batch_type<Batch>;
    check(eval_data_.has_value(), "evaluation needs an evaluation dataset; pass one to the Trainer");
    return data::DataLoader<B>(std::any_cast<const data::AnyDataset<B>&>(eval_data_),
                               args_.per_device_eval_batch_size, false, data::SequentialSampler{});
  }

  /// Batches of a dataset given to predict(): in order, per_device_eval_batch_size.
  template <class Batch>
  data::DataLoader<Batch> get_test_dataloader(const data::AnyDataset<Batch>& dataset) {
    return data::DataLoader<Batch>(dataset, args_.per_device_eval_batch_size, false, data::SequentialSampler{});
  }

  /// Records `logs` (plus epoch and step) in log_history and fires on_log.
  void log(const Metrics& logs) {
    Metrics entry = logs;
    entry.set("epoch", state_.epoch);
    state_.append_log(entry);
    callbacks_.template fire<event::on_log>(args_, state_, control_, entry);
  }

  /// Metrics from the concatenated predictions (default: none).
  Metrics compute_metrics(const EvalPrediction&) { return {}; }

  // ---- entry points -------------------------------------------------------------------

  /// Runs the training loop; writes trainer_state.json and *_results.json to output_dir.
  TrainOutput train() { return train_impl<batch_type<>>(); }

  /// Evaluates on the evaluation dataset; metrics are prefixed with `eval_`.
  Metrics evaluate() { return evaluate_impl<batch_type<>>("eval"); }

  /// Predictions, label ids and `test_`-prefixed metrics on `test_dataset` (HF's predict);
  /// fires on_predict, logs nothing.
  template <data::Dataset D>
  PredictResult predict(D test_dataset) {
    using Batch = batch_type<D>;
    static_assert(std::is_same_v<data::batch_t<D>, Batch>,
                  "loom: the test dataset yields another batch type than compute_loss takes");
    const data::AnyDataset<Batch> dataset(std::move(test_dataset));
    auto loader = call_hook<hook::get_test_dataloader>(self(), dataset);
    const MemoryTracker memory("test", !args_.skip_memory_metrics && !in_train_, device_);
    sharding_->begin_forward_only();
    auto result = evaluation_loop<Batch>(loader, "test");
    sharding_->end_forward_only();
    memory.stop(result.metrics);
    callbacks_.template fire<event::on_predict>(args_, state_, control_, result.metrics);
    return result;
  }

  /// Writes `<split>_results.json` and merges the metrics into `all_results.json` (HF's save_metrics).
  void save_metrics(const std::string& split, const Metrics& metrics) const {
    if (!state_.is_world_process_zero) return;
    std::filesystem::create_directories(args_.output_dir);
    const std::filesystem::path dir(args_.output_dir);
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [k, v] : metrics) j[k] = v;
    detail::write_json_file(dir / (split + "_results.json"), j, 4);
    nlohmann::json all = nlohmann::json::object();
    if (std::filesystem::exists(dir / "all_results.json")) {
      std::ifstream in(dir / "all_results.json");
      all = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (!all.is_object()) all = nlohmann::json::object();
    }
    all.update(j);
    detail::write_json_file(dir / "all_results.json", all, 4);
  }

  /// Writes trainer_state.json to output_dir (HF's save_state).
  void save_state() const {
    if (!state_.is_world_process_zero) return;
    std::filesystem::create_directories(args_.output_dir);
    detail::write_json_file(std::filesystem::path(args_.output_dir) / "trainer_state.json",
                            nlohmann::json(state_.to_json()), 2);
  }

  // ---- access ---------------------------------------------------------------------------

  /// The arguments (validated and finalized).
  [[nodiscard]] const TrainingArguments& args() const { return args_; }
  /// The model.
  [[nodiscard]] Model& model() { return model_; }
  /// The run's state.
  [[nodiscard]] const TrainerState& state() const { return state_; }
  /// The control flags.
  [[nodiscard]] TrainerControl& control() { return control_; }
  /// The device the model lives on.
  [[nodiscard]] const torch::Device& device() const { return device_; }
  /// The callback of type `Cb` (from the Callbacks<...> pack or a built-in).
  template <class Cb>
  Cb& callback() {
    return callbacks_.template get<Cb>();
  }
  /// The precision policy's state (fp16: the loss scaler).
  [[nodiscard]] precision_type& precision() { return *precision_; }
  /// Optimizer steps the fp16 scaler skipped in the last train().
  [[nodiscard]] int64_t skipped_steps() const { return skipped_steps_; }
  /// This process's place in the job (torchrun's environment; one process without it).
  [[nodiscard]] const dist::World& world() const { return world_; }
  /// The sharding engine (its process group: sharding().comm(), null for NoShard).
  [[nodiscard]] sharding_type& sharding() { return *sharding_; }
  /// Bytes this rank holds for parameters, gradients and optimizer state, measured after the
  /// first optimizer step of the last train() (zero before).
  [[nodiscard]] const dist::StateBytes& model_state_bytes() const { return state_bytes_; }
  /// The optimizer (after train() created it).
  [[nodiscard]] optim::Optimizer& optimizer() {
    check(optimizer_.has_value(), "the optimizer is created by train()");
    return *optimizer_;
  }

 protected:
  /// The object hooks are called on: the subclass, or this Trainer when Derived is void.
  auto& self() {
    if constexpr (std::is_void_v<Derived>) return *this;
    else return static_cast<Derived&>(*this);
  }

 private:
  using Self = std::conditional_t<std::is_void_v<Derived>, Trainer, Derived>;
  // Lazily evaluated so Derived is complete; the parameter only delays instantiation.
  template <class Delay = void>
  using batch_type = typename detail::batch_type_of<std::conditional_t<true, Self, Delay>, Model>::type;

  template <class Train>
  void init(Train train_dataset) {
    using Batch = batch_type<Train>;
    static_assert(data::TensorAggregate<Batch>,
                  "loom: the batch type must be an aggregate whose fields are torch::Tensor");
    static_assert(std::is_same_v<data::batch_t<Train>, Batch>,
                  "loom: the training dataset yields another batch type than compute_loss takes");
    sync_precision_flags();
    check(args_.sharding == sharding_policy::name,
          "--sharding {} is not available in this build; the Trainer's sharding policy is \"{}\"", args_.sharding,
          sharding_policy::name);
    validate(args_);
    finalize(args_);
    train_data_ = data::AnyDataset<Batch>(std::move(train_dataset));
    check(args_.eval_strategy == "no" || eval_data_.has_value(),
          "--eval_strategy {} needs an evaluation dataset; pass one to the Trainer or use --eval_strategy no",
          args_.eval_strategy);
    world_ = dist::world_from_env();
    if constexpr (!sharding_type::uses_comm)
      check(world_.size == 1,
            "WORLD_SIZE is {} but this Trainer does not shard (--sharding no); pass --sharding ddp, zero1, zero2 "
            "or full_shard, or start one process", world_.size);
    if (torch::cuda::is_available() && !args_.use_cpu) {
      check(world_.local_rank < static_cast<int>(torch::cuda::device_count()),
            "LOCAL_RANK {} has no GPU: this node has {}; start at most that many processes per node", world_.local_rank,
            torch::cuda::device_count());
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(world_.local_rank));
    } else {
      device_ = torch::Device(torch::kCPU);
    }
    state_.is_world_process_zero = world_.is_main();
    state_.is_local_process_zero = world_.is_local_main();
    std::shared_ptr<dist::Comm> comm;
    if constexpr (sharding_type::uses_comm)
      comm = std::make_shared<dist::Comm>(world_, device_, std::chrono::seconds(args_.ddp_timeout));
    precision_.emplace(args_, device_);
    set_seed(args_.seed);
    if (args_.model_name_or_path) {
      const auto file = std::filesystem::path(*args_.model_name_or_path) / checkpoint::kModelFile;
      check(std::filesystem::exists(file), "--model_name_or_path {}: {} does not exist", *args_.model_name_or_path,
            file.string());
      checkpoint::load_module(detail::module_of(model_), file);
    }
    detail::module_of(model_).to(device_);
    sharding_.emplace(std::move(comm), static_cast<double>(args_.ddp_bucket_cap_mb.value_or(25)));
    sharding_->setup(detail::module_of(model_));
    callbacks_.template fire<event::on_init_end>(args_, state_, control_);
  }

  template <class Batch>
  TrainOutput train_impl() {
    auto loader = call_hook<hook::get_train_dataloader>(self());
    const int64_t len = loader.size();
    check(len > 0, "the training set yields no batch ({} examples, per_device_train_batch_size {}{})",
          loader.num_examples(), args_.per_device_train_batch_size,
          args_.dataloader_drop_last ? ", dataloader_drop_last" : "");
    const int64_t ga = args_.gradient_accumulation_steps;
    const int64_t updates_per_epoch = std::max<int64_t>(len / ga + (len % ga > 0 ? 1 : 0), 1);
    const int64_t total_batch = args_.per_device_train_batch_size * ga * world_.size;
    int64_t max_steps = 0, num_epochs = 0;
    double num_train_samples = 0;
    if (args_.max_steps > 0) {
      max_steps = args_.max_steps;
      num_epochs = max_steps / updates_per_epoch + (max_steps % updates_per_epoch > 0 ? 1 : 0);
      num_train_samples = static_cast<double>(max_steps * total_batch);
    } else {
      max_steps = static_cast<int64_t>(std::ceil(args_.num_train_epochs * static_cast<double>(updates_per_epoch)));
      num_epochs = static_cast<int64_t>(std::ceil(args_.num_train_epochs));
      num_train_samples = static_cast<double>(loader.num_examples()) * args_.num_train_epochs;
    }

    state_ = TrainerState{};
    state_.is_world_process_zero = world_.is_main();
    state_.is_local_process_zero = world_.is_local_main();
    state_.max_steps = max_steps;
    state_.num_train_epochs = num_epochs;
    state_.train_batch_size = args_.per_device_train_batch_size;
    state_.logging_steps = detail::resolve_interval(args_.logging_steps, max_steps);
    state_.eval_steps = detail::resolve_interval(args_.eval_steps.value_or(args_.logging_steps), max_steps);
    state_.save_steps = detail::resolve_interval(args_.save_steps, max_steps);
    control_ = TrainerControl{};

    optimizer_.emplace(shard_optimizer(call_hook<hook::create_optimizer>(self())));
    state_bytes_ = {};
    scheduler_.emplace(call_hook<hook::create_scheduler>(self(), max_steps));
    auto& module = detail::module_of(model_);
    module.train();

    // Per-step values stay on the device; they are read only on logging steps.
    detail::LossWindow tr_loss;
    if (world_.size > 1) tr_loss.set_reducer([this](torch::Tensor& t) { sharding_->all_reduce(t, "the loss all-reduce"); });
    int64_t items_seen = 0;  // num_items summed over this run's micro-batches (tokens, for token losses)
    double total_loss = 0.0;
    int64_t last_logged = 0;
    int64_t epochs_trained = 0, batches_to_skip = 0;
    skipped_steps_ = 0;
    if (auto resume = resume_checkpoint()) {
      load_checkpoint(*resume, tr_loss, total_loss, last_logged);
      epochs_trained = state_.global_step / updates_per_epoch;
      batches_to_skip = (state_.global_step % updates_per_epoch) * ga;
    }

    const auto start = std::chrono::steady_clock::now();
    const MemoryTracker memory("train", !args_.skip_memory_metrics, device_);
    in_train_ = true;
    callbacks_.template fire<event::on_train_begin>(args_, state_, control_);
    if (args_.eval_on_start) evaluate_impl<Batch>("eval");

    torch::Tensor grad_norm;
    double last_lr = 0.0;

    std::vector<Batch> group;
    for (int64_t epoch = epochs_trained; epoch < num_epochs; ++epoch) {
      loader.set_epoch(epoch);
      callbacks_.template fire<event::on_epoch_begin>(args_, state_, control_);
      // Resuming mid-epoch starts at the first batch not yet trained; nothing before it is read.
      const int64_t first_update = epoch == epochs_trained ? batches_to_skip / ga : 0;
      int64_t step = first_update * ga - 1;
      for (int64_t update = first_update; update < updates_per_epoch; ++update) {
        const int64_t first = update * ga;
        const int64_t count = std::min(ga, len - first);
        // Gather the whole accumulation group first: the loss weights need its item count.
        group.clear();
        int64_t group_items = 0;
        std::vector<int64_t> items;
        for (int64_t i = 0; i < count; ++i) {
          group.push_back(loader.batch(first + i));
          // Counted on the host batch, so a token count never waits for the device.
          items.push_back(call_hook<hook::num_items>(self(), std::as_const(group.back())));
          state_.total_flos += call_hook<hook::floating_point_ops>(self(), std::as_const(group.back()));
          data::to_device(group.back(), device_);
          group_items += items.back();
          items_seen += items.back();
        }
        // Distributed: each rank's gradients are scaled by its share of the group's items.
        sharding_->begin_group(group_items, device_);
        for (int64_t i = 0; i < count; ++i) {
          ++step;
          if (step % ga == 0) callbacks_.template fire<event::on_step_begin>(args_, state_, control_);
          const double weight = group_items > 0 ? static_cast<double>(items[i]) / group_items : 1.0 / count;
          sharding_->begin_micro_step(i + 1 == count);
          torch::Tensor loss_step = call_hook<hook::training_step>(self(), model_, group[i], weight);
          sharding_->after_backward();
          if (sharding_->item_factor().defined()) loss_step = loss_step * sharding_->item_factor();
          tr_loss.add(loss_step, state_.global_step - last_logged);
          if (i + 1 == count) {
            const auto params = optimizer_->parameters();
            precision_->unscale(params);
            if (sharding_->grads_sharded() && precision_->found_inf().defined()) {
              torch::Tensor inf = precision_->found_inf();
              sharding_->all_reduce(inf, "the fp16 overflow all-reduce");
            }
            if (args_.max_grad_norm > 0) grad_norm = clip_grad_norm(params);
            callbacks_.template fire<event::on_pre_optimizer_step>(args_, state_, control_);
            resolve_skipped_step();
            last_lr = scheduler_->current_lr();
            optimizer_->step(last_lr, precision_->found_inf());
            sharding_->after_step();
            callbacks_.template fire<event::on_optimizer_step>(args_, state_, control_);
            precision_->update();
            step_scheduler_after_update();
            if (state_bytes_.total() == 0) record_state_bytes();
            if constexpr (sharding_type::owns_grads) sharding_->zero_grad();
            else optimizer_->zero_grad();
            state_.global_step += 1;
            state_.epoch = static_cast<double>(epoch) + static_cast<double>(step + 1) / static_cast<double>(len);
            callbacks_.template fire<event::on_step_end>(args_, state_, control_);
            maybe_log_save_evaluate<Batch>(tr_loss, total_loss, last_logged, grad_norm, last_lr);
          } else {
            callbacks_.template fire<event::on_substep_end>(args_, state_, control_);
          }
          if (control_.should_epoch_stop || control_.should_training_stop) break;
        }
        if (control_.should_epoch_stop || control_.should_training_stop) break;
      }
      callbacks_.template fire<event::on_epoch_end>(args_, state_, control_);
      maybe_log_save_evaluate<Batch>(tr_loss, total_loss, last_logged, grad_norm, last_lr);
      if (control_.should_training_stop) break;
    }

    resolve_skipped_step();
    in_train_ = false;
    if (args_.load_best_model_at_end && state_.best_model_checkpoint) {
      const auto file = std::filesystem::path(*state_.best_model_checkpoint) / checkpoint::kModelFile;
      if (should_log())
        std::fprintf(stderr, "loom: loading the best model from %s (%s = %g)\n", state_.best_model_checkpoint->c_str(),
                     args_.metric_for_best_model.value_or("loss").c_str(), state_.best_metric.value_or(0.0));
      sharding_->with_full_params([&] { checkpoint::load_module(module, file); });
    }
    total_loss += tr_loss.total(args_.logging_nan_inf_filter);
    TrainOutput out;
    out.global_step = state_.global_step;
    out.training_loss = total_loss / static_cast<double>(std::max<int64_t>(state_.global_step, 1));
    out.metrics = speed_metrics("train", start, num_train_samples, static_cast<double>(max_steps));
    if (args_.include_tokens_per_second)
      out.metrics.set("train_tokens_per_second",
                      detail::round_to(static_cast<double>(items_seen) / out.metrics.get("train_runtime").value(), 3));
    out.metrics.set("total_flos", state_.total_flos);
    out.metrics.set("train_loss", out.training_loss);
    memory.stop(out.metrics);
    call_hook<hook::log>(self(), std::as_const(out.metrics));
    out.metrics.set("epoch", state_.epoch);
    callbacks_.template fire<event::on_train_end>(args_, state_, control_);
    save_state();
    save_metrics("train", out.metrics);
    return out;
  }

  // The optimizer the sharding policy steps: the one create_optimizer built (unsharded), or
  // the same algorithm and groups over this rank's pieces of each parameter.
  optim::Optimizer shard_optimizer(optim::Optimizer full) {
    pieces_.clear();
    if (!sharding_->shards_optimizer()) return full;
    std::vector<optim::ParamGroup> groups;
    for (const auto& g : full.groups()) {
      optim::ParamGroup sharded{{}, {}, g.weight_decay};
      for (std::size_t i = 0; i < g.params.size(); ++i) {
        auto piece = sharding_->piece_of(g.params[i], g.names.at(i));
        if (!piece) continue;
        torch::Tensor p = piece->param;
        p.mutable_grad() = piece->grad;
        sharded.params.push_back(p);
        sharded.names.push_back(piece->name);
        pieces_.push_back(*piece);
      }
      groups.push_back(std::move(sharded));
    }
    return optim::Optimizer(std::move(groups), full.options());
  }

  // Clips to max_grad_norm by the global norm: over ranks when gradients are sharded.
  torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params) {
    if (!sharding_->grads_sharded()) return optim::clip_grad_norm(params, args_.max_grad_norm);
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    torch::Tensor sq = grads.empty() ? torch::zeros({1}, torch::TensorOptions().device(device_))
                                     : torch::stack(at::_foreach_norm(grads, 2)).square().sum().reshape({1});
    sharding_->all_reduce(sq, "the gradient-norm all-reduce");
    auto total = sq.sqrt().reshape({});
    if (!grads.empty()) at::_foreach_mul_(grads, torch::clamp_max(args_.max_grad_norm / (total + 1e-6), 1.0));
    return total;
  }

  void record_state_bytes() {
    state_bytes_ = sharding_->state_bytes();
    state_bytes_.optimizer = 0;
    for (const auto& [name, t] : optimizer_->state_tensors()) state_bytes_.optimizer += static_cast<double>(t.nbytes());
  }

  // HF's TrainingArguments.should_log: informational lines come from the main process of
  // each node (log_on_each_node, the default) or of the whole job.
  [[nodiscard]] bool should_log() const {
    return args_.log_on_each_node ? state_.is_local_process_zero : state_.is_world_process_zero;
  }

  void barrier(const char* what) {
    if (world_.size > 1) sharding_->comm()->barrier(what);
  }

  // The precision policy named in the type decides; --bf16 / --fp16 must agree with it (the
  // runtime selector, loom::select_policies, picks the type from those flags).
  void sync_precision_flags() {
    constexpr bool bf16 = std::is_same_v<precision_policy, precision::BF16>;
    constexpr bool fp16 = std::is_same_v<precision_policy, precision::FP16>;
    check(!(args_.bf16 && args_.fp16), "--bf16 and --fp16 are both set; choose one");
    check(!(args_.bf16 && !bf16) && !(args_.fp16 && !fp16),
          "--{} is set but this Trainer was compiled with precision::{}; name precision::{} in its type, "
          "or build it through loom::select_policies", args_.bf16 ? "bf16" : "fp16", precision_policy::name == "fp32"
          ? "FP32" : precision_policy::name == "bf16" ? "BF16" : "FP16", args_.bf16 ? "BF16" : "FP16");
    args_.bf16 = bf16;
    args_.fp16 = fp16;
  }

  // HF does not advance the scheduler after a step the fp16 scaler skipped. The skip is
  // decided on the device; its flag is copied to the host asynchronously after the step and
  // read just before the next step needs the learning rate (by then the copy is long done,
  // so the host never waits on the device inside a step).
  void step_scheduler_after_update() {
    const torch::Tensor& inf = precision_->found_inf();
    if (!inf.defined()) {
      scheduler_->step();
      return;
    }
    if (!skip_flag_host_.defined())
      skip_flag_host_ = torch::empty({1}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(device_.is_cuda()));
    skip_flag_host_.copy_(inf.reshape({1}), /*non_blocking=*/device_.is_cuda());
    if (device_.is_cuda()) {
      skip_event_.emplace(device_.type());
      skip_event_->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    }
    skip_pending_ = true;
  }
  void resolve_skipped_step() {
    if (!skip_pending_) return;
    if (skip_event_) skip_event_->synchronize();
    skip_pending_ = false;
    if (skip_flag_host_.item<float>() == 0.0f) scheduler_->step();
    else ++skipped_steps_;
  }

  template <class Batch>
  void maybe_log_save_evaluate(detail::LossWindow& tr_loss, double& total_loss, int64_t& last_logged,
                               const torch::Tensor& grad_norm, double lr) {
    if (control_.should_log && state_.global_step > last_logged) {
      const double loss = tr_loss.total(args_.logging_nan_inf_filter);
      tr_loss.reset();
      Metrics logs;
      logs.set("loss", loss / static_cast<double>(state_.global_step - last_logged));
      if (grad_norm.defined()) logs.set("grad_norm", grad_norm.item<double>());
      logs.set("learning_rate", lr);
      total_loss += loss;
      last_logged = state_.global_step;
      call_hook<hook::log>(self(), std::as_const(logs));
    }
    if (control_.should_evaluate) {
      const Metrics metrics = evaluate_impl<Batch>("eval");
      const bool new_best = determine_best_metric(metrics);
      if (args_.save_strategy == "best") control_.should_save = new_best;
    }
    if (control_.should_save) {
      save_checkpoint(tr_loss, total_loss, last_logged);
      callbacks_.template fire<event::on_save>(args_, state_, control_);
    }
  }

  // HF's _determine_best_metric: records best_metric / best_global_step; true when improved.
  bool determine_best_metric(const Metrics& metrics) {
    if (!args_.metric_for_best_model) return false;
    std::string key = *args_.metric_for_best_model;
    if (key.rfind("eval_", 0) != 0) key = "eval_" + key;
    const auto value = metrics.get(key);
    if (!value) {
      std::string known;
      for (const auto& [k, v] : metrics) known += (known.empty() ? "" : ", ") + k;
      fail("--metric_for_best_model {}: evaluation produced no {} (it produced {})", *args_.metric_for_best_model,
           key, known);
    }
    const bool greater = args_.greater_is_better.value_or(true);
    if (state_.best_metric && !(greater ? *value > *state_.best_metric : *value < *state_.best_metric)) return false;
    state_.best_metric = *value;
    state_.best_global_step = state_.global_step;
    return true;
  }

  // ---- checkpoints ------------------------------------------------------------------------
  //   checkpoint-N/model.safetensors        weights (named parameters and buffers)
  //   checkpoint-N/optimizer.safetensors    AdamW moments and step counts, by parameter name
  //   checkpoint-N/optimizer-R-of-W.safetensors / .json
  //                                         instead, when the optimizer is sharded: rank R's
  //                                         pieces, and each piece's flat range in its parameter
  //   checkpoint-N/optimizer.json           optimizer scalars
  //   checkpoint-N/scheduler.json           scheduler state (torch's LambdaLR field names)
  //   checkpoint-N/scaler.json              loss-scaler state (fp16; HF forgets it)
  //   checkpoint-N/rng_state.safetensors    CPU (and CUDA) generator states
  //   checkpoint-N/loop_state.json          the loop's loss accumulators, so logs after a resume match
  //   checkpoint-N/trainer_state.json       HF's TrainerState, callback states included
  //   checkpoint-N/training_args.json       the arguments
  // Everything is written to a temporary folder that is renamed into place at the end; in a
  // distributed run rank 0 writes the gathered model and the shared files, every rank its
  // optimizer shard, and rank 0 renames the folder once all ranks are done.

  void save_checkpoint(const detail::LossWindow& tr_loss, double total_loss, int64_t last_logged) {
    resolve_skipped_step();
    const std::filesystem::path out(args_.output_dir);
    if (args_.metric_for_best_model && state_.best_global_step) {
      const auto best = checkpoint::checkpoint_dir(out, *state_.best_global_step);
      if (*state_.best_global_step == state_.global_step || std::filesystem::exists(best))
        state_.best_model_checkpoint = best.string();
    }
    save_callback_states();
    const double window = tr_loss.total(args_.logging_nan_inf_filter);  // a collective when distributed
    const bool main = state_.is_world_process_zero;
    const std::string tag = world_.size > 1 ? std::string("ranks") : checkpoint::detail::pid_string();
    const auto tmp = checkpoint::temporary_checkpoint_dir(out, state_.global_step, tag);
    if (main) checkpoint::begin_checkpoint(out, state_.global_step, tag);
    barrier("the checkpoint barrier");
    sharding_->with_full_params([&] {
      if (main) checkpoint::save_module(detail::module_of(model_), tmp / checkpoint::kModelFile);
    });
    if (!args_.save_only_model && sharding_->shards_optimizer()) {
      const auto stem = fmt::format("optimizer-{}-of-{}", world_.rank, world_.size);
      checkpoint::save_safetensors(optimizer_->state_tensors(), tmp / (stem + ".safetensors"));
      nlohmann::json ranges = nlohmann::json::object();
      for (const auto& p : pieces_) ranges[p.name] = {p.begin, p.end, p.numel};
      detail::write_json_file(tmp / (stem + ".json"), {{"ranges", ranges}}, 2);
    }
    if (main && !args_.save_only_model) {
      if (!sharding_->shards_optimizer())
        checkpoint::save_safetensors(optimizer_->state_tensors(), tmp / "optimizer.safetensors");
      detail::write_json_file(tmp / "optimizer.json", optimizer_->state_meta(), 2);
      detail::write_json_file(tmp / "scheduler.json", scheduler_->state_dict(), 2);
      detail::write_json_file(tmp / "scaler.json", precision_->state_dict(), 2);
      std::vector<std::pair<std::string, torch::Tensor>> rng{{"cpu", at::detail::getDefaultCPUGenerator().get_state()}};
      if (torch::cuda::is_available())
        for (int i = 0; i < static_cast<int>(torch::cuda::device_count()); ++i)
          rng.emplace_back("cuda:" + std::to_string(i),
                           at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, i)).get_state());
      checkpoint::save_safetensors(rng, tmp / "rng_state.safetensors");
      detail::write_json_file(tmp / "loop_state.json",
                              {{"tr_loss", window}, {"total_loss", total_loss},
                               {"globalstep_last_logged", last_logged}, {"skipped_steps", skipped_steps_}},
                              2);
    }
    if (main) {
      detail::write_json_file(tmp / checkpoint::kTrainerStateFile, nlohmann::json(state_.to_json()), 2);
      save_json(args_, tmp / "training_args.json");
    }
    barrier("the checkpoint barrier");  // every shard is written
    if (main) {
      checkpoint::commit_checkpoint(tmp, checkpoint::checkpoint_dir(out, state_.global_step));
      if (args_.save_total_limit) {
        std::optional<std::filesystem::path> best;
        if (state_.best_model_checkpoint) best = std::filesystem::path(*state_.best_model_checkpoint);
        checkpoint::rotate_checkpoints(out, *args_.save_total_limit, best);
      }
    }
    barrier("the checkpoint barrier");  // the checkpoint is in place before anyone reads it
  }

  // The folder --resume_from_checkpoint names ("latest": the newest complete one in output_dir).
  std::optional<std::filesystem::path> resume_checkpoint() {
    if (!args_.resume_from_checkpoint) return std::nullopt;
    const std::filesystem::path out(args_.output_dir);
    if (*args_.resume_from_checkpoint == "latest") {
      if (state_.is_world_process_zero && std::filesystem::exists(out)) checkpoint::remove_stale_temporaries(out);
      barrier("the resume barrier");
      auto latest = std::filesystem::exists(out) ? checkpoint::latest_checkpoint(out) : std::nullopt;
      check(latest.has_value(), "--resume_from_checkpoint latest: no complete checkpoint-N folder in {}",
            out.string());
      return latest;
    }
    const std::filesystem::path dir(*args_.resume_from_checkpoint);
    checkpoint::validate_checkpoint(dir);
    return dir;
  }

  void load_checkpoint(const std::filesystem::path& dir, detail::LossWindow& tr_loss, double& total_loss,
                       int64_t& last_logged) {
    // The weights first: a damaged model file is the most useful thing to report.
    sharding_->with_full_params(
        [&] { checkpoint::load_module(detail::module_of(model_), dir / checkpoint::kModelFile); });
    for (const char* f : {"optimizer.json", "scheduler.json", "scaler.json", "rng_state.safetensors",
                          "loop_state.json"})
      check(std::filesystem::exists(dir / f),
            "{} cannot resume training: it has no {} (saved with save_only_model? then start from its "
            "weights with --model_name_or_path {})", dir.string(), f, dir.string());
    auto read_json = [&](const char* name) { return detail::read_json_file(dir / name); };
    try {
      optimizer_->load_state(optimizer_state_for_this_rank(dir), read_json("optimizer.json"));
      scheduler_->load_state_dict(read_json("scheduler.json"));
      precision_->load_state_dict(read_json("scaler.json"));
      const auto loop = read_json("loop_state.json");
      tr_loss.reset(loop.at("tr_loss").template get<double>());
      total_loss = loop.at("total_loss").template get<double>();
      last_logged = loop.at("globalstep_last_logged").template get<int64_t>();
      skipped_steps_ = loop.at("skipped_steps").template get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      fail("{} has a malformed state file: {}", dir.string(), e.what());
    }
    for (const auto& [name, t] : checkpoint::load_safetensors(dir / "rng_state.safetensors")) {
      auto restore = [&](at::Generator gen) {  // a handle sharing the global generator
        std::lock_guard<std::mutex> lock(gen.mutex());
        gen.set_state(t);
      };
      if (name == "cpu") {
        restore(at::detail::getDefaultCPUGenerator());
      } else if (name.rfind("cuda:", 0) == 0 && torch::cuda::is_available()) {
        const int i = std::stoi(name.substr(5));
        if (i < static_cast<int>(torch::cuda::device_count()))
          restore(at::globalContext().defaultGenerator(torch::Device(torch::kCUDA, i)));
      }
    }
    // Progress, history and best model come from the checkpoint; the plan (max_steps,
    // intervals) from this run's arguments, as HF does.
    const auto saved = TrainerState::load(dir / checkpoint::kTrainerStateFile);
    state_.global_step = saved.global_step;
    state_.epoch = saved.epoch;
    state_.log_history = saved.log_history;
    state_.best_metric = saved.best_metric;
    state_.best_global_step = saved.best_global_step;
    state_.best_model_checkpoint = saved.best_model_checkpoint;
    state_.total_flos = saved.total_flos;
    state_.num_input_tokens_seen = saved.num_input_tokens_seen;
    state_.stateful_callbacks = saved.stateful_callbacks;
    load_callback_states();
  }

  // The optimizer state of checkpoint `dir`, whole or sharded at any world size, cut to what
  // this rank's optimizer steps (whole parameters, or this rank's pieces).
  std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_for_this_rank(const std::filesystem::path& dir) {
    std::map<std::string, torch::Tensor> full;
    if (std::filesystem::exists(dir / "optimizer.safetensors")) {
      for (auto& [k, t] : checkpoint::load_safetensors(dir / "optimizer.safetensors"))
        full[k] = k.rfind("step.", 0) == 0 ? t : t.reshape({-1});
    } else {
      int64_t world = 0;
      std::map<std::string, int64_t> covered, numels;
      for (int64_t r = 0; world == 0 || r < world; ++r) {
        if (world == 0) {  // the world size the checkpoint was saved at
          static const std::regex shard0(R"(optimizer-0-of-([1-9][0-9]{0,5})\.safetensors)");
          for (const auto& e : std::filesystem::directory_iterator(dir)) {
            std::smatch m;
            const auto name = e.path().filename().string();
            if (std::regex_match(name, m, shard0)) world = std::stoll(m[1].str());
          }
          check(world > 0,
                "{} cannot resume training: it has neither optimizer.safetensors nor optimizer-0-of-N.safetensors "
                "(saved with save_only_model? then start from its weights with --model_name_or_path {})",
                dir.string(), dir.string());
        }
        const auto stem = dir / fmt::format("optimizer-{}-of-{}", r, world);
        check(std::filesystem::exists(stem.string() + ".safetensors") && std::filesystem::exists(stem.string() + ".json"),
              "{} is missing the optimizer shard of rank {} ({}.safetensors/.json)", dir.string(), r,
              stem.filename().string());
        const auto meta = detail::read_json_file(stem.string() + ".json");
        check(meta.is_object() && meta.contains("ranges"), "{}.json has no \"ranges\"", stem.string());
        for (auto& [key, t] : checkpoint::load_safetensors(stem.string() + ".safetensors")) {
          const auto dot = key.find('.');
          const std::string kind = key.substr(0, dot), param = key.substr(dot + 1);
          if (kind == "step") {
            full[key] = t;
            continue;
          }
          check(meta["ranges"].contains(param), "{}.json has no range for {}", stem.string(), param);
          const auto range = meta["ranges"][param].template get<std::vector<int64_t>>();
          auto& f = full[key];
          if (!f.defined()) f = torch::zeros({range.at(2)}, t.options());
          f.narrow(0, range.at(0), range.at(1) - range.at(0)).copy_(t.reshape({-1}));
          covered[key] += range.at(1) - range.at(0);
          numels[key] = range.at(2);
        }
      }
      for (const auto& [key, n] : numels)
        check(covered[key] == n, "{}: the optimizer shards cover {} of the {} elements of {}", dir.string(),
              covered[key], n, key);
    }
    std::vector<std::pair<std::string, torch::Tensor>> out;
    auto take = [&](const std::string& key, int64_t begin, int64_t end, c10::IntArrayRef shape) {
      auto it = full.find(key);
      if (it == full.end()) return;  // Optimizer::load_state reports what is missing
      if (key.rfind("step.", 0) == 0) out.emplace_back(key, it->second);
      else if (it->second.numel() < end) out.emplace_back(key, it->second);  // a shape mismatch, reported there
      else out.emplace_back(key, it->second.narrow(0, begin, end - begin).reshape(shape));
    };
    const bool pieces = sharding_->shards_optimizer();
    std::size_t k = 0;
    for (const auto& g : optimizer_->groups())
      for (std::size_t i = 0; i < g.params.size(); ++i, ++k) {
        const auto& name = g.names.at(i);
        const int64_t begin = pieces ? pieces_.at(k).begin : 0;
        const int64_t end = pieces ? pieces_.at(k).end : g.params[i].numel();
        for (const char* kind : {"exp_avg.", "exp_avg_sq.", "step."}) take(kind + name, begin, end, g.params[i].sizes());
      }
    if (optimizer_->options().algorithm == optim::Algorithm::sgd || full.empty()) out.clear();
    return out;
  }

  // Callbacks with `name`, `state()` and `load_state(json)` are checkpointed under their name.
  void save_callback_states() {
    callbacks_.for_each([&](auto& cb) {
      using Cb = std::decay_t<decltype(cb)>;
      if constexpr (requires { Cb::name; cb.state(); }) state_.stateful_callbacks[std::string(Cb::name)] = cb.state();
    });
  }
  void load_callback_states() {
    callbacks_.for_each([&](auto& cb) {
      using Cb = std::decay_t<decltype(cb)>;
      if constexpr (requires(const nlohmann::json& j) { Cb::name; cb.load_state(j); }) {
        const std::string key(Cb::name);
        if (state_.stateful_callbacks.contains(key)) cb.load_state(nlohmann::json(state_.stateful_callbacks[key]));
      }
    });
  }

  template <class Batch>
  Metrics evaluate_impl(const std::string& prefix) {
    auto loader = call_hook<hook::get_eval_dataloader>(self());
    const MemoryTracker memory(prefix, !args_.skip_memory_metrics && !in_train_, device_);
    sharding_->begin_forward_only();
    Metrics metrics = evaluation_loop<Batch>(loader, prefix).metrics;
    sharding_->end_forward_only();
    memory.stop(metrics);
    if (in_train_ && scheduler_ && scheduler_->wants_metric()) {
      // HF steps ReduceLROnPlateau with metric_for_best_model after each evaluation in training.
      std::string key = args_.metric_for_best_model.value_or("loss");
      if (key.rfind(prefix + "_", 0) != 0) key = prefix + "_" + key;
      const auto value = metrics.get(key);
      check(value.has_value(), "reduce_lr_on_plateau needs the metric {} but evaluation produced no such metric", key);
      scheduler_->step_metric(*value);
    }
    call_hook<hook::log>(self(), std::as_const(metrics));
    callbacks_.template fire<event::on_evaluate>(args_, state_, control_, metrics);
    return metrics;
  }

  // HF's evaluation_loop: loss weighted by batch rows, predictions gathered for compute_metrics.
  // With W ranks, rank r evaluates batches r, r+W, ...; the loss sums are all-reduced and the
  // predictions all-gathered back into batch order, so every rank computes the same metrics
  // over the whole set. Under FullShard a rank without a batch in the last round runs a
  // discarded forward, because every forward takes part in collectives.
  template <class Batch>
  PredictResult evaluation_loop(data::DataLoader<Batch>& loader, const std::string& prefix) {
    loader.set_epoch(0);
    auto& module = detail::module_of(model_);
    const bool was_training = module.is_training();
    module.eval();
    const auto start = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().device(device_).dtype(torch::kDouble));
    int64_t loss_rows = 0, rows = 0;
    std::vector<torch::Tensor> logits, labels, host_logits, host_labels;
    const bool keep_preds = !args_.prediction_loss_only;
    auto flush = [&] {
      if (!logits.empty()) host_logits.push_back(torch::cat(logits).cpu());
      if (!labels.empty()) host_labels.push_back(torch::cat(labels).cpu());
      logits.clear();
      labels.clear();
    };
    const int64_t world = world_.size, nb = loader.size();
    std::vector<int64_t> logit_rows, label_rows;  // dim 0 of each batch this rank kept
    for (int64_t k = 0; k < (nb + world - 1) / world; ++k) {
      const int64_t b = k * world + world_.rank;
      if (b >= nb) {
        if constexpr (std::is_same_v<sharding_policy, sharding::FullShard>) {
          Batch dummy = loader.batch(0);
          data::to_device(dummy, device_);
          (void)call_hook<hook::prediction_step>(self(), model_, dummy);
        }
        continue;
      }
      Batch batch = loader.batch(b);
      data::to_device(batch, device_);
      const int64_t n = data::batch_rows(batch);
      PredictionOutput p = call_hook<hook::prediction_step>(self(), model_, batch);
      if (p.loss.defined()) {
        loss_sum += p.loss.to(torch::kDouble).reshape({}) * static_cast<double>(n);
        loss_rows += n;
      }
      if (keep_preds && p.logits.defined()) {
        logits.push_back(p.logits.detach());
        logit_rows.push_back(p.logits.dim() > 0 ? p.logits.size(0) : 1);
      }
      if (keep_preds && p.labels.defined()) {
        labels.push_back(p.labels.detach());
        label_rows.push_back(p.labels.dim() > 0 ? p.labels.size(0) : 1);
      }
      if (args_.eval_accumulation_steps && (k + 1) % *args_.eval_accumulation_steps == 0) flush();
      rows += n;
      callbacks_.template fire<event::on_prediction_step>(args_, state_, control_);
    }
    flush();
    PredictResult result;
    if (!host_logits.empty()) result.predictions = torch::cat(host_logits);
    if (!host_labels.empty()) result.label_ids = torch::cat(host_labels);
    if (world > 1) {
      auto totals = torch::stack({loss_sum, torch::full({}, static_cast<double>(loss_rows), loss_sum.options()),
                                  torch::full({}, static_cast<double>(rows), loss_sum.options())});
      sharding_->all_reduce(totals, "the evaluation all-reduce");
      const auto host = totals.cpu();
      loss_sum = host[0].to(device_);
      loss_rows = static_cast<int64_t>(host[1].item<double>());
      rows = static_cast<int64_t>(host[2].item<double>());
      if (keep_preds) {
        result.predictions = gather_batches(result.predictions, logit_rows, nb);
        result.label_ids = gather_batches(result.label_ids, label_rows, nb);
      }
    }
    Metrics raw;
    if (result.predictions.defined() && result.label_ids.defined()) {
      EvalPrediction pred{result.predictions, result.label_ids};
      raw = call_hook<hook::compute_metrics>(self(), std::as_const(pred));
    }
    if (loss_rows > 0) raw.set("loss", loss_sum.item<double>() / static_cast<double>(loss_rows));
    Metrics metrics;
    for (const auto& [k, v] : raw)
      metrics.set(k.rfind(prefix + "_", 0) == 0 ? k : prefix + "_" + k, v);
    const double steps = std::ceil(static_cast<double>(rows) / static_cast<double>(args_.per_device_eval_batch_size));
    metrics.merge(speed_metrics(prefix, start, static_cast<double>(rows), steps));
    if (was_training) module.train();
    result.metrics = std::move(metrics);
    return result;
  }

  // Every rank's part of a per-batch result, back in batch order. `local` is this rank's
  // batches r, r+W, ... concatenated along dim 0, `sizes` their dim-0 sizes. Batches may
  // differ in dim 0 but not in the other dims, nor in dtype, across ranks.
  torch::Tensor gather_batches(const torch::Tensor& local, const std::vector<int64_t>& sizes, int64_t nb) {
    auto* comm = sharding_->comm();
    const int64_t world = world_.size, rank = world_.rank;
    constexpr int64_t kMeta = 10;  // has data, dims, 7 trailing sizes, dtype + 1
    auto meta = torch::zeros({nb + world * kMeta}, torch::TensorOptions().dtype(torch::kLong));
    int64_t* m = meta.data_ptr<int64_t>();
    for (std::size_t j = 0; j < sizes.size(); ++j) m[rank + static_cast<int64_t>(j) * world] = sizes[j];
    if (local.defined()) {
      check(local.dim() >= 1 && local.dim() <= 8, "predictions and labels must have 1 to 8 dimensions to be gathered "
            "across ranks, got {}", local.dim());
      int64_t* row = m + nb + rank * kMeta;
      row[0] = 1;
      row[1] = local.dim();
      for (int64_t d = 1; d < local.dim(); ++d) row[1 + d] = local.size(d);
      row[9] = static_cast<int64_t>(local.scalar_type()) + 1;
    }
    auto on_device = meta.to(comm->device());
    sharding_->all_reduce(on_device, "the prediction-shape all-reduce");
    meta = on_device.cpu();
    m = meta.data_ptr<int64_t>();
    int64_t ref = -1;
    for (int64_t q = 0; q < world; ++q) {
      const int64_t* row = m + nb + q * kMeta;
      if (row[0] == 0) continue;
      if (ref < 0) ref = q;
      check(std::equal(row + 1, row + kMeta, m + nb + ref * kMeta + 1),
            "ranks {} and {} produced predictions or labels of different shapes or types; evaluation gathers them "
            "along dim 0 only", ref, q);
    }
    if (ref < 0) return {};
    const int64_t* row = m + nb + ref * kMeta;
    const auto dtype = static_cast<c10::ScalarType>(row[9] - 1);
    const auto wire = c10::isFloatingType(dtype) ? torch::kFloat : torch::kLong;
    std::vector<int64_t> count(static_cast<std::size_t>(world), 0);
    for (int64_t b = 0; b < nb; ++b) count[static_cast<std::size_t>(b % world)] += m[b];
    const int64_t most = *std::max_element(count.begin(), count.end());
    std::vector<int64_t> shape{most};
    for (int64_t d = 1; d < row[1]; ++d) shape.push_back(row[1 + d]);
    const auto opts = torch::TensorOptions().device(comm->device()).dtype(wire);
    auto mine = torch::zeros(shape, opts);
    if (local.defined() && local.size(0) > 0) mine.narrow(0, 0, local.size(0)).copy_(local.to(wire));
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

  TrainingArguments args_;
  Model model_;
  dist::World world_;
  std::optional<sharding_type> sharding_;  // after model_: it unhooks the model's parameters first
  std::vector<dist::Piece> pieces_;        // what this rank's optimizer steps, in optimizer order
  dist::StateBytes state_bytes_;
  torch::Device device_{torch::kCPU};
  TrainerState state_;
  TrainerControl control_;
  callbacks_type callbacks_;
  std::any train_data_, eval_data_;
  std::optional<optim::Optimizer> optimizer_;
  std::optional<scheduler_type> scheduler_;
  std::optional<precision_type> precision_;
  bool in_train_ = false;
  torch::Tensor skip_flag_host_;
  std::optional<c10::Event> skip_event_;
  bool skip_pending_ = false;
  int64_t skipped_steps_ = 0;
};

/// A Trainer with no overrides.
template <class Model, class... Policies>
using DefaultTrainer = Trainer<void, Model, Policies...>;

}  // namespace loom
