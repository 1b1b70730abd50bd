#pragma once
// The configs users bring from HF's Trainer: --deepspeed ds_config.json and --fsdp "words" with
// --fsdp_config. They are read onto loom's own flags, once, by apply_launcher_configs: a program
// calls it first (the Trainer's start-up does otherwise), it marks the arguments read
// (GivenFlags::launcher_configs_applied), and validate(), finalize() and the selector then use
// the flags it set; given arguments not yet read, validate() and the selector read a copy:
//
//   --deepspeed   zero_optimization.stage 0/1/2/3 chooses --sharding (the catalog's
//                 deepspeed_stage: ddp, zero1, zero2, full_shard). The keys that HF's
//                 DeepSpeed integration fills from TrainingArguments must be "auto" or agree
//                 with the flags, as HF requires (train_micro_batch_size_per_gpu,
//                 gradient_accumulation_steps, train_batch_size, gradient_clipping,
//                 fp16.enabled, bf16.enabled, the AdamW optimizer's lr / betas / eps /
//                 weight_decay); every disagreement is listed in one error.
//   --fsdp        the words full_shard / shard_grad_op / no_shard choose --sharding (the
//                 catalog's fsdp_option); --fsdp_config's activation_checkpointing sets
//                 --gradient_checkpointing.
//
// A key loom does not honour is refused with a `loom:` line that names it; docs/distributed.md
// has the table. A flag given explicitly that disagrees with a config (--sharding zero1 with
// stage 2) is an error too. A second call on the same arguments does nothing.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>

namespace loom {

/// Reads --deepspeed and --fsdp / --fsdp_config onto the flags they stand for (see above).
LOOM_INLINE void apply_launcher_configs(TrainingArguments& args);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/launcher_configs.ipp>
#endif
