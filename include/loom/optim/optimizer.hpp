#pragma once
// Optimizers stepped over all parameters at once with ATen's multi-tensor kernels:
//   adamw_torch_fused  at::_fused_adamw_ (one fused kernel per group and device)
//   adamw_torch        the _foreach_ formulation of torch.optim.AdamW(foreach=True)
//   sgd                _foreach_add_ (plain SGD, as torch.optim.SGD without momentum)
// The learning rate is a host double passed per step, so nothing here syncs with the device.

#include <loom/config/inline.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

/// Which update rule an Optimizer applies.
enum class Algorithm { adamw_fused, adamw_foreach, sgd };

/// Algorithm for an HF `optim` name; unknown names are a loom::Error.
LOOM_INLINE Algorithm algorithm_from_name(std::string_view name);

/// Hyper-parameters shared by every group.
struct OptimizerOptions {
  Algorithm algorithm = Algorithm::adamw_fused;  ///< update rule
  double beta1 = 0.9;                            ///< AdamW beta1
  double beta2 = 0.999;                          ///< AdamW beta2
  double eps = 1e-8;                             ///< AdamW epsilon
};

/// A multi-tensor optimizer over parameter groups.
class Optimizer {
 public:
  /// An optimizer over `groups`; state is created lazily on the first step.
  Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options);

  /// Applies one update with learning rate `lr` to every parameter that has a gradient.
  /// With `found_inf` (a device flag from the fp16 scaler) the update is skipped when it is
  /// nonzero: on the device for the fused kernel; the foreach and SGD paths read the flag
  /// on the host (one sync per step, documented in docs/semantics.md).
  void step(double lr, const torch::Tensor& found_inf = {});

  /// Drops every gradient (set_to_none, as torch's default).
  void zero_grad();

  /// The parameter groups.
  [[nodiscard]] const std::vector<ParamGroup>& groups() const { return groups_; }
  /// Steps taken.
  [[nodiscard]] int64_t steps() const { return steps_; }
  /// The options.
  [[nodiscard]] const OptimizerOptions& options() const { return options_; }

  /// Optimizer state as named tensors ("exp_avg.<param>", "exp_avg_sq.<param>",
  /// "step.<param>"), for checkpoints; empty before the first step and for SGD.
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const;
  /// Scalars of the state (steps taken, hyper-parameters) for checkpoints.
  [[nodiscard]] nlohmann::json state_meta() const;
  /// Restores state_tensors() / state_meta() output; every moment must match a parameter by
  /// name and shape, else a loom::Error listing the mismatches.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const nlohmann::json& meta);

  /// Every parameter of every group.
  [[nodiscard]] std::vector<torch::Tensor> parameters() const;

 private:
  struct GroupState {
    std::vector<torch::Tensor> exp_avg, exp_avg_sq, step;
  };

  void ensure_state(std::size_t g);
  void step_group(std::size_t g, double lr, const torch::Tensor& found_inf);

  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  std::vector<GroupState> state_;
  int64_t steps_ = 0;
};

/// Scales all gradients so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping as a device scalar (no host sync), like torch.nn.utils.clip_grad_norm_.
LOOM_INLINE torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/optimizer.ipp>
#endif
