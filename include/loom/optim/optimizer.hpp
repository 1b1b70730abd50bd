#pragma once
// Optimizers stepped over all parameters at once with ATen's multi-tensor kernels, each
// matching its torch.optim (or HF) counterpart step by step:
//   adamw_torch_fused  at::_fused_adamw_ (one fused kernel per group and device)
//   adamw_torch        the _foreach_ formulation of torch.optim.AdamW(foreach=True)
//   sgd                torch.optim.SGD: momentum, dampening, nesterov, L2 weight decay (_foreach_)
//   adagrad            torch.optim.Adagrad: lr_decay, initial_accumulator_value, eps (_foreach_)
//   rmsprop            torch.optim.RMSprop: alpha, eps, momentum, centered (_foreach_)
//   lion               update = sign(beta1*m + (1-beta1)*g), m = beta2*m + (1-beta2)*g,
//                      decoupled weight decay (Chen et al. 2023; torch has none) (_foreach_)
//   adafactor          transformers.optimization.Adafactor (factored second moments of
//                      matrices; per tensor, since its norms and row/column means are per tensor)
//   torch              any torch::optim::Optimizer, through Optimizer::wrap
// The learning rate is a host double passed per step, so nothing here syncs with the device
// (except the documented fp16 skip read of the non-fused rules).
//
// Learning rates of groups follow torch: a group may carry its own peak lr; the scheduler
// scales every group by the same factor, lr_now / base_lr (set_base_lr; the Trainer passes
// --learning_rate). A group without its own lr steps at lr_now.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/param_groups.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

/// Which update rule an Optimizer applies (the values are written to checkpoints; append only).
enum class Algorithm { adamw_fused, adamw_foreach, sgd, adagrad, rmsprop, adafactor, lion, torch };

/// Algorithm for an HF `optim` name; unknown names are a loom::Error.
LOOM_INLINE Algorithm algorithm_from_name(std::string_view name);
/// The HF `optim` name of `algorithm` ("torch" for a wrapped torch::optim::Optimizer).
LOOM_INLINE std::string_view algorithm_name(Algorithm algorithm);

/// Hyper-parameters shared by every group. Defaults are torch.optim's / HF's for each rule;
/// fields a rule does not read are ignored.
struct OptimizerOptions {
  Algorithm algorithm = Algorithm::adamw_fused;  ///< update rule
  double beta1 = 0.9;                            ///< AdamW and Lion beta1
  double beta2 = 0.999;                          ///< AdamW beta2; Lion's is 0.99 (options_from_args)
  double eps = 1e-8;                             ///< AdamW and RMSprop epsilon; Adagrad's is 1e-10
  double momentum = 0.0;                         ///< SGD and RMSprop momentum
  double dampening = 0.0;                        ///< SGD dampening
  bool nesterov = false;                         ///< SGD Nesterov momentum
  double lr_decay = 0.0;                         ///< Adagrad learning-rate decay
  double initial_accumulator_value = 0.0;        ///< Adagrad's initial sum of squares
  double alpha = 0.99;                           ///< RMSprop smoothing constant
  bool centered = false;                         ///< RMSprop: normalize by the centered variance
  std::array<double, 2> adafactor_eps = {1e-30, 1e-3};  ///< Adafactor (eps1, eps2)
  double clip_threshold = 1.0;                   ///< Adafactor update clipping
  double decay_rate = -0.8;                      ///< Adafactor second-moment decay exponent
  std::optional<double> adafactor_beta1;         ///< Adafactor first moment (none: not kept)
  bool scale_parameter = false;                  ///< Adafactor: scale lr by the parameter's RMS (HF Trainer: false)
  bool relative_step = false;                    ///< Adafactor: time-dependent lr instead of lr (HF Trainer: false)
  bool warmup_init = false;                      ///< Adafactor: warm-up relative steps
};

/// The options --optim, --optim_args and the adam_* arguments select, with HF Trainer's
/// defaults (Adafactor: scale_parameter, relative_step and warmup_init off).
LOOM_INLINE OptimizerOptions options_from_args(const TrainingArguments& args);

/// A multi-tensor optimizer over parameter groups, or a wrapped torch::optim::Optimizer.
class Optimizer {
 public:
  /// An optimizer over `groups`; state is created lazily on the first step.
  Optimizer(std::vector<ParamGroup> groups, OptimizerOptions options);

  /// Takes `optimizer` (any torch::optim::Optimizer) to be stepped by loom: each of its groups
  /// keeps the lr it has now as its peak lr, scaled by the schedule's factor every step;
  /// checkpoints go through torch's own serialization (optimizer.pt). It cannot run under a
  /// policy that shards the optimizer (ZeRO-1/2, FullShard): that is a loom::Error at train().
  LOOM_INLINE static Optimizer wrap(std::unique_ptr<torch::optim::Optimizer> optimizer);

  /// Applies one update to every parameter that has a gradient: groups without their own lr at
  /// `lr`, the others at their lr times lr / base_lr(). With `found_inf` (a device flag from the
  /// fp16 scaler) the update is skipped when it is nonzero: on the device for the fused kernel;
  /// the other rules read the flag on the host (one sync per step, documented in
  /// docs/semantics.md).
  void step(double lr, const torch::Tensor& found_inf = {});

  /// Drops every gradient (set_to_none, as torch's default).
  void zero_grad();

  /// The lr the scheduler's lr is relative to (--learning_rate); unset, groups with their own lr
  /// use it unscaled.
  void set_base_lr(double base_lr) { base_lr_ = base_lr; }
  /// See set_base_lr.
  [[nodiscard]] std::optional<double> base_lr() const { return base_lr_; }

  /// The parameter groups (a wrapped optimizer's, with its lrs and no names).
  [[nodiscard]] const std::vector<ParamGroup>& groups() const { return groups_; }
  /// Steps taken (with the fused kernel, calls: its fp16 skip is decided on the device, and
  /// only its per-parameter step tensors leave a skipped step out).
  [[nodiscard]] int64_t steps() const { return steps_; }
  /// The options.
  [[nodiscard]] const OptimizerOptions& options() const { return options_; }
  /// The wrapped torch optimizer, null unless built by wrap().
  [[nodiscard]] torch::optim::Optimizer* wrapped() const { return wrapped_.get(); }
  /// False for Adafactor (its factored moments need whole matrices) and a wrapped optimizer
  /// (its state is keyed by whole parameters): they cannot step flat pieces of parameters.
  [[nodiscard]] bool steps_pieces() const {
    return options_.algorithm != Algorithm::adafactor && options_.algorithm != Algorithm::torch;
  }

  /// Optimizer state as named tensors "<kind>.<param>" with torch's state names as kinds
  /// (AdamW: exp_avg, exp_avg_sq, step; SGD: momentum_buffer; Adagrad: sum, step; RMSprop:
  /// square_avg, momentum_buffer, grad_avg, step; Lion: exp_avg; Adafactor: exp_avg_sq_row,
  /// exp_avg_sq_col or exp_avg_sq, exp_avg, step), for checkpoints; empty before the first step,
  /// for plain SGD and for a wrapped optimizer.
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const;
  /// Scalars of the state (steps taken, hyper-parameters) for checkpoints.
  [[nodiscard]] nlohmann::json state_meta() const;
  /// Restores state_tensors() / state_meta() output; every state tensor must match a parameter by
  /// name and shape, and the saved algorithm this one, else a loom::Error listing the mismatches.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const nlohmann::json& meta);

  /// Every parameter of every group.
  [[nodiscard]] std::vector<torch::Tensor> parameters() const;

 private:
  // Per parameter: its state tensors by kind, empty until created.
  using ParamState = std::vector<std::pair<std::string, torch::Tensor>>;

  [[nodiscard]] ParamState initial_state(const torch::Tensor& p) const;
  void ensure_state(std::size_t g);
  [[nodiscard]] double group_lr(std::size_t g, double lr) const;
  void step_group(std::size_t g, double lr, const torch::Tensor& found_inf);
  void step_adafactor(std::size_t g, double lr, const std::vector<std::size_t>& slots,
                      const std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads);

  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  std::vector<std::vector<ParamState>> state_;  // [group][param]
  std::shared_ptr<torch::optim::Optimizer> wrapped_;
  std::optional<double> base_lr_;
  int64_t steps_ = 0;
};

/// create_optimizer's default: the Optimizer --optim selects over HF's decay / no-decay groups
/// of `model`, with base_lr --learning_rate.
LOOM_INLINE Optimizer make_optimizer(const TrainingArguments& args, const torch::nn::Module& model);

/// False for the state kinds that are not shaped like their parameter (step counts, Adafactor's
/// row and column moments), which a sharded checkpoint cannot cut into flat ranges.
LOOM_INLINE bool is_param_shaped(std::string_view kind);

/// Scales all gradients so their global L2 norm is at most `max_norm`; returns the norm
/// before clipping as a device scalar (no host sync), like torch.nn.utils.clip_grad_norm_.
LOOM_INLINE torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/optimizer.ipp>
#endif
