#pragma once
// adafactor: transformers.optimization.Adafactor, one tensor at a time (its norms and row /
// column means are per tensor): factored second moments of matrices (a row and a column
// average instead of a full one), update clipping, optional first moment, optional
// relative step and parameter scaling (HF Trainer turns both off), state in float32.
// Options: adafactor_beta1, decay_rate, clip_threshold (--optim_args beta1, decay_rate,
// clip_threshold), adafactor_eps, scale_parameter, relative_step, warmup_init.
// State per parameter: exp_avg (with beta1), exp_avg_sq_row and exp_avg_sq_col (2 dimensions or
// more) or exp_avg_sq, step. Needs whole matrices: cannot step flat pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>
#include <vector>

namespace loom::optim {

/// adafactor: transformers.optimization.Adafactor.
struct Adafactor {
  static constexpr std::string_view name = loom::optimizer::Adafactor::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::adafactor;   ///< checkpoint id
  static constexpr bool steps_pieces = false;             ///< factored moments need each matrix whole
  static constexpr bool lazy_state = false;               ///< state created before the first step
  static constexpr bool skips_on_device = false;          ///< the fp16 skip is read on the host
  /// beta1, decay_rate, clip_threshold from --optim_args.
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// relative_step computes the lr, so no group may set its own (as HF).
  LOOM_INLINE static void validate(const OptimizerOptions& o, const std::vector<ParamGroup>& groups);
  /// float32 moments (factored for 2 dimensions or more), step.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
  /// One update per tensor of the group.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::Adafactor> {
  using type = Adafactor;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/adafactor.ipp>
#endif
