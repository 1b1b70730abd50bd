#pragma once
// loom::Accelerator: the parts of the training loop a hand-written loop needs (HF's
// Accelerate), and the parts the Trainer itself is built from.
//
//   loom::Accelerator<loom::sharding::Zero2, loom::precision::BF16> acc(args);
//   acc.prepare_model(*model);
//   acc.prepare_optimizer(loom::optim::make_optimizer(acc.args(), *model), scheduler);
//   auto loader = acc.prepare_train_loader(loom::data::AnyDataset<Batch>(dataset));
//   acc.load_state();                                    // --resume_from_checkpoint, if given
//   ... acc.begin_accumulation(items); acc.begin_micro_step(last);
//       { auto autocast = acc.autocast(); loss = ...; }  acc.backward(loss); acc.end_micro_step();
//       acc.clip_grad_norm(args.max_grad_norm); acc.step(); ++acc.state().global_step;
//   acc.save_state();                                    // output_dir/checkpoint-<global_step>
//
// Several optimizers (a GAN's generator and discriminator): prepare_optimizer takes the first,
// add_optimizer each further one over its own parameters with its own scheduler, and the
// per-optimizer calls take its index: acc.clip_grad_norm(norm, 1); acc.step(1).
//
// AcceleratorBase is the non-template part (compiled once into loom::compiled): the process's
// place in the job, the sharding engine (dist::Engine), the optimizer step sequence
// (OptimizerStep), the checkpoint writer (Checkpointer) and the run's TrainerState and loss
// totals. Accelerator<Policies...> adds the precision policy: autocast, loss scaling and the
// fp16 skip. The checkpoint folders are the Trainer's, file for file, so a run can stop under
// one and resume under the other. docs/api.md maps Accelerate's calls to these.

#include <loom/checkpoint/folders.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/paths.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/core/state.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/train_sampler.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/env.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/policy/bundle.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/precision/bf16.hpp>
#include <loom/precision/fp16.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/from_args.hpp>
#include <loom/schedule/schedule_decl.hpp>
#include <loom/accelerate/checkpointer.hpp>
#include <loom/accelerate/loop_state.hpp>
#include <loom/accelerate/memory_plan.hpp>
#include <loom/accelerate/optimizer_step.hpp>
#include <loom/accelerate/startup.hpp>

#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace loom {

/// Seeds torch's CPU and CUDA generators (HF's set_seed).
inline void set_seed(int64_t seed) { torch::manual_seed(static_cast<uint64_t>(seed)); }

/// --deterministic (Lightning's deterministic=True): torch's deterministic algorithms (a kernel
/// without one is an error naming it), cuDNN deterministic and not benchmarking, and a
/// deterministic cuBLAS workspace: CUBLAS_WORKSPACE_CONFIG=:4096:8 unless it is already one of
/// the two deterministic settings (cuBLAS reads it when its first handle is made: set it before
/// any CUDA product runs in the process). Launches stay asynchronous, which is what
/// --full_determinism's CUDA_LAUNCH_BLOCKING=1 gives up. For the whole process, as HF's.
inline void enable_determinism() {
  const char* workspace = std::getenv("CUBLAS_WORKSPACE_CONFIG");
  if (workspace == nullptr || (std::string_view(workspace) != ":4096:8" && std::string_view(workspace) != ":16:8"))
    ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", 1);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  at::globalContext().setDeterministicCuDNN(true);
  at::globalContext().setBenchmarkCuDNN(false);
}

/// HF's enable_full_determinism (--full_determinism): set_seed, then torch's deterministic
/// algorithms (a kernel without one is an error naming it), cuDNN deterministic and not
/// benchmarking, and the variables cuBLAS and CUDA read when they start: a deterministic
/// cuBLAS workspace (:16:8) and blocking launches. For the whole process, as in HF.
inline void enable_full_determinism(int64_t seed) {
  set_seed(seed);
  ::setenv("CUDA_LAUNCH_BLOCKING", "1", 1);
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);  // HF's; enable_determinism keeps it
  ::setenv("FLASH_ATTENTION_DETERMINISTIC", "1", 1);
  enable_determinism();
}

/// The non-template part of an Accelerator (see the file comment). Not constructed directly:
/// make an Accelerator<Policies...>.
class AcceleratorBase {
 public:
  AcceleratorBase(const AcceleratorBase&) = delete;
  AcceleratorBase& operator=(const AcceleratorBase&) = delete;
  virtual ~AcceleratorBase() = default;

  // ---- the process ---------------------------------------------------------------------

  /// The arguments, validated and finalized.
  [[nodiscard]] const TrainingArguments& args() const { return *run_args_; }
  /// This process's place in the job (torchrun's environment; one process without it).
  [[nodiscard]] const dist::World& world() const { return world_; }
  /// The device the model lives on.
  [[nodiscard]] const torch::Device& device() const { return device_; }
  /// Global rank 0 (HF's is_main_process): the process that writes shared files (with
  /// --save_on_each_node, should_save tells which processes write checkpoints).
  [[nodiscard]] bool is_main_process() const { return world_.is_main(); }
  /// Local rank 0 of each node (HF's is_local_main_process).
  [[nodiscard]] bool is_local_main_process() const { return world_.is_local_main(); }
  /// Whether this process writes output_dir's checkpoints and models (HF's
  /// TrainingArguments.should_save): global rank 0, or with --save_on_each_node the local main
  /// process of each node that has an output folder of its own.
  [[nodiscard]] bool should_save() const { return saves_; }
  /// Whether this process logs at --log_level, the others at --log_level_replica (HF's
  /// TrainingArguments.should_log): the local main process of each node with
  /// --log_on_each_node (the default), else global rank 0.
  [[nodiscard]] bool should_log() const { return world_.logs(run_args_->log_on_each_node); }
  /// Processes in the job (HF's num_processes).
  [[nodiscard]] int num_processes() const { return world_.size; }
  /// This process's global rank (HF's process_index).
  [[nodiscard]] int process_index() const { return world_.rank; }
  /// The sharding engine (its process group: sharding().comm(), null for NoShard).
  [[nodiscard]] dist::Engine& sharding() { return *engine_; }
  /// The process group (null when the sharding policy needs none).
  [[nodiscard]] dist::Comm* comm() const { return engine_->comm(); }

  /// The run's progress (global_step, epoch, log_history): trainer_state.json in a checkpoint.
  [[nodiscard]] TrainerState& state() { return state_; }
  [[nodiscard]] const TrainerState& state() const { return state_; }
  /// The loop's loss totals (loop_state.json in a checkpoint).
  [[nodiscard]] LoopState& loop() { return loop_; }

  // ---- prepare ---------------------------------------------------------------------------

  /// Loads --model_name_or_path's weights, moves the model to the device, switches on
  /// --gradient_checkpointing and hands it to the sharding engine (broadcast from rank 0,
  /// flattened, gradient hooks). Once, before prepare_optimizer. `model`: a module holder
  /// (torch::nn::Linear, a TORCH_MODULE) or a shared_ptr to a module; the Accelerator keeps
  /// the module alive as long as its engine's hooks are on it.
  template <class Holder>
    requires requires(Holder& h) { std::shared_ptr<torch::nn::Module>(h.ptr()); }
  void prepare_model(Holder& model) {
    prepare_model(std::shared_ptr<torch::nn::Module>(model.ptr()));
  }
  void prepare_model(std::shared_ptr<torch::nn::Module> module) {
    check(module != nullptr, "prepare_model was given no module");
    module_owner_ = module;
    prepare_module(*module);
  }
  /// prepare_model for a module whose owner outlives this Accelerator (the Trainer's model).
  LOOM_INLINE void prepare_module(torch::nn::Module& module);
  /// Takes the optimizer (over the prepared module's parameters, e.g. optim::make_optimizer)
  /// and the scheduler it follows; when the policy shards the optimizer, rebuilds it over this
  /// rank's pieces. Resets the step counters and the loss totals.
  template <schedule::Schedule S>
  void prepare_optimizer(optim::Optimizer optimizer, S& scheduler) {
    current_lr_ = [&scheduler] { return scheduler.current_lr(); };
    prepare_optimizer(std::move(optimizer), static_cast<schedule::LRSchedulerBase&>(scheduler));
  }
  /// A further optimizer, with the scheduler it follows (HF Accelerate's
  /// `accelerator.prepare(model, opt_g, opt_d, sched_g, sched_d)`: a GAN's discriminator, an
  /// actor-critic's critic). After prepare_optimizer, which takes the first. Its parameters
  /// are its own: a parameter another optimizer already holds is a loom::Error naming it. Under
  /// ZeRO-1/2 and FullShard it is rebuilt over this rank's pieces of its parameters, as the
  /// first. Returns its index (1 for the first added, then 2, ...), which clip_grad_norm,
  /// optimizer_step, finish_step, step and optimizer take; its checkpoint files are
  /// optimizer_<index>.* and scheduler_<index>.json. Not under --fp16 (one loss scaler for one
  /// backward per step).
  template <schedule::Schedule S>
  std::size_t add_optimizer(optim::Optimizer optimizer, S& scheduler) {
    return add_optimizer_impl(std::move(optimizer), static_cast<schedule::LRSchedulerBase&>(scheduler),
                              [&scheduler] { return scheduler.current_lr(); });
  }
  /// The optimizers prepared: 1 after prepare_optimizer, one more per add_optimizer (0 before).
  [[nodiscard]] std::size_t num_optimizers() const {
    return steps_ && steps_->has_optimizer() ? 1 + more_.size() : 0;
  }
  /// The optimizer `k` (0: prepare_optimizer's; 1, 2, ...: add_optimizer's) this rank steps.
  [[nodiscard]] LOOM_INLINE optim::Optimizer& optimizer(std::size_t k = 0);

  /// Training batches for this rank, as the Trainer reads them: seeded shuffle (--data_seed,
  /// else --seed; reshuffled per epoch by set_epoch), --per_device_train_batch_size,
  /// --dataloader_drop_last, rank r reading batches r, r+W, ... of each epoch's order;
  /// --train_sampling_strategy sequential or group_by_length as for the Trainer.
  template <class Batch>
  [[nodiscard]] data::DataLoader<Batch> prepare_train_loader(data::AnyDataset<Batch> dataset) const {
    std::shared_ptr<const std::vector<int64_t>> lengths;
    if (run_args_->train_sampling_strategy == "group_by_length")
      lengths = std::make_shared<const std::vector<int64_t>>(data::example_lengths(dataset, run_args_->length_column_name));
    const data::Sampler sampler = train_sampler(std::move(lengths));
    return data::DataLoader<Batch>(std::move(dataset), run_args_->per_device_train_batch_size,
                                   run_args_->dataloader_drop_last, sampler, data::Shard{world_.rank, world_.size});
  }
  /// The training sampler the arguments name: seeded shuffle (--data_seed, else --seed),
  /// sequential, or HF's LengthGroupedSampler over per_device_train_batch_size x
  /// gradient_accumulation_steps on `lengths` (each example's length) for group_by_length.
  [[nodiscard]] data::Sampler train_sampler(std::shared_ptr<const std::vector<int64_t>> lengths) const {
    return data::train_sampler(*run_args_, std::move(lengths));
  }
  /// Evaluation batches, in order, --per_device_eval_batch_size, nothing dropped; every rank
  /// holds every batch and evaluates those eval_batches() gives it.
  template <class Batch>
  [[nodiscard]] data::DataLoader<Batch> prepare_eval_loader(data::AnyDataset<Batch> dataset) const {
    return data::DataLoader<Batch>(std::move(dataset), run_args_->per_device_eval_batch_size, false,
                                   data::SequentialSampler{});
  }
  /// This rank's evaluation batches, one entry per round: in round k rank r evaluates batch
  /// k * W + r; none in a last round with fewer batches than ranks. gather_for_metrics once per
  /// round puts every rank's results back in batch order.
  [[nodiscard]] LOOM_INLINE std::vector<std::optional<int64_t>> eval_batches(int64_t num_batches) const;

  // ---- gradient accumulation ---------------------------------------------------------------

  /// An accumulation group (the micro-batches of one optimizer step) starts; `local_items`:
  /// the items (num_items: rows, or tokens for token losses) this rank's micro-batches hold.
  /// Under a sharding policy each rank's gradient is weighted by its share of the group's
  /// items (item_factor), as HF weights by num_items_in_batch; by 1 / world under
  /// --average_tokens_across_devices false (each rank normalized by its own items).
  /// `model_divides`: the model divides its summed loss by the group's count itself; the
  /// count is returned (HF's num_items_in_batch: every rank's items under
  /// --average_tokens_across_devices, else this rank's; a float32 scalar on the device), and
  /// the ranks' gradients are summed as they are (or averaged, not across devices). Otherwise
  /// an undefined tensor.
  LOOM_INLINE torch::Tensor begin_accumulation(int64_t local_items, bool model_divides = false);
  /// Before a micro-batch's forward; gradients are communicated after the `last` one only
  /// (DDP's no_sync on the others). Under DDP / ZeRO, rank 0's buffers are broadcast first
  /// (--ddp_broadcast_buffers).
  LOOM_INLINE void begin_micro_step(bool last);
  /// After the micro-batch's backward: the engine reduces what must be reduced.
  LOOM_INLINE void end_micro_step();
  /// This rank's share of the group's items, on the device (undefined in a world of one): the
  /// Trainer multiplies each micro-step's loss by it before summing the logged loss over ranks.
  [[nodiscard]] const torch::Tensor& item_factor() const { return engine_->item_factor(); }

  // ---- the run's counters: the Trainer changes state() and loop() only through these ------

  /// A run starts from `initial` (its plan's TrainerState: the intervals resolved, step 0).
  void begin_run(TrainerState initial) { state_ = std::move(initial); }
  /// A micro-batch of the current group was read: its items (num_items) and floating-point
  /// operations (HF's total_flos) are counted.
  void count_batch(int64_t items, double flos) {
    state_.total_flos += flos;
    loop_.items_seen += items;
  }
  /// A micro-step's loss, as training_step returned it, joins the logging window (weighted by
  /// item_factor under a sharding policy, so that the window sums over ranks to the group's loss).
  LOOM_INLINE void record_loss(torch::Tensor loss);
  /// An optimizer step ended: global_step + 1, and `epoch` (HF's fractional epoch) reached.
  void end_step(double epoch) {
    state_.global_step += 1;
    state_.epoch = epoch;
  }
  /// Training on a stream: where a checkpoint from here on resumes it (loop_state.json's
  /// train_stream).
  void set_stream_position(nlohmann::json position) { loop_.train_stream = std::move(position); }
  /// Tokens counted on every rank (already summed over ranks) join num_input_tokens_seen.
  void add_input_tokens(int64_t tokens) { state_.num_input_tokens_seen += tokens; }
  /// The logging window closes: returns its summed loss and the optimizer steps it spans (the
  /// logged loss is their ratio), and starts the next window at this step.
  struct LoggedLoss {
    double sum = 0.0;   ///< the window's losses summed (logging_nan_inf_filter applied)
    int64_t steps = 0;  ///< the optimizer steps since the last log
  };
  LOOM_INLINE LoggedLoss close_log_window(bool nan_inf_filter);
  /// fp16: the steps the scaler skipped since the last log (after settle_skip), counted as logged.
  int64_t take_skipped_since_log() {
    const int64_t now = skipped_steps();
    const int64_t delta = now - loop_.skipped_logged;
    loop_.skipped_logged = now;
    return delta;
  }
  /// Training ended: the open window's loss joins the total (train_loss's numerator), which is returned.
  double close_training_loss(bool nan_inf_filter) {
    loop_.total_loss += loop_.tr_loss.total(nan_inf_filter);
    return loop_.total_loss;
  }

  // ---- collectives -----------------------------------------------------------------------

  /// `t` summed over ranks (a copy; `t` itself in a world of one). Every rank calls it.
  [[nodiscard]] LOOM_INLINE torch::Tensor reduce_sum(const torch::Tensor& t);
  /// Every rank's `t` of this evaluation round concatenated along dim 0 in batch order (rank
  /// 0's batch, rank 1's, ...): HF's gather_for_metrics. A rank without a batch in the last
  /// round passes an undefined tensor, which adds nothing (no padding to drop); dim 1 may
  /// differ between ranks and is padded with -100. Every rank calls it. Several ranks: the
  /// result is on the CPU; one rank: `t` itself.
  [[nodiscard]] LOOM_INLINE torch::Tensor gather_for_metrics(const torch::Tensor& t);
  /// Around an evaluation (forward passes without backward): FullShard gathers each unit's
  /// parameters for the forward and frees them after, without waiting for a backward. Under
  /// FullShard every forward is a collective: a rank without a batch in a round runs a
  /// forward on any batch and drops its result (forward_is_collective()).
  void begin_evaluation() { engine_->begin_forward_only(); }
  /// Every forward is a collective under this run's sharding policy (FullShard gathers
  /// parameters in each): in evaluation, a rank without a batch still runs one.
  [[nodiscard]] bool forward_is_collective() const { return sharding_.shards_parameters; }
  /// The run's precision policy scales the loss and may skip steps (fp16).
  [[nodiscard]] bool scales_loss() const { return scales_loss_; }
  /// The facts of the run's sharding policy (its --sharding name, what it shards).
  [[nodiscard]] const ShardingFacts& sharding_facts() const { return sharding_; }
  /// The facts of the run's precision policy (its name, whether it scales the loss).
  [[nodiscard]] const PrecisionFacts& precision_facts() const { return precision_facts_; }
  void end_evaluation() { engine_->end_forward_only(); }
  /// Waits until every rank reaches this point (HF's wait_for_everyone).
  LOOM_INLINE void wait_for_everyone();

  // ---- checkpoints ---------------------------------------------------------------------------

  /// A JSON part of every checkpoint (file name, save, load): HF's register_for_checkpointing.
  void register_for_checkpointing(JsonPart part) { extra_parts_.push_back(std::move(part)); }
  /// Writes output_dir/checkpoint-<state().global_step>: the Trainer's format, file for file
  /// (weights gathered, this rank's optimizer shard, scheduler.json, scaler.json,
  /// loop_state.json, RNG states, trainer_state.json, training_args.json), atomically, with
  /// --save_total_limit rotation. Every rank calls it. Returns the folder.
  LOOM_INLINE std::filesystem::path save_state();
  /// The folder --resume_from_checkpoint names ("latest": the newest complete checkpoint in
  /// output_dir); none when it is not given.
  [[nodiscard]] LOOM_INLINE std::optional<std::filesystem::path> resume_dir();
  /// Restores the checkpoint of --resume_from_checkpoint, if given: weights, this rank's
  /// optimizer state (resharded to this world and policy), scheduler, scaler, loss totals,
  /// RNG states and state()'s progress. Returns the folder, none when there was nothing to load.
  LOOM_INLINE std::optional<std::filesystem::path> load_state();
  /// The same from `dir`, a checkpoint folder written by save_state or by a Trainer.
  LOOM_INLINE void load_state(const std::filesystem::path& dir);
  /// Writes the model to `dir`: model.safetensors (gathered from every rank), training_args.json,
  /// config.json (`config`, else set_model_files's) and set_model_files's files (HF's
  /// save_model). A model training a LoRA adapter writes PEFT's adapter_config.json and
  /// adapter_model.safetensors instead of config.json and the weights, as HF's Trainer saves a
  /// PeftModel. Every rank calls it.
  void save_model(const std::filesystem::path& dir, const nlohmann::json& config = nullptr) {
    check(checkpointer_.has_value(), "save_model needs the model: call prepare_model first");
    checkpointer_->save_model(dir, config);
  }
  /// A model training a LoRA adapter, merged (PEFT's merge_and_unload) into a plain model
  /// folder at `dir`: model.safetensors, config.json and set_model_files's files; the model
  /// keeps its adapter and goes on training. Every rank calls it.
  void save_merged_model(const std::filesystem::path& dir, const nlohmann::json& config = nullptr) {
    check(checkpointer_.has_value(), "save_merged_model needs the model: call prepare_model first");
    checkpointer_->save_merged_model(dir, config);
  }
  /// What each saved model folder (save_model, save_merged_model, every checkpoint-N) holds
  /// beside the weights, so transformers' from_pretrained and AutoTokenizer open it: the
  /// model's config.json object (HF's format: a loom model's hf_config()) and files copied in
  /// (tokenizer.json, tokenizer_config.json: HF's Trainer saves its processing_class). After
  /// prepare_model; the Trainer sets the config of a model that has hf_config() itself.
  void set_model_files(nlohmann::json config, std::vector<std::filesystem::path> files = {}) {
    check(checkpointer_.has_value(), "set_model_files needs the model: call prepare_model first");
    for (const auto& f : files) check_path(f, PathKind::file, "a file set_model_files copies into saved folders");
    checkpointer_->set_model_files(std::move(config), std::move(files));
  }
  /// Loads the weights of `dir` (a checkpoint or model folder) into the prepared model, on
  /// every rank (HF's load_best_model_at_end). Every rank calls it.
  void load_model(const std::filesystem::path& dir) {
    check(checkpointer_.has_value(), "load_model needs the model: call prepare_model first");
    checkpointer_->load_weights(dir);
  }
  /// Runs `fn` with every parameter of the prepared model whole on this rank (FSDP's
  /// summon_full_params): under FullShard, whose parameters (frozen ones too) hold no memory
  /// between its gathers, the shards are gathered around `fn` and take back what it changed.
  /// Under FullShard it is a collective: every rank calls it.
  void summon_full_params(const std::function<void()>& fn) {
    check(module_ != nullptr, "summon_full_params needs the model: call prepare_model first");
    engine_->with_full_params(fn);
  }
  /// The checkpoint's loop_state.json after the last load_state (empty before).
  [[nodiscard]] const nlohmann::json& resumed_loop_state() const { return resumed_loop_state_; }

  /// fp16 optimizer steps the loss scaler skipped since prepare_optimizer.
  [[nodiscard]] int64_t skipped_steps() const { return steps_ ? steps_->skipped_steps() : 0; }
  /// Bytes this rank holds for parameters, gradients and optimizer state, measured after the
  /// first optimizer step (zero before); with several optimizers, every optimizer's state once
  /// each has stepped.
  [[nodiscard]] const dist::StateBytes& model_state_bytes() const {
    static const dist::StateBytes none;
    if (!more_.empty()) return all_bytes_;
    return steps_ ? steps_->state_bytes() : none;
  }
  /// The memory plan prepare_model worked out before the model went to its device (what the
  /// main process printed; docs/distributed.md "Memory plan"); none before prepare_model.
  [[nodiscard]] const std::optional<MemoryPlan>& memory_plan() const { return memory_plan_; }
  /// One micro-batch's activation bytes for the plan prepare_model prints (the Trainer passes
  /// its model's activation_bytes() at the training sequence length); `note` says how it was
  /// made. Before prepare_model; without it the plan's activations are unknown.
  void set_activation_estimate(std::optional<double> bytes, std::string note) {
    activation_bytes_ = bytes;
    activation_note_ = std::move(note);
  }

 protected:
  AcceleratorBase() = default;

  /// The memory plan of `module` (before it goes to the device): printed by the main process,
  /// a loom::Error when it exceeds the device's memory unless --skip_memory_check.
  LOOM_INLINE void plan_memory(const torch::nn::Module& module);
  /// Gives memory and values to the parameters of a model built under loom::DeferredInit
  /// (core/deferred.hpp): rank 0's seed to every rank, then every such parameter whole on the
  /// device, except under FullShard, whose engine materializes each rank's slices.
  LOOM_INLINE void materialize_deferred(torch::nn::Module& module);
  /// prepare_optimizer's non-template part (current_lr_ set by the caller).
  LOOM_INLINE void prepare_optimizer(optim::Optimizer optimizer, schedule::LRSchedulerBase& scheduler);
  /// add_optimizer's non-template part.
  LOOM_INLINE std::size_t add_optimizer_impl(optim::Optimizer optimizer, schedule::LRSchedulerBase& scheduler,
                                             std::function<double()> current_lr);
  /// `optimizer` with each parameter named as the prepared model names it (an optimizer built
  /// over a submodule names them from there), after checking that no earlier optimizer holds
  /// one of them; records them as held by optimizer `k`.
  LOOM_INLINE optim::Optimizer claim_parameters(optim::Optimizer optimizer, std::size_t k);
  /// The step sequence of optimizer `k` (a loom::Error naming the count when there is none).
  LOOM_INLINE OptimizerStep& steps_of(std::size_t k);
  /// Every optimizer's step sequence, in index order.
  LOOM_INLINE std::vector<OptimizerStep*> all_steps();
  /// The learning rate optimizer `k` steps at next (its scheduler's).
  double current_lr_of(std::size_t k) { return k == 0 ? current_lr_() : more_.at(k - 1).current_lr(); }
  /// After optimizer `k`'s step: its state bytes (the first time) and every optimizer's
  /// gradients zeroed, so each optimizer's next step sees only the backward that follows.
  LOOM_INLINE void finish_optimizer(std::size_t k);
  /// After start_up: the world, the device and the engine of the sharding policy `sharding`;
  /// seeds the generators. `args` must outlive this object.
  LOOM_INLINE void start(TrainingArguments& args, Startup up, const ShardingFacts& sharding);
  /// The checkpoint's JSON parts: scheduler.json, scaler.json, loop_state.json, then the
  /// registered ones.
  LOOM_INLINE std::vector<JsonPart> checkpoint_parts();
  /// The precision policy's part (scaler.json), set by Accelerator<...>.
  JsonPart precision_part_;

  TrainingArguments* run_args_ = nullptr;
  std::unique_ptr<TrainingArguments> own_args_;  // an Accelerator made from arguments owns them
  dist::World world_;
  torch::Device device_{torch::kCPU};
  std::shared_ptr<torch::nn::Module> module_owner_;  // before engine_: outlives the engine's hooks
  std::unique_ptr<dist::Engine> engine_;
  torch::nn::Module* module_ = nullptr;
  schedule::LRSchedulerBase* scheduler_ptr_ = nullptr;
  std::function<double()> current_lr_;  // the prepared scheduler's current_lr
  std::optional<OptimizerStep> steps_;  // after engine_: its optimizer steps views of the engine's storage
  /// An optimizer add_optimizer added (index 1, 2, ...), with its scheduler.
  struct FurtherOptimizer {
    std::unique_ptr<OptimizerStep> steps;
    schedule::LRSchedulerBase* scheduler = nullptr;
    std::function<double()> current_lr;
  };
  std::vector<FurtherOptimizer> more_;  // after engine_, as steps_
  std::unordered_map<const c10::TensorImpl*, std::size_t> held_;  // parameter -> the optimizer holding it
  bool scales_loss_ = false;  // the precision policy scales the loss (fp16): one optimizer only
  dist::StateBytes all_bytes_;  // model_state_bytes with several optimizers
  std::optional<Checkpointer> checkpointer_;
  std::optional<checkpoint::OutputDirLock> output_lock_;  // should_save: one run per output folder
  bool saves_ = true;  // should_save()
  TrainerState state_;
  LoopState loop_;
  ShardingFacts sharding_;  // the sharding policy's facts
  PrecisionFacts precision_facts_;  // the precision policy's, set by Accelerator<...>
  bool sync_buffers_ = false;  // broadcast rank 0's buffers before each training forward
  nlohmann::json resumed_loop_state_;
  std::vector<JsonPart> extra_parts_;
  std::optional<MemoryPlan> memory_plan_;
  std::optional<double> activation_bytes_;  // set_activation_estimate
  std::string activation_note_;
};

/// The Accelerator for a sharding and a precision tag (loom::sharding::*, loom::precision::*;
/// defaults NoShard and FP32), checked by the same concepts as the Trainer's.
template <class... Policies>
class Accelerator : public AcceleratorBase {
 public:
  using policies = PolicyBundle<Policies...>;
  using sharding_policy = typename policies::sharding;
  using precision_policy = typename policies::precision;
  using precision_type = precision::PrecisionImpl<precision_policy>;

  static_assert(ChosenAtRunTime<sharding_policy> || in_catalog<ShardingCatalog, sharding_policy>,
                "loom: the sharding policy is not in loom::ShardingCatalog (policy/tags.hpp)");
  static_assert(ChosenAtRunTime<precision_policy> || in_catalog<PrecisionCatalog, precision_policy>,
                "loom: the precision policy is not in loom::PrecisionCatalog (policy/tags.hpp)");
  static_assert(precision::PrecisionPolicy<precision_type>,
                "loom: the precision policy's PrecisionImpl does not provide the PrecisionPolicy interface");

  /// Checks `args` against the policies (--bf16 / --fp16 / --sharding follow them, as for the
  /// Trainer), joins the job (torchrun's variables) and seeds the generators with --seed.
  explicit Accelerator(TrainingArguments args) {
    own_args_ = std::make_unique<TrainingArguments>(std::move(args));
    const CompiledPolicies policies = compiled_policies(*own_args_, "");
    auto up = start_up(*own_args_, policies, /*has_eval_dataset=*/true);
    start(*own_args_, std::move(up), policies);
  }

  /// For a front end that keeps its own arguments (the Trainer): checks `args` in place against
  /// the policies and `schedule` (the compiled schedule's --lr_scheduler_type name, "" when
  /// chosen by that flag); `has_eval_dataset`: --eval_strategy may evaluate. `args` must
  /// outlive the Accelerator.
  Accelerator(TrainingArguments& args, std::string_view schedule, bool has_eval_dataset) {
    const CompiledPolicies policies = compiled_policies(args, schedule);
    start(args, start_up(args, policies, has_eval_dataset), policies);
  }

  /// Autocast for the forward and the loss (bf16, fp16; nothing under fp32).
  [[nodiscard]] precision::Autocast autocast() const { return precision_->autocast(); }
  /// Backpropagates `loss` through the precision policy (fp16: the scaled loss); the engine
  /// sees the loss first (--ddp_find_unused_parameters). Call end_micro_step after it.
  void backward(const torch::Tensor& loss) {
    const torch::Tensor scaled = precision_->scale_loss(loss);
    engine_->before_backward(scaled);
    scaled.backward();
  }
  /// Unscales the gradients (fp16) and clips them to a global norm of `max_norm` over every
  /// rank's part (0: no clipping, the norm only). Returns the norm (a device scalar).
  /// `k`: which optimizer's parameters (0: prepare_optimizer's, else add_optimizer's index).
  torch::Tensor clip_grad_norm(double max_norm, std::size_t k = 0) {
    auto& steps = steps_of(k);
    const auto& params = steps.params();
    precision_->unscale(params);
    return steps.clip(params, precision_->found_inf(), max_norm);
  }
  /// The optimizer step at the scheduler's learning rate, skipped on the device when fp16 found
  /// an overflow; returns that rate. Follow it with finish_step (or call step for both). `k`:
  /// which optimizer steps (0: prepare_optimizer's, else add_optimizer's index), at its own
  /// scheduler's rate.
  double optimizer_step(std::size_t k = 0) {
    settle_skip(k);
    const double lr = current_lr_of(k);
    steps_of(k).step(lr, precision_->found_inf());
    return lr;
  }
  /// After optimizer_step(k): the loss scale's update, optimizer k's scheduler's step (not after
  /// a skipped fp16 step, as HF), the gradients zeroed (with several optimizers, every
  /// optimizer's: a GAN's discriminator step starts from its own backward alone).
  void finish_step(std::size_t k = 0) {
    precision_->update();
    steps_of(k).after_update(precision_->found_inf());
    finish_optimizer(k);
  }
  /// optimizer_step then finish_step; returns the learning rate used.
  double step(std::size_t k = 0) {
    const double lr = optimizer_step(k);
    finish_step(k);
    return lr;
  }
  /// The precision policy's state (fp16: the loss scaler).
  [[nodiscard]] precision_type& precision() { return *precision_; }

  /// Reads the last optimizer step's fp16 skip flag (a host read; skipped_steps() is exact
  /// after it). After a skipped step it checks that the loss scale has not collapsed, a
  /// loom::Error below the floor. optimizer_step calls it for the step before; call it before
  /// reading skipped_steps(), saving or ending a run.
  void settle_skip(std::size_t k = 0) {
    auto& steps = steps_of(k);
    const int64_t before = steps.skipped_steps();
    steps.settle_skip();
    if constexpr (precision::ScalesLoss<precision_type>)
      if (steps.skipped_steps() != before) precision_->check_scale_floor(steps.skipped_steps(), state_.global_step);
  }

 protected:

  // The tags' facts; a tag chosen at run time takes the member `args` name.
  static CompiledPolicies compiled_policies(const TrainingArguments& args, std::string_view schedule_name) {
    CompiledPolicies p;
    if constexpr (ChosenAtRunTime<sharding_policy>) p.sharding = sharding_chosen(args);
    else p.sharding = sharding_policy::facts;
    if constexpr (ChosenAtRunTime<precision_policy>) p.precision = precision_chosen(args);
    else p.precision = precision_policy::facts;
    p.schedule = schedule_name;
    return p;
  }
  void start(TrainingArguments& args, Startup up, const CompiledPolicies& policies) {
    precision_.emplace(args, up.device);
    precision_part_ = json_part("scaler.json", *precision_);
    scales_loss_ = policies.precision.scales_loss;
    precision_facts_ = policies.precision;
    AcceleratorBase::start(args, std::move(up), policies.sharding);
  }
  std::optional<precision_type> precision_;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/accelerator.ipp>
#endif
