#pragma once
// OptimizerStep: the optimizer as the sharding engine sees it, and the sequence that ends
// every accumulation group (HF's, in order):
//
//   precision.unscale(params())        the caller: the precision policy's part
//   clip(params, found_inf, max_norm)  overflow flag and squared norms summed over ranks
//   on_pre_optimizer_step              the caller
//   settle_skip()                      the previous step's fp16 skip flag, read now
//   step(lr, found_inf)                the optimizer, then the engine (ZeRO: all-gather)
//   on_optimizer_step; precision.update()
//   after_update(found_inf)            the skip flag starts its way to the host
//   finish()                           state bytes (once), gradients zeroed
//
// HF does not advance the scheduler after a step the fp16 scaler skipped. The skip is decided
// on the device; its flag is copied to the host asynchronously after the step and read just
// before the next step needs the learning rate (by then the copy is long done, so the host
// never waits on the device inside a step).
//
// --offload_optimizer (ZeRO-1/2, FullShard): the optimizer is built over host copies of this
// rank's pieces, so its state is created in host memory. unscale and clip still run on the
// device pieces (params()); step() copies each piece and its gradient to the host, steps there
// (the same rule, e.g. at::_fused_adamw_'s CPU kernel) and copies the new values back before
// the engine's after_step. The device piece stays the reference: the host copy is refreshed
// from it every step, so loading weights or FullShard's with_full_params need not know about
// the copies. A piece the engine already keeps in host memory (Piece::on_host, FullShard's
// --offload_param) is stepped in place, and only its gradient travels. On CUDA the host
// buffers are pinned and the copies non-blocking; the host waits once per step, for the
// gradients, before it steps (the fp16 skip flag travels with them).

#include <loom/config/inline.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/schedule/schedule_decl.hpp>

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <optional>
#include <vector>

namespace loom {

class OptimizerStep {
 public:
  /// Steps through `engine`; gradients are zeroed by the engine when it owns them. `offload`
  /// (--offload_optimizer, for an engine that shards the optimizer): the optimizer steps host
  /// copies of the pieces.
  OptimizerStep(dist::Engine& engine, torch::Device device, bool engine_owns_grads, bool offload = false)
      : engine_(&engine), device_(device), engine_owns_grads_(engine_owns_grads), offload_(offload) {}

  /// Takes the optimizer create_optimizer built and, when the engine shards the optimizer,
  /// rebuilds it with the same algorithm and groups over this rank's pieces of each parameter.
  /// `model_order`: the model's parameters, in the order HF clips them (model.parameters()).
  /// `fused`: parameters whose gradients HF norms as one tensor each (fused_gradient_groups).
  LOOM_INLINE void reset(optim::Optimizer full, schedule::LRSchedulerBase& scheduler,
                         const std::vector<torch::Tensor>& model_order,
                         const std::vector<std::vector<torch::Tensor>>& fused = {});

  /// Every parameter the optimizer steps: in model order (then any the model does not hold),
  /// so the global norm sums as HF's does; this rank's pieces when sharded.
  [[nodiscard]] const std::vector<torch::Tensor>& params() const { return params_; }
  /// Sums the fp16 overflow flag over ranks when gradients are sharded, then computes the
  /// global norm of `params` and clips to `max_grad_norm` (0: the norm only, as HF 5 logs it).
  /// Returns the norm.
  LOOM_INLINE torch::Tensor clip(const std::vector<torch::Tensor>& params, const torch::Tensor& found_inf,
                                 double max_grad_norm);
  /// Reads the skip flag of the previous step and steps the scheduler if that step counted.
  LOOM_INLINE void settle_skip();
  /// The optimizer step at `lr` (skipped on the device when found_inf is set), then the engine's.
  LOOM_INLINE void step(double lr, const torch::Tensor& found_inf);
  /// After the scaler's update: steps the scheduler, or (fp16) sends the flag to the host.
  LOOM_INLINE void after_update(const torch::Tensor& found_inf);
  /// Records the model-state bytes after the first step and zeroes the gradients.
  LOOM_INLINE void finish();

  /// The optimizer (after reset).
  [[nodiscard]] optim::Optimizer& optimizer() { return *optimizer_; }
  [[nodiscard]] bool has_optimizer() const { return optimizer_.has_value(); }
  /// What this rank's optimizer steps, in optimizer order (empty unless sharded).
  [[nodiscard]] const std::vector<dist::Piece>& pieces() const { return pieces_; }
  /// Optimizer steps skipped so far (fp16).
  [[nodiscard]] int64_t skipped_steps() const { return skipped_; }
  void set_skipped_steps(int64_t n) { skipped_ = n; }
  /// Bytes this rank holds for parameters, gradients and optimizer state (after the first step);
  /// with offload the optimizer's are host bytes.
  [[nodiscard]] const dist::StateBytes& state_bytes() const { return state_bytes_; }

 private:
  // The host tensor the optimizer steps for device piece `piece`, recorded in host_: a copy, or
  // `on_host` when the engine keeps the piece in host memory (--offload_param).
  LOOM_INLINE torch::Tensor host_copy(const torch::Tensor& piece, const torch::Tensor& on_host);

  dist::Engine* engine_;
  torch::Device device_;
  bool engine_owns_grads_;
  bool offload_ = false;
  // --offload_optimizer: per stepped piece, the device tensor the engine keeps (its gradient
  // attached) and the host copies the optimizer steps; host.grad() is `grad` or undefined.
  // in_place: `host` is the engine's own host shard (--offload_param), `device` an alias of it.
  struct HostCopy {
    torch::Tensor device, host, grad;
    bool in_place = false;
  };
  std::vector<HostCopy> host_;
  torch::Tensor host_inf_;  // the fp16 overflow flag, on the host
  schedule::LRSchedulerBase* scheduler_ = nullptr;
  std::optional<optim::Optimizer> optimizer_;
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<std::size_t>> fused_;  // groups of params_ normed as one tensor (unsharded)
  std::vector<dist::Piece> pieces_;
  dist::StateBytes state_bytes_;
  torch::Tensor skip_flag_host_;
  std::optional<c10::Event> skip_event_;
  bool skip_pending_ = false;
  int64_t skipped_ = 0;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/optimizer_step.ipp>
#endif
