#pragma once
// TrainingArguments: an aggregate of group structs with Hugging Face's field names and
// defaults, read by reflection as one flat list (config/fields.hpp).
// Reflection (CLI, JSON, help) lives in config/reflect.hpp; run-time validation in
// config/validate.hpp. No torch include here, on purpose. The `///<` comments are also the
// --help descriptions: field_help() below repeats them as data.

#include <loom/config/field_help.hpp>
#include <loom/config/given_flags.hpp>
#include <loom/config/reflected.hpp>
#include <loom/policy/catalog.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <string>

namespace loom {

namespace training_groups {
// TrainingArguments' settings, one struct a group (config/fields.hpp reads them through
// TrainingArguments::loom_groups as one flat list). To add a setting: add the field, with its
// ///< comment, to the group it belongs to, and the same text to training_arguments_help
// below (docs/architecture.md, "Adding a flag").

/// TrainingArguments: output.
struct Output {
  std::string output_dir = "trainer_output";  ///< where checkpoints and results go
  bool overwrite_output_dir = false;          ///< start afresh in an output_dir that holds files or checkpoints (loom::last_checkpoint, HF's example rule)

  static constexpr std::string_view help_heading = "output";
};

/// TrainingArguments: what to run.
struct Run {
  bool do_train = false;    ///< run training (the program decides, as in HF; loom's examples honour it)
  bool do_eval = false;     ///< run evaluation on the validation set (as do_train)
  bool do_predict = false;  ///< run predictions on the test set (as do_train)

  static constexpr std::string_view help_heading = "what to run";
};

/// TrainingArguments: batches and data loading.
struct Batches {
  int64_t per_device_train_batch_size = 8;  ///< training batch per device (process)
  int64_t per_device_eval_batch_size = 8;   ///< evaluation batch per device (process)
  int64_t gradient_accumulation_steps = 1;  ///< micro-batches per optimizer step
  bool auto_find_batch_size = false;  ///< on out-of-memory, retry with per_device_train_batch_size x 0.9 until one fits (single process)
  std::optional<int64_t> eval_accumulation_steps;  ///< move predictions to CPU every N eval steps
  bool dataloader_drop_last = false;  ///< drop the last incomplete training batch
  int64_t dataloader_num_workers = 0;  ///< background threads preparing batches ahead (0: in the loop)
  std::optional<int64_t> dataloader_prefetch_factor;  ///< batches each worker prepares ahead (default 2; needs dataloader_num_workers > 0)
  bool dataloader_pin_memory = true;  ///< page-lock prepared batches for asynchronous copies to the GPU (with workers, on CUDA)
  std::string train_sampling_strategy = "random";  ///< random | sequential | group_by_length
  bool group_by_length = false;  ///< HF 4's name for --train_sampling_strategy group_by_length
  std::string length_column_name = "length";  ///< the dataset field holding each example's length (group_by_length)
  bool dataloader_persistent_workers = false;  ///< keep the worker threads between epochs (HF's; loom's workers are threads of this process, so both values read the same batches)
  bool dataloader_in_order = true;  ///< yield batches in sampler order (HF's default; false, as soon as ready, is refused: a run and its resume must read the same batches)

  static constexpr std::string_view help_heading = "batches and data loading";
};

/// TrainingArguments: optimizer.
struct Optimizer {
  std::string optim = std::string(optimizer::AdamWTorchFused::name);  ///< adamw_torch_fused | adamw_torch | adafactor | sgd | adagrad | rmsprop | lion
  std::optional<std::string> optim_args;    ///< HF's extra optimizer arguments, "momentum=0.9,nesterov=True"
  double learning_rate = 5e-5;              ///< peak learning rate
  double weight_decay = 0.0;                ///< weight decay of the decay group (decoupled for AdamW, Adafactor, Lion; L2 for SGD, Adagrad, RMSprop)
  double adam_beta1 = 0.9;                  ///< AdamW beta1
  double adam_beta2 = 0.999;                ///< AdamW beta2
  double adam_epsilon = 1e-8;               ///< AdamW epsilon
  double max_grad_norm = 1.0;               ///< clip the global gradient norm (0: off)
  double label_smoothing_factor = 0.0;      ///< label smoothing epsilon on the model's logits (0: off)
  std::optional<bool> chunked_lm_loss;  ///< a causal LM's LM head and cross-entropy in chunks of positions, never holding every position's float32 logits (Liger's fused linear cross-entropy), in training and --prediction_loss_only evaluation (default: where the scored positions' float32 logits would pass 64 MiB); loom's, not HF's
  bool gradient_checkpointing = false;      ///< recompute the activations of every FullShardUnit / Checkpointed block in backward (less memory, one more forward)
  std::optional<std::string> gradient_checkpointing_kwargs;  ///< HF's JSON object for it: only use_reentrant (true or false: loom recomputes the same way)
  std::optional<bool> activation_checkpointing;  ///< HF 5's name for --gradient_checkpointing, which it sets when given (HF's rule)
  std::optional<std::string> activation_checkpointing_kwargs;  ///< HF 5's name for --gradient_checkpointing_kwargs, which it sets when given
  bool use_cache = false;  ///< HF's: the model's use_cache, which the config.json of save_model and the checkpoints records (as HF's Trainer sets it); loom's training forward keeps no key/value cache either way (generation always uses one)
  std::optional<int64_t> torch_empty_cache_steps;  ///< on CUDA, return the caching allocator's free memory to the driver every N steps (HF's; slower, less fragmentation)
  std::optional<double> neftune_noise_alpha;  ///< NEFTune: uniform noise of this scale on the input embeddings while training (a model with neftune())

  static constexpr std::string_view help_heading = "optimizer";
};

/// TrainingArguments: length and schedule.
struct Schedule {
  double num_train_epochs = 3.0;              ///< epochs, when max_steps <= 0
  int64_t max_steps = -1;                     ///< optimizer steps; overrides num_train_epochs when > 0
  std::string lr_scheduler_type = "linear";   ///< HF scheduler name
  std::string lr_scheduler_kwargs = "{}";     ///< extra scheduler arguments as a JSON object
  double warmup_ratio = 0.0;                  ///< warmup as a fraction of max_steps
  double warmup_steps = 0;                    ///< warmup steps (a value below 1 is a fraction)

  static constexpr std::string_view help_heading = "length and schedule";
};

/// TrainingArguments: logging.
struct Logging {
  std::string logging_strategy = "steps";  ///< no | steps | epoch
  double logging_steps = 500;              ///< log every N steps (below 1: fraction of max_steps)
  bool logging_first_step = false;         ///< also log after the first step
  bool logging_nan_inf_filter = true;      ///< skip nan/inf losses when averaging for logs
  std::optional<std::string> logging_dir;  ///< TensorBoard folder (default output_dir/runs)
  bool disable_tqdm = false;               ///< hide the progress bar
  bool log_on_each_node = true;            ///< log on the local main process of every node
  std::optional<std::string> run_name;     ///< the run's name: TensorBoard's subfolder of logging_dir, a "run_name" field in log.jsonl
  std::string report_to = "none";          ///< built-in loggers added at run time, comma-separated: tensorboard, jsonl, all, none
  std::string log_level = "passive";       ///< debug | info | warning | error | critical | passive: the level of loom's messages on the process that logs (passive: warning)
  std::string log_level_replica = "warning";  ///< the same for the other ranks
  std::string include_num_input_tokens_seen = "no";  ///< no | all | non_padding (true: all, false: no): count input tokens

  static constexpr std::string_view help_heading = "logging";
};

/// TrainingArguments: evaluation.
struct Evaluation {
  std::string eval_strategy = "no";      ///< no | steps | epoch
  std::optional<std::string> evaluation_strategy;  ///< HF 4's name for --eval_strategy
  std::optional<double> eval_steps;      ///< evaluate every N steps (default: logging_steps)
  int64_t eval_delay = 0;                ///< epochs or steps to wait before the first evaluation
  bool eval_on_start = false;            ///< evaluate once before training
  bool prediction_loss_only = false;     ///< evaluation returns the loss only
  std::optional<std::string> label_names;  ///< the batch fields holding the labels, comma-separated (default: labels)
  std::string include_for_metrics = "";   ///< what compute_metrics also gets, comma-separated: inputs, loss
  bool batch_eval_metrics = false;  ///< call compute_metrics(prediction, compute_result) per batch, keeping nothing (compute_result true on the last)
  bool eval_do_concat_batches = true;  ///< compute_metrics gets the predictions of all batches concatenated (HF's default; false, a list per batch, is refused: --batch_eval_metrics hands over one batch at a time)
  bool predict_with_generate = false;  ///< evaluation generates (a causal LM: each row's completion from its prompt) and hands the generated ids to compute_metrics
  std::optional<int64_t> generation_max_length;  ///< --predict_with_generate: max_length, prompt plus new tokens (default: the batch's longest reference completion as new tokens)
  std::optional<int64_t> generation_num_beams;   ///< --predict_with_generate: beams (1 only: beam search is not implemented)

  static constexpr std::string_view help_heading = "evaluation";
};

/// TrainingArguments: saving.
struct Saving {
  std::string save_strategy = "steps";        ///< no | steps | epoch | best
  double save_steps = 500;                    ///< save every N steps (below 1: fraction)
  std::optional<int64_t> save_total_limit;    ///< keep at most N checkpoints
  bool save_only_model = false;               ///< skip optimizer/scheduler/RNG state
  bool save_on_each_node = false;             ///< several nodes: the local main process of each node writes checkpoints and models into its own output_dir (storage not shared)
  bool load_best_model_at_end = false;        ///< reload the best checkpoint after training
  std::optional<std::string> metric_for_best_model;  ///< metric that decides "best"
  std::optional<bool> greater_is_better;      ///< direction of metric_for_best_model
  std::optional<std::string> resume_from_checkpoint;  ///< a checkpoint folder, or "latest" / "true" (the last in output_dir)
  bool ignore_data_skip = false;  ///< when resuming, start the resumed epoch at its first batch instead of where the checkpoint stopped (HF's; loom's resume reads nothing it skips, so skipping costs no time and this only changes which batches train)
  bool restore_callback_states_from_checkpoint = false;  ///< on resume, restore stateful callbacks and TrainerControl

  static constexpr std::string_view help_heading = "saving";
};

/// Initial weights (a loom extension: HF keeps this in the example scripts).
struct Weights {
  std::optional<std::string> model_name_or_path;  ///< start from DIR/model.safetensors (strict match)

  static constexpr std::string_view help_heading = "initial weights";
};

/// TrainingArguments: reproducibility.
struct Reproducibility {
  int64_t seed = 42;                 ///< seed for initialization and shuffling
  std::optional<int64_t> data_seed;  ///< seed for shuffling only
  bool full_determinism = false;     ///< deterministic algorithms only, cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:16:8, CUDA_LAUNCH_BLOCKING=1 (HF's enable_full_determinism)
  bool deterministic = false;        ///< deterministic algorithms only, cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set to :4096:8 or :16:8, no blocking launches: --full_determinism's repeatable results without its cost (Lightning's deterministic=True)

  static constexpr std::string_view help_heading = "reproducibility";
};

/// TrainingArguments: precision and devices.
struct Precision {
  bool bf16 = false;               ///< bfloat16 autocast (precision::BF16)
  bool fp16 = false;               ///< float16 autocast with loss scaling (precision::FP16)
  bool use_cpu = false;            ///< train on the CPU even when CUDA is available
  bool bf16_full_eval = false;     ///< evaluate outside training with the model cast to bfloat16 (no autocast)
  bool fp16_full_eval = false;     ///< evaluate outside training with the model cast to float16 (no autocast)
  std::optional<bool> tf32;        ///< allow TF32 matrix multiplies and convolutions on CUDA (default: torch's setting)
  bool skip_memory_metrics = true; ///< skip memory reports
  bool skip_memory_check = false;  ///< start even when the memory plan (printed at start-up: parameters, gradients, optimizer state, gathered units, activations per rank) exceeds the device's memory; loom's, not HF's
  std::optional<std::string> max_memory;  ///< the memory each process may use ("10GiB", "1500MB"; accelerate's max_memory for one device): what the memory plan checks against instead of the device's memory (a CPU run: this machine's memory over its processes); loom's, not HF's
  bool include_tokens_per_second = false;  ///< add train_tokens_per_second (items counted by num_items)

  static constexpr std::string_view help_heading = "precision and devices";
};

/// TrainingArguments: fp16's loss scale (a --deepspeed config's fp16 section sets these).
struct LossScale {
  std::string loss_scale_rule = "torch";              ///< torch | deepspeed: how --fp16's dynamic loss scale moves: torch.amp's GradScaler (HF's: x2 after loss_scale_window clean steps in a row, x0.5 at each overflow) or DeepSpeed's DynamicLossScaler (x2 each time loss_scale_window clean steps have passed since the last overflow, x0.5 only after loss_scale_hysteresis overflows); a --deepspeed config's fp16 section chooses deepspeed; loom's, not HF's
  double initial_loss_scale = 65536.0;                ///< --fp16: the first loss scale (DeepSpeed's 2^initial_scale_power)
  std::optional<int64_t> loss_scale_window;           ///< --fp16: clean steps before the scale doubles (default: 2000 under torch, 1000 under deepspeed)
  std::optional<int64_t> loss_scale_hysteresis;       ///< --fp16 under deepspeed: overflows the scale absorbs before it halves (DeepSpeed's hysteresis; default 2)
  bool consecutive_hysteresis = false;                ///< --fp16 under deepspeed: a clean step refills the hysteresis (DeepSpeed's consecutive_hysteresis)
  double min_loss_scale = 1.0;                        ///< --fp16: the smallest loss scale; an overflow there stops the run with a loom: error (DeepSpeed's min_loss_scale)

  static constexpr std::string_view help_heading = "fp16 loss scale";
};

/// TrainingArguments: distributed.
struct Distributed {
  std::string sharding = "auto";              ///< auto | no | ddp | zero1 | zero2 | full_shard (auto: ddp when started as several processes, else no)
  std::string sharding_param_dtype = std::string(sharding_dtype::Float32::name);  ///< fp32 | bf16: the format full_shard gathers parameters in and computes with (FSDP2's MixedPrecisionPolicy param_dtype; bf16 needs --bf16); master shards and optimizer state stay fp32
  std::optional<std::string> sharding_reduce_dtype;  ///< fp32 | bf16: the format ddp, zero1, zero2 and full_shard reduce gradients in (FSDP2's reduce_dtype; default: --sharding_param_dtype's, as FSDP2); the result is accumulated in fp32
  int64_t ddp_timeout = 1800;                 ///< collective timeout in seconds
  bool average_tokens_across_devices = true;  ///< several processes: each rank's gradient weighs by its share of the accumulation group's items (tokens) over every rank, as one process with the global batch (HF's default); false: each rank normalizes by its own items and the ranks average
  std::optional<int64_t> ddp_bucket_cap_mb;   ///< DDP bucket size (default 25)
  std::optional<bool> ddp_broadcast_buffers;  ///< DDP, ZeRO-1/2: copy rank 0's buffers (BatchNorm statistics) before each training forward (default: true)
  std::optional<bool> ddp_find_unused_parameters;  ///< DDP, ZeRO-1/2: find the parameters the loss does not reach, so their buckets need not wait for them, and skip in the optimizer step those no rank used (default: false; HF's is true without --gradient_checkpointing)
  std::optional<bool> ddp_static_graph;  ///< DDP's static_graph: loom's buckets and their launch order are fixed at start-up whatever this says, as static_graph makes them in torch
  bool offload_optimizer = false;  ///< ZeRO-1/2, FullShard: keep each rank's optimizer state in host memory and run the optimizer step there (DeepSpeed's offload_optimizer with device cpu, FSDP's CPUOffload)
  bool offload_param = false;      ///< FullShard: keep each rank's fp32 parameter shard (the master weights) in host memory and copy it to the device for each gather; needs --offload_optimizer (DeepSpeed's offload_param with device cpu, FSDP's CPUOffload(offload_params=True))
  int64_t local_rank = -1;                    ///< accepted from torch.distributed.launch; the rank comes from LOCAL_RANK
  std::optional<std::string> deepspeed;       ///< a DeepSpeed config (JSON file or text): zero_optimization.stage 0/1/2/3 picks --sharding ddp/zero1/zero2/full_shard; the batch, accumulation, clipping, optimizer and precision keys must be "auto" or agree with the flags (HF's rule); a key loom does not honour is refused
  std::optional<std::string> fsdp_config;     ///< FSDP's settings for --fsdp (JSON file or text): activation_checkpointing; other keys are refused by name
  std::optional<std::string> fsdp_transformer_layer_cls_to_wrap;  ///< full_shard: only the FullShardUnits wrapping these block classes (comma-separated, e.g. LlamaDecoderLayer) are units; the others join the unit around them
  int64_t fsdp_min_num_params = 0;            ///< full_shard: a FullShardUnit is a unit when it holds at least this many parameters outside the units inside it (HF's size-based auto wrap; 0: every unit)
  bool fsdp_forward_prefetch = false;         ///< full_shard: gather the next unit while this one's forward runs (accelerate's forward_prefetch; off, as HF's Trainer configures FSDP: one unit gathered at a time)
  std::string fsdp_backward_prefetch = "no_prefetch";  ///< no_prefetch | backward_pre | backward_post: full_shard gathers the unit whose backward comes next when this unit's backward starts (pre) or once its gradients are computed (post) (accelerate's backward_prefetch; HF's Trainer default: no_prefetch)
  std::optional<std::string> fsdp;            ///< HF's FSDP words: full_shard (--sharding full_shard), shard_grad_op (zero2) or no_shard (ddp)

  static constexpr std::string_view help_heading = "distributed";
};

/// TrainingArguments' one field that is not a setting.
struct Record {
  /// The settings the command line or a JSON settings file gave explicitly (filled by
  /// loom::parse_args; no flag, no --help line, not in training_args.json).
  GivenFlags given;
};
}  // namespace training_groups

/// Every knob of a training run, named and defaulted as in transformers.TrainingArguments.
///
/// The settings live in group structs (training_groups::Output, ::Optimizer, ...), its base
/// classes (through loom::Grouped): code reads `args.learning_rate` as before, while flags,
/// JSON keys, training_args.json and --help see one flat list of HF's names. Each group is
/// held to Boost.PFR's 100 fields; the whole has no limit.
struct TrainingArguments : Grouped<training_groups::Output, training_groups::Run, training_groups::Batches,
                                   training_groups::Optimizer, training_groups::Schedule, training_groups::Logging,
                                   training_groups::Evaluation, training_groups::Saving, training_groups::Weights,
                                   training_groups::Reproducibility, training_groups::Precision,
                                   training_groups::LossScale, training_groups::Distributed,
                                   training_groups::Record> {
  static constexpr std::string_view help_heading = "TrainingArguments";  ///< --help's heading (the groups' own are sub-headings)
};

namespace detail {
// The --help text of each field: the `///<` comment above, word for word
// (tests/config/test_reflect.cpp compares the two, and checks that every field is here).
inline constexpr FieldHelp training_arguments_help[] = {
    {"output_dir", "where checkpoints and results go"},
    {"overwrite_output_dir", "start afresh in an output_dir that holds files or checkpoints (loom::last_checkpoint, HF's example rule)"},
    {"do_train", "run training (the program decides, as in HF; loom's examples honour it)"},
    {"do_eval", "run evaluation on the validation set (as do_train)"},
    {"do_predict", "run predictions on the test set (as do_train)"},
    {"per_device_train_batch_size", "training batch per device (process)"},
    {"per_device_eval_batch_size", "evaluation batch per device (process)"},
    {"gradient_accumulation_steps", "micro-batches per optimizer step"},
    {"auto_find_batch_size", "on out-of-memory, retry with per_device_train_batch_size x 0.9 until one fits (single process)"},
    {"eval_accumulation_steps", "move predictions to CPU every N eval steps"},
    {"dataloader_drop_last", "drop the last incomplete training batch"},
    {"dataloader_num_workers", "background threads preparing batches ahead (0: in the loop)"},
    {"dataloader_prefetch_factor", "batches each worker prepares ahead (default 2; needs dataloader_num_workers > 0)"},
    {"dataloader_pin_memory", "page-lock prepared batches for asynchronous copies to the GPU (with workers, on CUDA)"},
    {"train_sampling_strategy", "random | sequential | group_by_length"},
    {"group_by_length", "HF 4's name for --train_sampling_strategy group_by_length"},
    {"length_column_name", "the dataset field holding each example's length (group_by_length)"},
    {"dataloader_persistent_workers", "keep the worker threads between epochs (HF's; loom's workers are threads of this process, so both values read the same batches)"},
    {"dataloader_in_order", "yield batches in sampler order (HF's default; false, as soon as ready, is refused: a run and its resume must read the same batches)"},
    {"optim", names_text<OptimizerCatalog, "", " | ", "">},
    {"optim_args", "HF's extra optimizer arguments, \"momentum=0.9,nesterov=True\""},
    {"learning_rate", "peak learning rate"},
    {"weight_decay", "weight decay of the decay group (decoupled for AdamW, Adafactor, Lion; L2 for SGD, Adagrad, RMSprop)"},
    {"adam_beta1", "AdamW beta1"},
    {"adam_beta2", "AdamW beta2"},
    {"adam_epsilon", "AdamW epsilon"},
    {"max_grad_norm", "clip the global gradient norm (0: off)"},
    {"label_smoothing_factor", "label smoothing epsilon on the model's logits (0: off)"},
    {"chunked_lm_loss", "a causal LM's LM head and cross-entropy in chunks of positions, never holding every position's float32 logits (Liger's fused linear cross-entropy), in training and --prediction_loss_only evaluation (default: where the scored positions' float32 logits would pass 64 MiB); loom's, not HF's"},
    {"gradient_checkpointing", "recompute the activations of every FullShardUnit / Checkpointed block in backward (less memory, one more forward)"},
    {"gradient_checkpointing_kwargs", "HF's JSON object for it: only use_reentrant (true or false: loom recomputes the same way)"},
    {"activation_checkpointing", "HF 5's name for --gradient_checkpointing, which it sets when given (HF's rule)"},
    {"activation_checkpointing_kwargs", "HF 5's name for --gradient_checkpointing_kwargs, which it sets when given"},
    {"use_cache", "HF's: the model's use_cache, which the config.json of save_model and the checkpoints records (as HF's Trainer sets it); loom's training forward keeps no key/value cache either way (generation always uses one)"},
    {"torch_empty_cache_steps", "on CUDA, return the caching allocator's free memory to the driver every N steps (HF's; slower, less fragmentation)"},
    {"neftune_noise_alpha", "NEFTune: uniform noise of this scale on the input embeddings while training (a model with neftune())"},
    {"num_train_epochs", "epochs, when max_steps <= 0"},
    {"max_steps", "optimizer steps; overrides num_train_epochs when > 0"},
    {"lr_scheduler_type", "HF scheduler name"},
    {"lr_scheduler_kwargs", "extra scheduler arguments as a JSON object"},
    {"warmup_ratio", "warmup as a fraction of max_steps"},
    {"warmup_steps", "warmup steps (a value below 1 is a fraction)"},
    {"logging_strategy", "no | steps | epoch"},
    {"logging_steps", "log every N steps (below 1: fraction of max_steps)"},
    {"logging_first_step", "also log after the first step"},
    {"logging_nan_inf_filter", "skip nan/inf losses when averaging for logs"},
    {"logging_dir", "TensorBoard folder (default output_dir/runs)"},
    {"disable_tqdm", "hide the progress bar"},
    {"log_on_each_node", "log on the local main process of every node"},
    {"run_name", "the run's name: TensorBoard's subfolder of logging_dir, a \"run_name\" field in log.jsonl"},
    {"report_to", "built-in loggers added at run time, comma-separated: tensorboard, jsonl, all, none"},
    {"log_level", "debug | info | warning | error | critical | passive: the level of loom's messages on the process that logs (passive: warning)"},
    {"log_level_replica", "the same for the other ranks"},
    {"include_num_input_tokens_seen", "no | all | non_padding (true: all, false: no): count input tokens"},
    {"eval_strategy", "no | steps | epoch"},
    {"evaluation_strategy", "HF 4's name for --eval_strategy"},
    {"eval_steps", "evaluate every N steps (default: logging_steps)"},
    {"eval_delay", "epochs or steps to wait before the first evaluation"},
    {"eval_on_start", "evaluate once before training"},
    {"prediction_loss_only", "evaluation returns the loss only"},
    {"label_names", "the batch fields holding the labels, comma-separated (default: labels)"},
    {"include_for_metrics", "what compute_metrics also gets, comma-separated: inputs, loss"},
    {"batch_eval_metrics", "call compute_metrics(prediction, compute_result) per batch, keeping nothing (compute_result true on the last)"},
    {"eval_do_concat_batches", "compute_metrics gets the predictions of all batches concatenated (HF's default; false, a list per batch, is refused: --batch_eval_metrics hands over one batch at a time)"},
    {"predict_with_generate", "evaluation generates (a causal LM: each row's completion from its prompt) and hands the generated ids to compute_metrics"},
    {"generation_max_length", "--predict_with_generate: max_length, prompt plus new tokens (default: the batch's longest reference completion as new tokens)"},
    {"generation_num_beams", "--predict_with_generate: beams (1 only: beam search is not implemented)"},
    {"save_strategy", "no | steps | epoch | best"},
    {"save_steps", "save every N steps (below 1: fraction)"},
    {"save_total_limit", "keep at most N checkpoints"},
    {"save_only_model", "skip optimizer/scheduler/RNG state"},
    {"save_on_each_node", "several nodes: the local main process of each node writes checkpoints and models into its own output_dir (storage not shared)"},
    {"load_best_model_at_end", "reload the best checkpoint after training"},
    {"metric_for_best_model", "metric that decides \"best\""},
    {"greater_is_better", "direction of metric_for_best_model"},
    {"resume_from_checkpoint", "a checkpoint folder, or \"latest\" / \"true\" (the last in output_dir)"},
    {"ignore_data_skip", "when resuming, start the resumed epoch at its first batch instead of where the checkpoint stopped (HF's; loom's resume reads nothing it skips, so skipping costs no time and this only changes which batches train)"},
    {"restore_callback_states_from_checkpoint", "on resume, restore stateful callbacks and TrainerControl"},
    {"model_name_or_path", "start from DIR/model.safetensors (strict match)"},
    {"seed", "seed for initialization and shuffling"},
    {"data_seed", "seed for shuffling only"},
    {"full_determinism", "deterministic algorithms only, cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:16:8, CUDA_LAUNCH_BLOCKING=1 (HF's enable_full_determinism)"},
    {"deterministic", "deterministic algorithms only, cuDNN deterministic, CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set to :4096:8 or :16:8, no blocking launches: --full_determinism's repeatable results without its cost (Lightning's deterministic=True)"},
    {precision::BF16::name, "bfloat16 autocast (precision::BF16)"},
    {precision::FP16::name, "float16 autocast with loss scaling (precision::FP16)"},
    {"use_cpu", "train on the CPU even when CUDA is available"},
    {"bf16_full_eval", "evaluate outside training with the model cast to bfloat16 (no autocast)"},
    {"fp16_full_eval", "evaluate outside training with the model cast to float16 (no autocast)"},
    {"tf32", "allow TF32 matrix multiplies and convolutions on CUDA (default: torch's setting)"},
    {"skip_memory_metrics", "skip memory reports"},
    {"skip_memory_check", "start even when the memory plan (printed at start-up: parameters, gradients, optimizer state, gathered units, activations per rank) exceeds the device's memory; loom's, not HF's"},
    {"max_memory", "the memory each process may use (\"10GiB\", \"1500MB\"; accelerate's max_memory for one device): what the memory plan checks against instead of the device's memory (a CPU run: this machine's memory over its processes); loom's, not HF's"},
    {"include_tokens_per_second", "add train_tokens_per_second (items counted by num_items)"},
    {"loss_scale_rule", "torch | deepspeed: how --fp16's dynamic loss scale moves: torch.amp's GradScaler (HF's: x2 after loss_scale_window clean steps in a row, x0.5 at each overflow) or DeepSpeed's DynamicLossScaler (x2 each time loss_scale_window clean steps have passed since the last overflow, x0.5 only after loss_scale_hysteresis overflows); a --deepspeed config's fp16 section chooses deepspeed; loom's, not HF's"},
    {"initial_loss_scale", "--fp16: the first loss scale (DeepSpeed's 2^initial_scale_power)"},
    {"loss_scale_window", "--fp16: clean steps before the scale doubles (default: 2000 under torch, 1000 under deepspeed)"},
    {"loss_scale_hysteresis", "--fp16 under deepspeed: overflows the scale absorbs before it halves (DeepSpeed's hysteresis; default 2)"},
    {"consecutive_hysteresis", "--fp16 under deepspeed: a clean step refills the hysteresis (DeepSpeed's consecutive_hysteresis)"},
    {"min_loss_scale", "--fp16: the smallest loss scale; an overflow there stops the run with a loom: error (DeepSpeed's min_loss_scale)"},
    {"sharding", names_text<ShardingCatalog, "auto | ", " | ", " (auto: ddp when started as several processes, else no)">},
    {"sharding_param_dtype", names_text<ShardingDtypeCatalog, "", " | ", ": the format full_shard gathers parameters in and computes with (FSDP2's MixedPrecisionPolicy param_dtype; bf16 needs --bf16); master shards and optimizer state stay fp32">},
    {"sharding_reduce_dtype", names_text<ShardingDtypeCatalog, "", " | ", ": the format ddp, zero1, zero2 and full_shard reduce gradients in (FSDP2's reduce_dtype; default: --sharding_param_dtype's, as FSDP2); the result is accumulated in fp32">},
    {"ddp_timeout", "collective timeout in seconds"},
    {"average_tokens_across_devices", "several processes: each rank's gradient weighs by its share of the accumulation group's items (tokens) over every rank, as one process with the global batch (HF's default); false: each rank normalizes by its own items and the ranks average"},
    {"ddp_bucket_cap_mb", "DDP bucket size (default 25)"},
    {"ddp_broadcast_buffers", "DDP, ZeRO-1/2: copy rank 0's buffers (BatchNorm statistics) before each training forward (default: true)"},
    {"ddp_find_unused_parameters", "DDP, ZeRO-1/2: find the parameters the loss does not reach, so their buckets need not wait for them, and skip in the optimizer step those no rank used (default: false; HF's is true without --gradient_checkpointing)"},
    {"ddp_static_graph", "DDP's static_graph: loom's buckets and their launch order are fixed at start-up whatever this says, as static_graph makes them in torch"},
    {"offload_optimizer", "ZeRO-1/2, FullShard: keep each rank's optimizer state in host memory and run the optimizer step there (DeepSpeed's offload_optimizer with device cpu, FSDP's CPUOffload)"},
    {"offload_param", "FullShard: keep each rank's fp32 parameter shard (the master weights) in host memory and copy it to the device for each gather; needs --offload_optimizer (DeepSpeed's offload_param with device cpu, FSDP's CPUOffload(offload_params=True))"},
    {"local_rank", "accepted from torch.distributed.launch; the rank comes from LOCAL_RANK"},
    {"deepspeed", "a DeepSpeed config (JSON file or text): zero_optimization.stage 0/1/2/3 picks --sharding "
                  "ddp/zero1/zero2/full_shard; the batch, accumulation, clipping, optimizer and precision keys must be "
                  "\"auto\" or agree with the flags (HF's rule); a key loom does not honour is refused"},
    {"fsdp_config", "FSDP's settings for --fsdp (JSON file or text): activation_checkpointing; other keys are refused "
                    "by name"},
    {"fsdp_transformer_layer_cls_to_wrap", "full_shard: only the FullShardUnits wrapping these block classes (comma-separated, e.g. LlamaDecoderLayer) are units; the others join the unit around them"},
    {"fsdp_min_num_params", "full_shard: a FullShardUnit is a unit when it holds at least this many parameters outside the units inside it (HF's size-based auto wrap; 0: every unit)"},
    {"fsdp_forward_prefetch", "full_shard: gather the next unit while this one's forward runs (accelerate's forward_prefetch; off, as HF's Trainer configures FSDP: one unit gathered at a time)"},
    {"fsdp_backward_prefetch", "no_prefetch | backward_pre | backward_post: full_shard gathers the unit whose backward comes next when this unit's backward starts (pre) or once its gradients are computed (post) (accelerate's backward_prefetch; HF's Trainer default: no_prefetch)"},
    {"fsdp", "HF's FSDP words: full_shard (--sharding full_shard), shard_grad_op (zero2) or no_shard (ddp)"},
};
}  // namespace detail

/// The descriptions --help shows for TrainingArguments (found by ADL, config/field_help.hpp).
constexpr std::span<const FieldHelp> field_help(HelpFor<TrainingArguments>) { return detail::training_arguments_help; }

namespace detail {
// The names of training_arguments_help, which lists every setting in declaration order
// (check_struct, compiled once with Reflected<TrainingArguments>, asserts it).
inline constexpr auto training_arguments_names = [] {
  std::array<std::string_view, std::size(training_arguments_help)> out{};
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = training_arguments_help[i].name;
  return out;
}();
}  // namespace detail

/// TrainingArguments' setting names as constants (config/fields.hpp): the check that no flag
/// of a program's own structs is also a TrainingArguments flag reads them without reflecting.
constexpr const auto& setting_name_table(HelpFor<TrainingArguments>) { return detail::training_arguments_names; }

#if defined(LOOM_SEPARATE_COMPILATION)
namespace detail {
// Reflecting TrainingArguments' settings (the setters, --help, the compile-time checks) is
// compiled once, in loom::compiled (config/impl/reflected.ipp), not in every program that
// parses it (config/reflected.hpp).
extern template struct Reflected<TrainingArguments>;
}  // namespace detail
#endif

}  // namespace loom
