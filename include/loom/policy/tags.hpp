#pragma once
// The policy catalog: cheap, empty tag types, one family each. A Trainer names any of
// them, in any order, after its Model type; policy/bundle.hpp resolves them. The code that
// gives a tag meaning lives in precision/, schedule/, distributed/ (one file per tag).

#include <string_view>

namespace loom {

/// Policy families; a tag names its family through a nested `loom_family` type.
namespace family {
struct Sharding {};   ///< how parameters, gradients and optimizer state are laid out
struct Precision {};  ///< the numeric format of forward/backward
struct Schedule {};   ///< the learning-rate schedule
struct Callbacks {};  ///< the pack of user callbacks
}  // namespace family

namespace sharding {
/// One process, or every process holding everything (the default).
struct NoShard {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "no";
};
/// Data parallel: every rank holds everything; gradients all-reduced in buckets during backward.
struct DDP {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "ddp";
};
/// ZeRO stage 1: optimizer state partitioned across ranks.
struct ZeRO1 {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "zero1";
};
/// ZeRO stage 2: optimizer state and gradients partitioned across ranks.
struct ZeRO2 {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "zero2";
};
/// ZeRO stage 3 / FSDP: parameters too, gathered per FullShardUnit around its forward and backward.
struct FullShard {
  using loom_family = family::Sharding;
  static constexpr std::string_view name = "full_shard";
};
}  // namespace sharding

namespace precision {
/// float32 everywhere (the default).
struct FP32 {
  using loom_family = family::Precision;
  static constexpr std::string_view name = "fp32";  ///< the flag that selects it (--bf16, --fp16); FP32 has none
  static constexpr std::string_view type_name = "FP32";
};
/// bfloat16 autocast for forward and loss; float32 master weights and optimizer state.
struct BF16 {
  using loom_family = family::Precision;
  static constexpr std::string_view name = "bf16";  ///< the flag that selects it (--bf16)
  static constexpr std::string_view type_name = "BF16";
};
/// float16 autocast plus dynamic loss scaling; float32 master weights and optimizer state.
struct FP16 {
  using loom_family = family::Precision;
  static constexpr std::string_view name = "fp16";  ///< the flag that selects it (--fp16)
  static constexpr std::string_view type_name = "FP16";
};
}  // namespace precision

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
}  // namespace schedule

/// A pack of callbacks: any types with some of HF's event members; no base class.
template <class... Cbs>
struct Callbacks {
  using loom_family = family::Callbacks;
};

}  // namespace loom
