#pragma once
// sgd: torch.optim.SGD on _foreach_ kernels: L2 weight decay added to the gradient, momentum
// buffers that start as the first gradient, dampening, Nesterov momentum.
// Options: momentum, dampening, nesterov (--optim_args keys of the same names).
// State per parameter: momentum_buffer with momentum, else none. Elementwise: steps pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>
#include <vector>

namespace loom::optim {

/// sgd: torch.optim.SGD.
struct SGD {
  static constexpr std::string_view name = loom::optimizer::SGD::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::sgd;   ///< checkpoint id
  static constexpr bool steps_pieces = true;        ///< elementwise
  static constexpr bool lazy_state = true;          ///< momentum buffers start as the first gradient
  static constexpr bool skips_on_device = false;    ///< the fp16 skip is read on the host
  /// momentum, dampening, nesterov from --optim_args.
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// Nesterov momentum needs momentum > 0 and dampening 0, as torch.optim.SGD.
  LOOM_INLINE static void validate(const OptimizerOptions& o, const std::vector<ParamGroup>& groups);
  /// momentum_buffer shaped like `p` when momentum is on (what a checkpoint may hold), else none.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
  /// Decay into a copy of the gradient, the momentum buffers, then one _foreach_add_.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::SGD> {
  using type = SGD;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/sgd.ipp>
#endif
