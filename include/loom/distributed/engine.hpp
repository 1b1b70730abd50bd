#pragma once
// dist::Engine: the run-time interface of every sharding engine, and the only distributed
// header the Trainer's translation units need. The engines themselves (bucket_engine.hpp for
// DDP / ZeRO-1 / ZeRO-2, full_shard.hpp for FullShard, the NoShard engine) are reached
// through make_engine(), so under LOOM_SEPARATE_COMPILATION editing an engine rebuilds the
// loom::compiled library only. The calls are a handful per micro-step, far from the kernels.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/distributed/env.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::dist {

class Comm;  // distributed/comm.hpp

/// The part of one parameter a rank updates: the whole parameter (unsharded policies) or a
/// flat range of it. `param` and `grad` are what the optimizer steps; [begin, end) is the
/// range in the parameter's flattened elements, recorded in checkpoints.
struct Piece {
  std::string name;            ///< the parameter's name in the model
  torch::Tensor param;         ///< the values this rank updates (a view into the engine's storage)
  torch::Tensor grad;          ///< their gradient (a view)
  int64_t begin = 0, end = 0;  ///< flat element range within the parameter
  int64_t numel = 0;           ///< elements of the whole parameter
  bool on_host = false;        ///< `param` is host memory the engine keeps (--offload_param): stepped in place there
};

/// Bytes a rank holds for model state, measured from the tensors it keeps between steps:
/// params, grads and optimizer in the device's memory (total()), host beside it.
struct StateBytes {
  double params = 0, grads = 0, optimizer = 0;
  /// Bytes in host memory (--offload_optimizer: the optimizer state and the host copies of the
  /// pieces and their gradients); not part of total(). On a CPU run both are the same memory.
  double host = 0;
  /// Frozen tensors the model's modules keep outside their parameters (core/deferred.hpp's
  /// ModuleState: a 4-bit base's codes and absmaxes) as this rank holds them: whole, or
  /// FullShard's shard of them. Not part of total().
  double module_state = 0;
  [[nodiscard]] double total() const { return params + grads + optimizer; }
};

/// An accumulation group's items and how its loss is normalized (Engine::begin_group).
struct GroupItems {
  int64_t local = 0;          ///< this rank's items in the group (num_items of its micro-batches)
  bool across_ranks = true;   ///< --average_tokens_across_devices: normalized by every rank's items
  /// The model divides its summed loss by the group's count itself (HF's num_items_in_batch,
  /// over every rank when across_ranks): the ranks' gradients are then summed as they are.
  bool model_divides = false;
};

/// FSDP's BackwardPrefetch (--fsdp_backward_prefetch): when FullShard gathers the unit whose
/// backward comes next, beside the one whose backward runs.
enum class BackwardPrefetch { none, pre, post };

/// What make_engine configures; the bucket engines (DDP, ZeRO-1, ZeRO-2) read the first two
/// fields and reduce_dtype, FullShard the two dtypes and offload_param, NoShard nothing.
struct EngineOptions {
  double bucket_cap_mb = 25;            ///< --ddp_bucket_cap_mb
  bool find_unused_parameters = false;  ///< --ddp_find_unused_parameters, resolved (HF's rule)
  torch::ScalarType param_dtype = torch::kFloat;   ///< --sharding_param_dtype: FullShard's gathered parameters
  torch::ScalarType reduce_dtype = torch::kFloat;  ///< --sharding_reduce_dtype: the gradient collectives
  bool offload_param = false;           ///< --offload_param: FullShard keeps its shards in host memory
  bool forward_prefetch = false;        ///< --fsdp_forward_prefetch: FullShard gathers the next unit early
  BackwardPrefetch backward_prefetch = BackwardPrefetch::none;  ///< --fsdp_backward_prefetch
  std::vector<std::string> wrap_classes;  ///< --fsdp_transformer_layer_cls_to_wrap: FullShard's units by block class
  int64_t min_num_params = 0;             ///< --fsdp_min_num_params: FullShard's units by size (0: off)
};

/// Gradient collectives an engine launched while backward ran (from gradient hooks, or at
/// once for parameters the loss does not reach) and those it launched in after_backward
/// because some gradient had not arrived; counted since setup. Diagnostics and tests.
struct GradLaunches {
  int64_t during_backward = 0, after_backward = 0;
};

/// What the Trainer asks of a sharding engine, in the order a step asks it.
class Engine {
 public:
  virtual ~Engine() = default;
  /// After the model is on its device: broadcast, flatten, register hooks.
  virtual void setup(torch::nn::Module& module) = 0;
  /// What this rank's optimizer steps for `param` (none: another rank owns all of it).
  virtual std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) = 0;
  /// The optimizer steps pieces of parameters (ZeRO, FullShard).
  [[nodiscard]] virtual bool shards_optimizer() const = 0;
  /// Each rank holds the gradient of its pieces only (norms and overflow flags need a SUM).
  [[nodiscard]] virtual bool grads_sharded() const = 0;
  /// The engine zeroes the gradients it keeps (else the optimizer drops autograd's).
  [[nodiscard]] virtual bool owns_grads() const = 0;
  /// An accumulation group starts (GroupItems: this rank's items in it and how its loss is
  /// normalized).
  virtual void begin_group(const GroupItems& items, const torch::Device& device) = 0;
  /// What each rank's gradient is multiplied by before the SUM over ranks, on the device:
  /// local / global items of the group (across_ranks), 1 / world (not across_ranks), nothing
  /// (undefined) in a world of one or when the model divided by the global count itself.
  [[nodiscard]] virtual const torch::Tensor& item_factor() const = 0;
  /// The group's items summed over every rank, a float32 scalar on the device, when the model
  /// divides by them (model_divides and across_ranks in a world of several); else undefined.
  [[nodiscard]] virtual const torch::Tensor& global_items() const = 0;
  /// Before a micro-step's forward; `last` is the group's last micro-step.
  virtual void begin_micro_step(bool last) = 0;
  /// Just before `loss` is backpropagated (Trainer::backward). With find_unused_parameters
  /// the bucket engines walk its autograd graph: a parameter it does not reach is ready at
  /// once, so its bucket does not wait for after_backward; the others do nothing.
  virtual void before_backward(const torch::Tensor& loss) = 0;
  /// After its backward: gradients reduced where they must be.
  virtual void after_backward() = 0;
  /// After the optimizer step (ZeRO: all-gather the updated slices).
  virtual void after_step() = 0;
  /// Zeroes the gradients the engine owns.
  virtual void zero_grad() = 0;
  /// Runs `fn` while every parameter is complete (saving, loading); FullShard writes changed
  /// values back to the shards afterwards.
  virtual void with_full_params(const std::function<void()>& fn) = 0;
  /// with_full_params for the trainable parameters alone (an adapter's save and load):
  /// FullShard leaves the frozen ones sharded.
  virtual void with_trainable_params(const std::function<void()>& fn) { with_full_params(fn); }
  /// Calls `fn` with every parameter whole a group at a time, for reading (a streamed save):
  /// FullShard gathers one unit at a time in its master dtype and passes that unit's
  /// parameters; the other engines call it once, every parameter whole, with an empty list
  /// (all of them). Parameters in no group (kept whole) are whole throughout. A collective
  /// under FullShard: every rank calls it.
  virtual void for_each_gathered_group(const std::function<void(const std::vector<torch::Tensor>&)>& fn) {
    with_full_params([&] { fn({}); });
  }
  /// Where a load writes this rank's shard: `fill(name, begin, end, out)` must write elements
  /// [begin, end) of parameter `name` (flattened) into `out`.
  using ShardFill = std::function<void(const std::string& name, int64_t begin, int64_t end, torch::Tensor& out)>;
  /// Calls `fill` for every slice of a parameter this rank's shards hold (FullShard; the other
  /// engines hold none).
  virtual void fill_shards(const ShardFill& /*fill*/) {}
  /// The dtype `param`'s values are saved in: its master weights' (FullShard's float32 shard
  /// when it gathers bfloat16), else its own.
  [[nodiscard]] virtual torch::ScalarType master_dtype(const torch::Tensor& param) const { return param.scalar_type(); }
  /// Around evaluation (forward passes without backward).
  virtual void begin_forward_only() = 0;
  virtual void end_forward_only() = 0;
  /// In-place SUM over ranks (norms, overflow flags, logged losses); nothing in a world of one.
  virtual void all_reduce(torch::Tensor& t, const char* what) = 0;
  /// The process group (null for NoShard).
  [[nodiscard]] virtual Comm* comm() const = 0;
  /// Parameter and gradient bytes this rank holds.
  [[nodiscard]] virtual StateBytes state_bytes() const = 0;
  /// Gradient collectives launched during backward and by after_backward, since setup.
  [[nodiscard]] virtual GradLaunches grad_launches() const = 0;
  /// The sharding units' module names, the root first as "" (FullShard; none elsewhere).
  [[nodiscard]] virtual std::vector<std::string> unit_names() const { return {}; }
};

/// The engine of the sharding policy called `sharding` (a ShardingCatalog name) over `comm`
/// (null for a policy that uses none).
LOOM_INLINE std::unique_ptr<Engine> make_engine(std::string_view sharding, std::shared_ptr<Comm> comm,
                                                const EngineOptions& options);

/// The torch dtype a --sharding_param_dtype / --sharding_reduce_dtype value names (a
/// ShardingDtypeCatalog name; validation has refused any other).
LOOM_INLINE torch::ScalarType sharding_dtype(std::string_view name);

/// --sharding_reduce_dtype, or when unset --sharding_param_dtype (FSDP2's rule: reduce_dtype
/// None reduces in param_dtype).
inline const std::string& reduce_dtype_name(const TrainingArguments& args) {
  return args.sharding_reduce_dtype ? *args.sharding_reduce_dtype : args.sharding_param_dtype;
}

/// The start-up checks of the sharding policy called `sharding` (its ShardingImpl's
/// can_implement): a loom::Error when it cannot run with `args` in `world`.
LOOM_INLINE void check_sharding(std::string_view sharding, const TrainingArguments& args, const World& world);

/// DDP's broadcast_buffers: copies rank 0's module buffers (BatchNorm running statistics) to
/// every rank, one broadcast per dtype. The Accelerator calls it before each training forward
/// under the policies that replicate the model (--ddp_broadcast_buffers, default true), as
/// torch's DistributedDataParallel does.
LOOM_INLINE void broadcast_buffers(Comm& comm, torch::nn::Module& module);

}  // namespace loom::dist

#if defined(LOOM_HEADER_ONLY)
#include <loom/distributed/impl/engine.ipp>
#endif
