#pragma once
// Optimizer: the one class every update rule is stepped through, over all parameters at once
// with ATen's multi-tensor kernels, each rule matching its torch.optim (or HF) counterpart step
// by step. The rules live one per file in optim/rules/ (AdamW fused and foreach, SGD, Adagrad,
// RMSprop, Lion, Adafactor), behind the interface of optim/rule.hpp, listed once in
// optim/catalog.hpp; Optimizer::wrap steps any torch::optim::Optimizer instead. Optimizer keeps
// what every rule shares: the groups and their learning rates, the step count, the state and its
// checkpoint I/O, what sharded pieces need.
// The learning rate is a host double passed per step, so nothing here syncs with the device
// (except the documented fp16 skip read of the rules that do not skip on the device).
//
// Learning rates of groups follow torch: a group may carry its own peak lr; the scheduler
// scales every group by the same factor, lr_now / base_lr (set_base_lr; the Trainer passes
// --learning_rate). A group without its own lr steps at lr_now.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/optim/catalog.hpp>
#include <loom/optim/param_groups.hpp>
#include <loom/optim/rule.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::optim {

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
  /// for the other rules Optimizer reads the flag on the host (one sync per step, documented in
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
  /// Whether the rule can step flat pieces of parameters: not Adafactor (its factored moments
  /// need whole matrices) nor a wrapped optimizer (its state is keyed by whole parameters).
  [[nodiscard]] bool steps_pieces() const { return rule_ != nullptr && rule_->steps_pieces; }

  /// Optimizer state as named tensors "<kind>.<param>" with torch's state names as kinds (each
  /// rule's file lists its own: AdamW exp_avg, exp_avg_sq, step; SGD momentum_buffer; ...), for
  /// checkpoints; empty before the first step, for plain SGD and for a wrapped optimizer.
  [[nodiscard]] std::vector<std::pair<std::string, torch::Tensor>> state_tensors() const;
  /// Scalars of the state (steps taken, hyper-parameters) for checkpoints.
  [[nodiscard]] nlohmann::json state_meta() const;
  /// Restores state_tensors() / state_meta() output; every state tensor must match a parameter by
  /// name and shape, and the saved algorithm this one, else a loom::Error listing the mismatches.
  void load_state(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const nlohmann::json& meta);

  /// Every parameter of every group.
  [[nodiscard]] std::vector<torch::Tensor> parameters() const;

 private:
  [[nodiscard]] ParamState initial_state(const torch::Tensor& p) const;
  void ensure_state(std::size_t g);
  [[nodiscard]] double group_lr(std::size_t g, double lr) const;
  void step_group(std::size_t g, double lr, const torch::Tensor& found_inf);

  std::vector<ParamGroup> groups_;
  OptimizerOptions options_;
  const Rule* rule_ = nullptr;  // options_.algorithm's entry in kOptimizerRules; null when wrapped
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
/// `fused`: groups of indices into `params` whose gradients are normed as one tensor, their
/// flattened concatenation in the group's order, placed where the group's first member is
/// (transformers' fused tensors: loom/core/fused_gradients.hpp).
LOOM_INLINE torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm,
                                         const std::vector<std::vector<std::size_t>>& fused = {});

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/optimizer.ipp>
#endif
