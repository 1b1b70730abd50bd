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
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>
#include <loom/data/collate.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/distributed/engine.hpp>
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
#include <loom/trainer/best_model.hpp>
#include <loom/trainer/checkpointer.hpp>
#include <loom/trainer/evaluation.hpp>
#include <loom/trainer/events.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/trainer/loop_state.hpp>
#include <loom/trainer/optimizer_step.hpp>
#include <loom/trainer/preemption.hpp>
#include <loom/trainer/run_files.hpp>
#include <loom/trainer/startup.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

/// Seeds torch's CPU and CUDA generators (HF's set_seed).
inline void set_seed(int64_t seed) { torch::manual_seed(static_cast<uint64_t>(seed)); }

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
// body, where Derived is still incomplete; instantiated in the member functions.
template <class Self, class Model>
struct Datasets {
  using Batch = typename batch_type_of<Self, Model>::type;
  std::optional<data::AnyDataset<Batch>> train, eval;
};

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
    data_ = std::make_unique<datasets_type>();
    data_->eval.emplace(std::move(eval_dataset));
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

  /// Forward and backward of one micro-batch; the loss is divided by `loss_divisor`, the items
  /// of its accumulation group over the micro-batch's (gradient_accumulation_steps when the
  /// batches are equal, as HF divides). Returns the divided loss, detached.
  template <class Batch>
  torch::Tensor training_step(Model& model, Batch& batch, double loss_divisor) {
    torch::Tensor loss;
    {
      auto autocast = precision_->autocast();
      loss = loss_of(call_hook<hook::compute_loss>(self(), model, batch));
    }
    check(loss.defined() && loss.numel() == 1, "compute_loss must return a scalar loss, got shape {}",
          loss.defined() ? c10::str(loss.sizes()) : std::string("undefined"));
    if (loss.scalar_type() != torch::kFloat) loss = loss.to(torch::kFloat);
    if (loss_divisor != 1.0) loss = loss / loss_divisor;
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

  /// The --optim rule (with --optim_args) over HF's decay / no-decay parameter groups. An
  /// override may return its own groups (each with its own lr and weight decay) or any
  /// torch::optim::Optimizer through optim::Optimizer::wrap.
  optim::Optimizer create_optimizer() { return optim::make_optimizer(args_, detail::module_of(model_)); }

  /// The schedule policy's scheduler over `num_training_steps` optimizer steps.
  scheduler_type create_scheduler(int64_t num_training_steps) {
    auto p = schedule::make_schedule_params(args_, num_training_steps);
    if constexpr (schedule::NamedAtRunTime<scheduler_type>)
      return scheduler_type(std::move(p), args_.lr_scheduler_type);
    else
      return scheduler_type(std::move(p));
  }

  /// Training batches: seeded shuffle (data_seed, else seed), per_device_train_batch_size.
  template <class Batch = void>
  auto get_train_dataloader() {
    using B = batch_type<Batch>;
    const int64_t seed = args_.data_seed.value_or(args_.seed);
    return data::DataLoader<B>(*data_->train,
                               args_.per_device_train_batch_size, args_.dataloader_drop_last,
                               data::RandomSampler{seed}, data::Shard{world_.rank, world_.size});
  }

  /// Evaluation batches: in order, per_device_eval_batch_size, nothing dropped.
  template <class Batch = void>
  auto get_eval_dataloader() {
    using B = batch_type<Batch>;
    check(data_->eval.has_value(), "evaluation needs an evaluation dataset; pass one to the Trainer");
    return data::DataLoader<B>(*data_->eval,
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
    engine_->begin_forward_only();
    auto result = evaluation_loop<Batch>(loader, "test");
    engine_->end_forward_only();
    memory.stop(result.metrics);
    callbacks_.template fire<event::on_predict>(args_, state_, control_, result.metrics);
    return result;
  }

  /// Writes `<split>_results.json` and merges the metrics into `all_results.json` (HF's save_metrics).
  void save_metrics(const std::string& split, const Metrics& metrics) const {
    if (state_.is_world_process_zero) detail::save_metrics(args_.output_dir, split, metrics);
  }

  /// Writes trainer_state.json to output_dir (HF's save_state).
  void save_state() const {
    if (state_.is_world_process_zero) detail::save_trainer_state(args_.output_dir, state_);
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
  [[nodiscard]] int64_t skipped_steps() const { return steps_->skipped_steps(); }
  /// This process's place in the job (torchrun's environment; one process without it).
  [[nodiscard]] const dist::World& world() const { return world_; }
  /// The sharding engine (its process group: sharding().comm(), null for NoShard).
  [[nodiscard]] dist::Engine& sharding() { return *engine_; }
  /// Bytes this rank holds for parameters, gradients and optimizer state, measured after the
  /// first optimizer step of the last train() (zero before).
  [[nodiscard]] const dist::StateBytes& model_state_bytes() const { return steps_->state_bytes(); }
  /// The optimizer (after train() created it).
  [[nodiscard]] optim::Optimizer& optimizer() {
    check(steps_->has_optimizer(), "the optimizer is created by train()");
    return steps_->optimizer();
  }

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

  static_assert(dist::ShardingEngine<sharding_type>,
                "loom: the sharding policy's ShardingImpl lacks kind, uses_comm, owns_grads or forward_is_collective");
  static_assert(precision::PrecisionPolicy<precision_type>,
                "loom: the precision policy's PrecisionImpl does not provide the PrecisionPolicy interface");

  template <class Train>
  void init(Train train_dataset) {
    using Batch = batch_type<Train>;
    static_assert(data::TensorAggregate<Batch>,
                  "loom: the batch type must be an aggregate whose fields are torch::Tensor");
    static_assert(std::is_same_v<data::batch_t<Train>, Batch>,
                  "loom: the training dataset yields another batch type than compute_loss takes");
    static_assert(schedule::Schedule<scheduler_type>,
                  "loom: the scheduler does not provide the Schedule interface (schedule/schedule_decl.hpp)");
    if (!data_) data_ = std::make_unique<datasets_type>();
    auto up = start_up(args_, {sharding_policy::name, precision_policy::name, precision_policy::type_name,
                               sharding_type::uses_comm}, data_->eval.has_value());
    data_->train.emplace(std::move(train_dataset));
    world_ = up.world;
    device_ = up.device;
    state_.is_world_process_zero = world_.is_main();
    state_.is_local_process_zero = world_.is_local_main();
    precision_.emplace(args_, device_);
    set_seed(args_.seed);
    engine_ = dist::make_engine(sharding_type::kind, std::move(up.comm),
                                static_cast<double>(args_.ddp_bucket_cap_mb.value_or(25)));
    checkpointer_.emplace(args_, world_, *engine_, detail::module_of(model_));
    if (args_.model_name_or_path) checkpointer_->load_pretrained(*args_.model_name_or_path);
    detail::module_of(model_).to(device_);
    engine_->setup(detail::module_of(model_));
    steps_.emplace(*engine_, device_, sharding_type::owns_grads);
    callbacks_.template fire<event::on_init_end>(args_, state_, control_);
  }

  // The parts of a checkpoint that the policies and the loop own.
  std::vector<JsonPart> checkpoint_parts() {
    return {json_part("scheduler.json", *scheduler_), json_part("scaler.json", *precision_),
            JsonPart{"loop_state.json",
                     [this] {
                       auto j = loop_.state_dict(args_.logging_nan_inf_filter);
                       j["skipped_steps"] = steps_->skipped_steps();
                       // The batch layout, for the resume warning.
                       j["per_device_train_batch_size"] = args_.per_device_train_batch_size;
                       j["gradient_accumulation_steps"] = args_.gradient_accumulation_steps;
                       j["world_size"] = world_.size;
                       return j;
                     },
                     [this](const nlohmann::json& j) {
                       loop_.load_state_dict(j);
                       steps_->set_skipped_steps(json::Fields(j, "").integer("skipped_steps", 0));
                       resumed_loop_state_ = j;
                     }}};
  }

  template <class Batch>
  TrainOutput train_impl() {
    auto loader = call_hook<hook::get_train_dataloader>(self());
    const auto plan = TrainingPlan::make(args_, loader.size(), loader.num_examples(), world_.size);
    const int64_t len = plan.batches_per_epoch, ga = args_.gradient_accumulation_steps;
    state_ = plan.initial_state(args_, world_.is_main(), world_.is_local_main());
    control_ = TrainerControl{};

    auto optimizer = call_hook<hook::create_optimizer>(self());
    scheduler_.emplace(call_hook<hook::create_scheduler>(self(), plan.max_steps));
    auto& module = detail::module_of(model_);
    steps_->reset(std::move(optimizer), *scheduler_, module.parameters());
    module.train();

    loop_ = LoopState{};
    last_saved_step_ = -1;
    if (world_.size > 1) loop_.tr_loss.set_reducer([this](torch::Tensor& t) { engine_->all_reduce(t, "the loss all-reduce"); });
    int64_t epochs_trained = 0, batches_to_skip = 0;
    record_callback_states();  // HF's TrainerState(stateful_callbacks=...) at the start of training
    if (auto resume = checkpointer_->resume_dir()) {
      checkpointer_->load(*resume, state_, *steps_, checkpoint_parts());
      const auto warning = resume_warning(resumed_loop_state_, args_, world_.size, state_.global_step);
      if (!warning.empty() && world_.is_main()) std::fprintf(stderr, "%s\n", warning.c_str());
      if (args_.restore_callback_states_from_checkpoint) {
        callbacks_.load_states(state_.stateful_callbacks);
        if (state_.stateful_callbacks.contains("TrainerControl"))
          control_ = TrainerControl::from_state(nlohmann::json(state_.stateful_callbacks["TrainerControl"]));
      }
      epochs_trained = state_.global_step / plan.updates_per_epoch;
      batches_to_skip = (state_.global_step % plan.updates_per_epoch) * ga;
    }

    const auto start = std::chrono::steady_clock::now();
    const MemoryTracker memory("train", !args_.skip_memory_metrics, device_);
    in_train_ = true;
    PreemptionWatch preemption(engine_->comm(), device_);
    bool preempted = false;
    callbacks_.template fire<event::on_train_begin>(args_, state_, control_);
    if (args_.eval_on_start) evaluate_impl<Batch>("eval");

    torch::Tensor grad_norm;
    double last_lr = 0.0;
    std::vector<Batch> group;
    std::vector<int64_t> items;
    for (int64_t epoch = epochs_trained; epoch < plan.num_epochs; ++epoch) {
      loader.set_epoch(epoch);
      callbacks_.template fire<event::on_epoch_begin>(args_, state_, control_);
      // Resuming mid-epoch starts at the first batch not yet trained; nothing before it is read.
      const int64_t first_update = epoch == epochs_trained ? batches_to_skip / ga : 0;
      int64_t step = first_update * ga - 1;
      for (int64_t update = first_update; update < plan.updates_per_epoch; ++update) {
        const int64_t first = update * ga;
        const int64_t count = std::min(ga, len - first);
        // Gather the whole accumulation group first: the loss weights need its item count.
        group.clear();
        items.clear();
        int64_t group_items = 0;
        for (int64_t i = 0; i < count; ++i) {
          group.push_back(loader.batch(first + i));
          // Counted on the host batch, so a token count never waits for the device.
          items.push_back(call_hook<hook::num_items>(self(), std::as_const(group.back())));
          state_.total_flos += call_hook<hook::floating_point_ops>(self(), std::as_const(group.back()));
          data::to_device(group.back(), device_);
          group_items += items.back();
          loop_.items_seen += items.back();
        }
        // Distributed: each rank's gradients are scaled by its share of the group's items.
        engine_->begin_group(group_items, device_);
        for (int64_t i = 0; i < count; ++i) {
          ++step;
          if (step % ga == 0) callbacks_.template fire<event::on_step_begin>(args_, state_, control_);
          const double divisor = group_items > 0 ? static_cast<double>(group_items) / static_cast<double>(items[i])
                                                 : static_cast<double>(count);
          engine_->begin_micro_step(i + 1 == count);
          torch::Tensor loss_step = call_hook<hook::training_step>(self(), model_, group[i], divisor);
          engine_->after_backward();
          if (engine_->item_factor().defined()) loss_step = loss_step * engine_->item_factor();
          loop_.tr_loss.add(loss_step, state_.global_step - loop_.last_logged);
          if (i + 1 == count) {
            const auto& params = steps_->params();
            precision_->unscale(params);
            grad_norm = steps_->clip(params, precision_->found_inf(), args_.max_grad_norm);
            callbacks_.template fire<event::on_pre_optimizer_step>(args_, state_, control_);
            settle_skip();
            last_lr = scheduler_->current_lr();
            steps_->step(last_lr, precision_->found_inf());
            callbacks_.template fire<event::on_optimizer_step>(args_, state_, control_);
            precision_->update();
            steps_->after_update(precision_->found_inf());
            steps_->finish();
            state_.global_step += 1;
            state_.epoch = static_cast<double>(epoch) + static_cast<double>(step + 1) / static_cast<double>(len);
            callbacks_.template fire<event::on_step_end>(args_, state_, control_);
            maybe_log_save_evaluate<Batch>(grad_norm, last_lr);
            if (preemption.should_stop()) preempted = control_.should_training_stop = true;
          } else {
            callbacks_.template fire<event::on_substep_end>(args_, state_, control_);
          }
          if (control_.should_epoch_stop || control_.should_training_stop) break;
        }
        if (control_.should_epoch_stop || control_.should_training_stop) break;
      }
      callbacks_.template fire<event::on_epoch_end>(args_, state_, control_);
      maybe_log_save_evaluate<Batch>(grad_norm, last_lr);
      if (control_.should_training_stop) break;
    }

    steps_->settle_skip();
    if (preempted || preemption.got_signal_at_end()) stop_for_preemption(preemption.stop_signal());
    in_train_ = false;
    if (args_.load_best_model_at_end && state_.best_model_checkpoint) {
      if (should_log())
        std::fprintf(stderr, "loom: loading the best model from %s (%s = %g)\n", state_.best_model_checkpoint->c_str(),
                     args_.metric_for_best_model.value_or("loss").c_str(), state_.best_metric.value_or(0.0));
      checkpointer_->load_weights(*state_.best_model_checkpoint);
    }
    loop_.total_loss += loop_.tr_loss.total(args_.logging_nan_inf_filter);
    TrainOutput out;
    out.global_step = state_.global_step;
    out.training_loss = loop_.total_loss / static_cast<double>(std::max<int64_t>(state_.global_step, 1));
    out.metrics = speed_metrics("train", start, plan.num_train_samples, static_cast<double>(plan.max_steps));
    if (args_.include_tokens_per_second)
      out.metrics.set("train_tokens_per_second", detail::round_to(static_cast<double>(loop_.items_seen) /
                                                                      out.metrics.get("train_runtime").value(), 3));
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

  // Reads the last step's fp16 skip flag (OptimizerStep::settle_skip); after a skipped step,
  // checks that the loss scale has not collapsed (a host read, on skipped steps only).
  void settle_skip() {
    const int64_t before = steps_->skipped_steps();
    steps_->settle_skip();
    if constexpr (precision::ScalesLoss<precision_type>)
      if (steps_->skipped_steps() != before) precision_->check_scale_floor(steps_->skipped_steps(), state_.global_step);
  }

  // The stateful callbacks' states and the TrainerControl flags, as trainer_state.json keeps them.
  void record_callback_states() {
    callbacks_.save_states(state_.stateful_callbacks);
    state_.stateful_callbacks["TrainerControl"] = control_.state();
  }

  // HF's TrainingArguments.should_log: informational lines come from the main process of
  // each node (log_on_each_node, the default) or of the whole job.
  [[nodiscard]] bool should_log() const {
    return args_.log_on_each_node ? state_.is_local_process_zero : state_.is_world_process_zero;
  }

  template <class Batch>
  void maybe_log_save_evaluate(const torch::Tensor& grad_norm, double lr) {
    if (control_.should_log && state_.global_step > loop_.last_logged) {
      const double loss = loop_.tr_loss.total(args_.logging_nan_inf_filter);
      loop_.tr_loss.reset();
      Metrics logs;
      logs.set("loss", loss / static_cast<double>(state_.global_step - loop_.last_logged));
      if constexpr (precision::ScalesLoss<precision_type>) {
        // fp16: how many of the window's steps the scaler skipped (their loss still counts).
        settle_skip();
        logs.set("skipped_steps", static_cast<double>(steps_->skipped_steps() - loop_.skipped_logged));
        loop_.skipped_logged = steps_->skipped_steps();
      }
      if (grad_norm.defined()) logs.set("grad_norm", grad_norm.item<double>());
      logs.set("learning_rate", lr);
      loop_.total_loss += loss;
      loop_.last_logged = state_.global_step;
      call_hook<hook::log>(self(), std::as_const(logs));
    }
    if (control_.should_evaluate) {
      const Metrics metrics = evaluate_impl<Batch>("eval");
      const bool new_best = best_.update(metrics, state_);
      if (args_.save_strategy == "best") control_.should_save = new_best;
    }
    if (control_.should_save) save_checkpoint();
  }

  // checkpoint-<global_step>, then on_save.
  void save_checkpoint() {
    steps_->settle_skip();
    best_.before_save(state_);
    record_callback_states();
    checkpointer_->save(state_, *steps_, checkpoint_parts());
    last_saved_step_ = state_.global_step;
    callbacks_.template fire<event::on_save>(args_, state_, control_);
  }

  // The end of a run stopped by a signal: a checkpoint of this step (unless one was just
  // saved), on_save, on_train_end, trainer_state.json, then loom::Preempted.
  [[noreturn]] void stop_for_preemption(int signal) {
    if (last_saved_step_ != state_.global_step) save_checkpoint();
    in_train_ = false;
    callbacks_.template fire<event::on_train_end>(args_, state_, control_);
    save_state();
    throw Preempted(signal, state_.global_step,
                    checkpoint::checkpoint_dir(args_.output_dir, state_.global_step).string());
  }

  template <class Batch>
  Metrics evaluate_impl(const std::string& prefix) {
    auto loader = call_hook<hook::get_eval_dataloader>(self());
    const MemoryTracker memory(prefix, !args_.skip_memory_metrics && !in_train_, device_);
    engine_->begin_forward_only();
    Metrics metrics = evaluation_loop<Batch>(loader, prefix).metrics;
    engine_->end_forward_only();
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
    metrics.set("epoch", state_.epoch);  // HF's log() adds it to the caller's metrics
    callbacks_.template fire<event::on_evaluate>(args_, state_, control_, metrics);
    return metrics;
  }

  // HF's evaluation_loop over this rank's batches (evaluation.hpp does the sums and the
  // gather). When every forward is a collective (FullShard), a rank without a batch in the
  // last round runs a discarded forward.
  template <class Batch>
  PredictResult evaluation_loop(data::DataLoader<Batch>& loader, const std::string& prefix) {
    loader.set_epoch(0);
    auto& module = detail::module_of(model_);
    const bool was_training = module.is_training();
    module.eval();
    const auto start = std::chrono::steady_clock::now();
    torch::NoGradGuard no_grad;
    EvalAccumulator acc(args_, world_, *engine_, device_, loader.size());
    for (int64_t k = 0; k < acc.rounds(); ++k) {
      const auto b = acc.batch_of(k);
      if (!b) {
        if constexpr (sharding_type::forward_is_collective) {
          Batch dummy = loader.batch(0);
          data::to_device(dummy, device_);
          (void)call_hook<hook::prediction_step>(self(), model_, dummy);
        }
        continue;
      }
      Batch batch = loader.batch(*b);
      data::to_device(batch, device_);
      const int64_t n = data::batch_rows(batch);
      acc.add(call_hook<hook::prediction_step>(self(), model_, batch), n);
      acc.end_round(k);
      callbacks_.template fire<event::on_prediction_step>(args_, state_, control_);
    }
    PredictResult result = acc.finish();
    Metrics raw;
    if (result.predictions.defined() && result.label_ids.defined()) {
      EvalPrediction pred{result.predictions, result.label_ids};
      raw = call_hook<hook::compute_metrics>(self(), std::as_const(pred));
    }
    result.metrics = acc.metrics(std::move(raw), prefix, start);
    if (was_training) module.train();
    return result;
  }

  TrainingArguments args_;
  Model model_;
  dist::World world_;
  torch::Device device_{torch::kCPU};
  std::unique_ptr<dist::Engine> engine_;  // after model_: destroyed first, it unhooks the model's parameters
  TrainerState state_;
  TrainerControl control_;
  callbacks_type callbacks_;
  std::unique_ptr<datasets_type> data_;
  std::optional<precision_type> precision_;
  std::optional<scheduler_type> scheduler_;
  std::optional<OptimizerStep> steps_;  // after engine_: its optimizer steps views of the engine's storage
  std::optional<Checkpointer> checkpointer_;
  BestModel best_{args_};
  LoopState loop_;
  bool in_train_ = false;
  int64_t last_saved_step_ = -1;  // global_step of the last checkpoint this run saved
  nlohmann::json resumed_loop_state_;  // the checkpoint's loop_state.json, for the resume warning
};

/// A Trainer with no overrides.
template <class Model, class... Policies>
using DefaultTrainer = Trainer<void, Model, Policies...>;

}  // namespace loom
