#pragma once
// adagrad: torch.optim.Adagrad on _foreach_ kernels: L2 weight decay added to the gradient, a
// running sum of squared gradients, lr / (1 + (step - 1) * lr_decay) with the host step count.
// Options: lr_decay, initial_accumulator_value, eps (default 1e-10, torch's) (--optim_args keys
// of the same names). State per parameter: sum (shaped like it), step. Elementwise: steps pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::optim {

/// adagrad: torch.optim.Adagrad.
struct Adagrad {
  static constexpr std::string_view name = loom::optimizer::Adagrad::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::adagrad;   ///< checkpoint id
  static constexpr bool steps_pieces = true;            ///< elementwise
  static constexpr bool lazy_state = false;             ///< state created before the first step
  static constexpr bool skips_on_device = false;        ///< the fp16 skip is read on the host
  /// eps 1e-10, then lr_decay, initial_accumulator_value, eps from --optim_args.
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// sum (initial_accumulator_value everywhere), step.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
  /// A few _foreach_ kernels over the group.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::Adagrad> {
  using type = Adagrad;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/adagrad.ipp>
#endif
