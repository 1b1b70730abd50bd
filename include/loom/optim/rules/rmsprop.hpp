#pragma once
// rmsprop: torch.optim.RMSprop on _foreach_ kernels: L2 weight decay added to the gradient, a
// running average of squared gradients (centered: minus the squared average gradient), optional
// momentum. Options: alpha, eps, momentum, centered (--optim_args keys of the same names).
// State per parameter: square_avg, momentum_buffer (with momentum), grad_avg (centered), step.
// Elementwise: steps pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::optim {

/// rmsprop: torch.optim.RMSprop.
struct RMSprop {
  static constexpr std::string_view name = loom::optimizer::RMSprop::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::rmsprop;   ///< checkpoint id
  static constexpr bool steps_pieces = true;            ///< elementwise
  static constexpr bool lazy_state = false;             ///< state created before the first step
  static constexpr bool skips_on_device = false;        ///< the fp16 skip is read on the host
  /// momentum, alpha, eps, centered from --optim_args.
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// square_avg, momentum_buffer with momentum, grad_avg when centered, step.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
  /// A few _foreach_ kernels over the group.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::RMSprop> {
  using type = RMSprop;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/rmsprop.ipp>
#endif
