#pragma once
// The policy catalog: every family's members, each declared once with its names and traits,
// and one list per family. This folder is loom's bottom layer (no include of loom above it),
// so the argument checks (config/validate), --help, the runtime selector, start-up and the
// factories all read the same lists. The code that gives a member its meaning lives in its
// own file: distributed/ (a sharding engine and its ShardingImpl), precision/ (PrecisionImpl),
// schedule/ (ScheduleImpl), optim/ (an update rule). docs/architecture.md says what to touch
// to add a member.

#include <array>
#include <string_view>
#include <tuple>

namespace loom {

/// Policy families; a tag names its family through a nested `loom_family` type.
namespace family {
struct Sharding {};   ///< how parameters, gradients and optimizer state are laid out
struct Precision {};  ///< the numeric format of forward/backward
struct Schedule {};   ///< the learning-rate schedule
struct Callbacks {};  ///< the pack of user callbacks
struct Optimizer {};  ///< the update rule (--optim; chosen at run time, not a Trainer type argument)
}  // namespace family

// ---- sharding ----------------------------------------------------------------------------

/// What a sharding policy does, as start-up, the Accelerator and the docs read it.
struct ShardingFacts {
  std::string_view name;                ///< its --sharding value
  bool uses_comm = false;               ///< needs a process group (several processes)
  bool replicates_model = false;        ///< every rank keeps every parameter and buffer (DDP's broadcast_buffers applies)
  bool shards_optimizer_state = false;  ///< each rank steps and keeps a flat range of the optimizer state
  bool shards_gradients = false;        ///< each rank keeps the gradient of its range only
  bool shards_parameters = false;       ///< parameters live sharded and are gathered per unit: every forward is a collective
  int deepspeed_stage = -1;             ///< the DeepSpeed zero_optimization.stage it runs (--deepspeed; -1: none)
  std::string_view fsdp_option{};       ///< the HF --fsdp word that selects it ("": none)
};

namespace sharding {
/// One process, or every process holding everything (the default).
struct NoShard {
  using loom_family = family::Sharding;
  static constexpr ShardingFacts facts{.name = "no", .replicates_model = true};
  static constexpr std::string_view name = facts.name;
};
/// Data parallel: every rank holds everything; gradients all-reduced in buckets during backward.
struct DDP {
  using loom_family = family::Sharding;
  static constexpr ShardingFacts facts{
      .name = "ddp", .uses_comm = true, .replicates_model = true, .deepspeed_stage = 0, .fsdp_option = "no_shard"};
  static constexpr std::string_view name = facts.name;
};
/// ZeRO stage 1: optimizer state partitioned across ranks.
struct ZeRO1 {
  using loom_family = family::Sharding;
  static constexpr ShardingFacts facts{
      .name = "zero1", .uses_comm = true, .replicates_model = true, .shards_optimizer_state = true, .deepspeed_stage = 1};
  static constexpr std::string_view name = facts.name;
};
/// ZeRO stage 2: optimizer state and gradients partitioned across ranks.
struct ZeRO2 {
  using loom_family = family::Sharding;
  static constexpr ShardingFacts facts{.name = "zero2", .uses_comm = true, .replicates_model = true,
                                       .shards_optimizer_state = true, .shards_gradients = true,
                                       .deepspeed_stage = 2, .fsdp_option = "shard_grad_op"};
  static constexpr std::string_view name = facts.name;
};
/// ZeRO stage 3 / FSDP: parameters too, gathered per FullShardUnit around its forward and backward.
struct FullShard {
  using loom_family = family::Sharding;
  static constexpr std::string_view spelled = "full_shard";  // loom's --sharding value and HF's --fsdp word
  static constexpr ShardingFacts facts{.name = spelled, .uses_comm = true, .shards_optimizer_state = true,
                                       .shards_gradients = true, .shards_parameters = true,
                                       .deepspeed_stage = 3, .fsdp_option = spelled};
  static constexpr std::string_view name = facts.name;
};
/// The member of ShardingCatalog that --sharding names, chosen when the run starts (auto, the
/// default: ddp when torchrun started several processes, else no; --deepspeed / --fsdp choose
/// too). One Trainer type serves every value, where select_policies instantiates one per
/// value. Not itself a catalog member.
struct FromArgs {
  using loom_family = family::Sharding;
  static constexpr bool chosen_at_run_time = true;
};
}  // namespace sharding

/// A sharding or precision tag whose member is chosen from the arguments when the run starts
/// (sharding::FromArgs, precision::FromArgs).
template <class Tag>
concept ChosenAtRunTime = Tag::chosen_at_run_time;

/// Every sharding policy, in --sharding's order; the first is the default.
using ShardingCatalog =
    std::tuple<sharding::NoShard, sharding::DDP, sharding::ZeRO1, sharding::ZeRO2, sharding::FullShard>;

// ---- precision ---------------------------------------------------------------------------

/// What a precision policy is, as the flags, start-up and the docs read it.
struct PrecisionFacts {
  std::string_view name;       ///< the TrainingArguments bool that selects it (--bf16), or its name when none does
  std::string_view type_name;  ///< the tag's name in loom::precision (messages)
  bool has_flag = false;       ///< selected by the bool flag `name`; the member without one is the default
  bool scales_loss = false;    ///< scales the loss and may skip steps (dynamic loss scaling)
};

namespace precision {
/// float32 everywhere (the default).
struct FP32 {
  using loom_family = family::Precision;
  static constexpr PrecisionFacts facts{.name = "fp32", .type_name = "FP32"};
  static constexpr std::string_view name = facts.name;
};
/// bfloat16 autocast for forward and loss; float32 master weights and optimizer state.
struct BF16 {
  using loom_family = family::Precision;
  static constexpr PrecisionFacts facts{.name = "bf16", .type_name = "BF16", .has_flag = true};
  static constexpr std::string_view name = facts.name;
};
/// float16 autocast plus dynamic loss scaling; float32 master weights and optimizer state.
struct FP16 {
  using loom_family = family::Precision;
  static constexpr PrecisionFacts facts{.name = "fp16", .type_name = "FP16", .has_flag = true, .scales_loss = true};
  static constexpr std::string_view name = facts.name;
};
/// The member of PrecisionCatalog that --bf16 / --fp16 name (neither: FP32), chosen when the
/// run starts; one Trainer type for every value (precision/from_args.hpp). Not itself a
/// catalog member.
struct FromArgs {
  using loom_family = family::Precision;
  static constexpr bool chosen_at_run_time = true;
};
}  // namespace precision

/// Every precision policy; the first is the default (no flag set).
using PrecisionCatalog = std::tuple<precision::FP32, precision::BF16, precision::FP16>;

// ---- sharding dtypes ----------------------------------------------------------------------

/// A format a sharding engine communicates in: FSDP2's MixedPrecisionPolicy `param_dtype` (the
/// parameters FullShard gathers, and computes with) and `reduce_dtype` (the gradients the
/// engines reduce), set by --sharding_param_dtype and --sharding_reduce_dtype. Master weights,
/// gradient shards and optimizer state stay float32 whatever these are.
struct ShardingDtypeFacts {
  std::string_view name;  ///< the flag's value: the name of the precision policy of that format
  int bytes = 4;          ///< bytes per element on the wire
};

namespace sharding_dtype {
/// float32, the master weights' own format: nothing is cast (the default).
struct Float32 {
  static constexpr ShardingDtypeFacts facts{.name = precision::FP32::name, .bytes = 4};
  static constexpr std::string_view name = facts.name;
};
/// bfloat16: half the bytes of float32, with its exponent range (no loss scaling needed).
struct BFloat16 {
  static constexpr ShardingDtypeFacts facts{.name = precision::BF16::name, .bytes = 2};
  static constexpr std::string_view name = facts.name;
};
}  // namespace sharding_dtype

/// Every value of --sharding_param_dtype and --sharding_reduce_dtype; the first is the default.
using ShardingDtypeCatalog = std::tuple<sharding_dtype::Float32, sharding_dtype::BFloat16>;

// ---- schedule ----------------------------------------------------------------------------

namespace schedule {
/// The schedule named by TrainingArguments::lr_scheduler_type, chosen at run time (the default).
struct FromArgs {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "";
};
/// Linear warmup, then linear decay to 0 (HF "linear").
struct Linear {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "linear";
};
/// Constant learning rate (HF "constant").
struct Constant {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "constant";
};
/// Linear warmup, then constant (HF "constant_with_warmup").
struct ConstantWithWarmup {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "constant_with_warmup";
};
/// Linear warmup, then half a cosine wave down to 0 (HF "cosine").
struct Cosine {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "cosine";
};
/// Cosine with hard restarts, num_cycles (default 1) of them (HF "cosine_with_restarts").
struct CosineWithRestarts {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "cosine_with_restarts";
};
/// Warmup, then polynomial decay to lr_end (HF "polynomial").
struct Polynomial {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "polynomial";
};
/// Warmup, then 1 / sqrt(step / timescale) (HF "inverse_sqrt").
struct InverseSqrt {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "inverse_sqrt";
};
/// Divide the rate by `factor` when the evaluation metric stops improving (HF "reduce_lr_on_plateau").
struct ReduceLROnPlateau {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "reduce_lr_on_plateau";
  /// Steps on an evaluation metric, not on the step count: it needs evaluation, and watches
  /// metric_for_best_model (the loss by default).
  static constexpr bool steps_on_metric = true;
};
/// Cosine decay to a floor (HF "cosine_with_min_lr").
struct CosineWithMinLR {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "cosine_with_min_lr";
};
/// Cosine decay to a floor, warmup starting above 0 (HF "cosine_warmup_with_min_lr").
struct CosineWarmupWithMinLR {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "cosine_warmup_with_min_lr";
};
/// Warmup, stable, decay (HF "warmup_stable_decay").
struct WarmupStableDecay {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "warmup_stable_decay";
};
/// DeepSpeed's WarmupLR: log or linear warmup from warmup_min_lr to the peak, then constant.
struct WarmupLR {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "warmup_lr";
  /// The `scheduler.type` of a DeepSpeed config that names it.
  static constexpr std::string_view deepspeed_type = "WarmupLR";
};
/// DeepSpeed's WarmupDecayLR: WarmupLR's warmup, then linear decay to 0.
struct WarmupDecayLR {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "warmup_decay_lr";
  static constexpr std::string_view deepspeed_type = "WarmupDecayLR";
};
/// DeepSpeed's WarmupCosineLR: warmup from a ratio of the peak, then cosine decay to cos_min_ratio.
struct WarmupCosineLR {
  using loom_family = family::Schedule;
  static constexpr std::string_view name = "warmup_cosine_lr";
  static constexpr std::string_view deepspeed_type = "WarmupCosineLR";
};
}  // namespace schedule

/// Every schedule selectable by --lr_scheduler_type, in HF's SchedulerType order, then
/// DeepSpeed's (a --deepspeed config's scheduler section picks them by deepspeed_type).
using ScheduleCatalog =
    std::tuple<schedule::Linear, schedule::Cosine, schedule::CosineWithRestarts, schedule::Polynomial,
               schedule::Constant, schedule::ConstantWithWarmup, schedule::InverseSqrt, schedule::ReduceLROnPlateau,
               schedule::CosineWithMinLR, schedule::CosineWarmupWithMinLR, schedule::WarmupStableDecay,
               schedule::WarmupLR, schedule::WarmupDecayLR, schedule::WarmupCosineLR>;

// ---- optimizer ---------------------------------------------------------------------------

/// One key an optimizer reads from --optim_args, and the values it accepts.
struct OptimArg {
  std::string_view key;
  bool boolean = false;        ///< True/False (read as 1/0)
  double low = -1e300;         ///< accepted range: [low, high] or [low, high)
  double high = 1e300;
  bool high_included = true;
};

namespace optimizer {
inline constexpr double kNoLimit = 1e300;  ///< an OptimArg bound that is no bound
/// AdamW with ATen's fused kernel (HF's default).
struct AdamWTorchFused {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "adamw_torch_fused";
  static constexpr std::array<OptimArg, 0> optim_args{};
};
/// AdamW in torch.optim's _foreach_ formulation.
struct AdamWTorch {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "adamw_torch";
  static constexpr std::array<OptimArg, 0> optim_args{};
};
/// transformers.optimization.Adafactor (HF Trainer's settings: no relative step or parameter scaling).
struct Adafactor {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "adafactor";
  static constexpr std::array<OptimArg, 3> optim_args{{{"beta1", false, 0.0, 1.0, false},
                                                       {"decay_rate", false, -kNoLimit, kNoLimit, true},
                                                       {"clip_threshold", false, 0.0, kNoLimit, true}}};
};
/// torch.optim.SGD.
struct SGD {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "sgd";
  static constexpr std::array<OptimArg, 3> optim_args{{{"momentum", false, 0.0, kNoLimit, true},
                                                       {"dampening", false, -kNoLimit, kNoLimit, true},
                                                       {"nesterov", true, 0.0, 1.0, true}}};
  /// torch.optim.SGD's rule across keys: the error text, empty when the values agree.
  /// `value(key)`: the key's value, 0 when not given (each key's default here).
  template <class Value>
  static constexpr std::string_view check_args(Value value) {
    return value("nesterov") != 0.0 && (value("momentum") <= 0.0 || value("dampening") != 0.0)
               ? "nesterov=True needs momentum > 0 and dampening 0 (as torch.optim.SGD)"
               : "";
  }
};
/// torch.optim.Adagrad.
struct Adagrad {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "adagrad";
  static constexpr std::array<OptimArg, 3> optim_args{{{"lr_decay", false, 0.0, kNoLimit, true},
                                                       {"eps", false, 0.0, kNoLimit, true},
                                                       {"initial_accumulator_value", false, 0.0, kNoLimit, true}}};
};
/// torch.optim.RMSprop.
struct RMSprop {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "rmsprop";
  static constexpr std::array<OptimArg, 4> optim_args{{{"momentum", false, 0.0, kNoLimit, true},
                                                       {"alpha", false, 0.0, kNoLimit, true},
                                                       {"eps", false, 0.0, kNoLimit, true},
                                                       {"centered", true, 0.0, 1.0, true}}};
};
/// Lion (Chen et al. 2023), loom's own: beta1 0.9, beta2 0.99 by default.
struct Lion {
  using loom_family = family::Optimizer;
  static constexpr std::string_view name = "lion";
  static constexpr std::array<OptimArg, 2> optim_args{{{"beta1", false, 0.0, 1.0, true},
                                                       {"beta2", false, 0.0, 1.0, true}}};
};
}  // namespace optimizer

/// Every optimizer --optim names, in HF's order of loom's members.
using OptimizerCatalog = std::tuple<optimizer::AdamWTorchFused, optimizer::AdamWTorch, optimizer::Adafactor,
                                    optimizer::SGD, optimizer::Adagrad, optimizer::RMSprop, optimizer::Lion>;

// ---- callbacks ---------------------------------------------------------------------------

/// A pack of callbacks: any types with some of HF's event members; no base class.
template <class... Cbs>
struct Callbacks {
  using loom_family = family::Callbacks;
};

}  // namespace loom
