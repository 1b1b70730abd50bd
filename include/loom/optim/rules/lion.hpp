#pragma once
// lion: Lion (Chen et al. 2023; torch.optim has none, tests/optim/reference.py writes it out) on
// _foreach_ kernels: decoupled weight decay, then a step of size lr along
// sign(beta1 * m + (1 - beta1) * g), then m = beta2 * m + (1 - beta2) * g.
// Options: beta1, beta2 (default 0.99) (--optim_args keys of the same names).
// State per parameter: exp_avg. Elementwise: steps pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::optim {

/// lion: the sign of an interpolated moment, decoupled weight decay.
struct Lion {
  static constexpr std::string_view name = loom::optimizer::Lion::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::lion;   ///< checkpoint id
  static constexpr bool steps_pieces = true;         ///< elementwise
  static constexpr bool lazy_state = false;          ///< state created before the first step
  static constexpr bool skips_on_device = false;     ///< the fp16 skip is read on the host
  /// beta2 0.99, then beta1, beta2 from --optim_args.
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// exp_avg shaped like `p`.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
  /// A few _foreach_ kernels over the group.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::Lion> {
  using type = Lion;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/lion.ipp>
#endif
