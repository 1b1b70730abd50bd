#pragma once
// The memory plan: what one rank will hold, worked out before anything is allocated
// (Accelerator::prepare_module prints it and refuses a plan larger than the device).
//
//   plan inputs (plain numbers)  --make_memory_plan-->  MemoryPlan  --memory_plan_refusal(capacity)-->  refuse?
//
// make_memory_plan and memory_plan_refusal are pure: the tests feed them numbers. The two
// readers around them, memory_plan_inputs (a module, the arguments and the sharding policy's
// facts) and device_memory_bytes (the device's capacity), are the only parts that look at
// tensors or the machine. The figures follow the engines' layouts (distributed/): the bucket
// engines keep one flat float32 replica and a full or 1/N gradient; FullShard keeps a 1/N
// float32 shard of each unit (padded to a multiple of N) and gathers units in the gather dtype;
// optimizer state is counted with the rule --optim selects, on meta tensors of the shapes it
// will step (whole parameters, or flat pieces of numel/N under the sharded policies).

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/policy/tags.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom {

/// What make_memory_plan needs, as plain numbers.
struct MemoryPlanInputs {
  /// One parameter of the model.
  struct Param {
    int64_t numel = 0;
    int64_t element_size = 4;  ///< bytes per element as it is held (float32 master weights: 4)
    bool trainable = true;     ///< requires_grad: gradients and optimizer state (LoRA's frozen base: false)
    int unit = 0;              ///< FullShard unit: 0 the root, k the k-th FullShardUnit
    bool shardable = true;     ///< FullShard shards it when frozen (a frozen integer tensor: kept whole)
    double materialize = 0;    ///< built without memory: bytes held for a moment while it is computed (a 4-bit layer's float weight)
    double state_whole = 0;    ///< optimizer state bytes for the whole parameter
    double state_piece = 0;    ///< optimizer state bytes for a flat piece of ceil(numel / world) elements
  };
  std::vector<Param> params;
  ShardingFacts sharding;
  int world = 1;
  int64_t gather_element_size = 4;  ///< --sharding_param_dtype: bytes per gathered element (bf16: 2)
  bool offload_optimizer = false;   ///< --offload_optimizer
  bool offload_param = false;       ///< --offload_param
  bool prefetch = false;            ///< --fsdp_forward_prefetch or --fsdp_backward_prefetch: two units gathered at once
  /// The model's parameters hold no memory yet (built under loom::DeferredInit): set-up
  /// materializes them where the policy keeps them, one at a time, never the model whole.
  bool deferred = false;
  /// The model's activation estimate for one micro-batch; none: unknown (activation_note says why).
  std::optional<double> activations;
  std::string activation_note;  ///< how the estimate was made, or why there is none
};

/// Bytes one rank holds: in the device's memory (params .. activations) and in host memory.
struct MemoryPlan {
  double params = 0;     ///< trainable parameters as the engine keeps them (a replica, or a 1/N shard)
  double frozen = 0;     ///< parameters without gradient (whole on every rank; a 1/N shard under FullShard)
  double grads = 0;      ///< gradients kept between micro-steps
  double optimizer = 0;  ///< optimizer state on the device
  double gathered = 0;   ///< FullShard: gathered units at the peak (largest unit x2 + the root), gather dtype
  std::optional<double> activations;  ///< one micro-batch's saved activations; none: unknown
  std::string activation_note;
  double host = 0;       ///< host memory: offloaded optimizer state, shards and their host copies
  /// The peak while the model is prepared (before the first step): the engine's parameters and
  /// gradients, and under FullShard beside them the model whole as built, or only the largest
  /// parameter (materialized, then sliced) when it was built under loom::DeferredInit.
  double setup = 0;
  int world = 1;
  std::string sharding;  ///< the policy's --sharding name
  /// The model state the engines report after setup and a step (dist::StateBytes's total()).
  [[nodiscard]] double model_state() const { return params + grads + optimizer; }
  /// Everything planned in the device's memory.
  [[nodiscard]] double device_total() const { return params + frozen + grads + optimizer + gathered + activations.value_or(0); }
};

/// The plan of `in` (pure).
LOOM_INLINE MemoryPlan make_memory_plan(const MemoryPlanInputs& in);

/// The plan's refusal (a message without the "loom:" prefix) when it exceeds `capacity` bytes,
/// else none. On a CPU device (`device_is_host`) the host line shares the same memory and counts.
/// Pure.
LOOM_INLINE std::optional<std::string> memory_plan_refusal(const MemoryPlan& plan, double capacity, bool device_is_host);

/// The plan as a short table (one line per kind of state), for the main process's log.
LOOM_INLINE std::string format_memory_plan(const MemoryPlan& plan);

/// Bytes in human units ("1.50 GiB").
LOOM_INLINE std::string format_bytes(double bytes);

/// The inputs for `module` (not yet on its device) under `args` and `sharding` in a world of
/// `world` processes: parameters and their FullShard units, the state of the optimizer --optim /
/// --optim_args build (counted on meta tensors; none when the rule keeps no state before its
/// first step), the gather dtype and the offload flags. Activations stay unknown.
LOOM_INLINE MemoryPlanInputs memory_plan_inputs(const torch::nn::Module& module, const TrainingArguments& args,
                                                const ShardingFacts& sharding, int world);

/// The memory one process may plan with on `device`: a CUDA device's total memory; on the CPU
/// the machine's (MemTotal, or the cgroup limit when lower) divided among `local_processes`.
LOOM_INLINE double device_memory_bytes(const torch::Device& device, int local_processes);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/memory_plan.ipp>
#endif
