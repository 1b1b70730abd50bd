#pragma once
// What a Trainer decides at start-up, before it touches the model: the arguments checked
// against the compiled policies, validated and finalized; the process's place in the job;
// its device; and the process group when the sharding policy needs one. Every mistake is a
// loom::Error, in the order a user would fix them.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/distributed/env.hpp>
#include <loom/policy/tags.hpp>

#include <torch/torch.h>

#include <memory>
#include <string>
#include <string_view>

namespace loom::dist {
class Comm;
}

namespace loom {

/// The policies a Trainer was compiled with, as start-up checks the arguments against them.
struct CompiledPolicies {
  ShardingFacts sharding;     ///< the sharding tag's facts (its --sharding name, whether it needs a process group)
  PrecisionFacts precision;   ///< the precision tag's facts (its flag)
  std::string_view schedule;  ///< the schedule tag's --lr_scheduler_type name ("": chosen by that flag)
};

/// The outcome of start-up.
struct Startup {
  dist::World world;                  ///< rank, world size, local rank
  torch::Device device{torch::kCPU};  ///< where the model lives
  std::shared_ptr<dist::Comm> comm;   ///< the process group (null when the policy needs none)
  /// This process writes output_dir's checkpoints and models (HF's should_save): global rank 0;
  /// with save_on_each_node on several nodes, each node's local main process whose output folder
  /// no process of lower rank shares (checkpoint::claim_output_dir).
  bool saves = true;
};

/// The --sharding a program runs: the one --deepspeed / --fsdp choose, else `auto` (the
/// default) is ddp when torchrun started several processes (WORLD_SIZE > 1), as HF's Trainer
/// then trains under DDP, and no otherwise.
LOOM_INLINE std::string resolved_sharding(const TrainingArguments& args);

/// The facts of the sharding member `args` choose (resolved_sharding; sharding::FromArgs), a
/// loom::Error naming the choices when none is called so.
LOOM_INLINE ShardingFacts sharding_chosen(const TrainingArguments& args);

/// The facts of the precision member `args` choose (--bf16 / --fp16, neither: the catalog's
/// first; precision::FromArgs), a loom::Error when both are set.
LOOM_INLINE PrecisionFacts precision_chosen(const TrainingArguments& args);

/// Checks and finalizes `args` for `policies` and joins the job; the sharding policy's own
/// checks (its can_implement) run once the world is known. The flags follow the compiled
/// policies: --bf16/--fp16, --sharding and --lr_scheduler_type left at their defaults take the
/// compiled value (so training_args.json tells what ran); a flag set to another value is a
/// loom::Error. `has_eval_dataset`: the Trainer was given an evaluation dataset.
LOOM_INLINE Startup start_up(TrainingArguments& args, const CompiledPolicies& policies, bool has_eval_dataset);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/startup.ipp>
#endif
