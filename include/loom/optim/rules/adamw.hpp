#pragma once
// AdamW as torch.optim.AdamW (decoupled weight decay, bias-corrected moments), as two rules over
// the same options and state:
//   AdamWFused    adamw_torch_fused: at::_fused_adamw_, one fused kernel per group and device; an
//                 fp16 overflow skips the step on the device
//   AdamWForeach  adamw_torch: torch.optim.AdamW(foreach=True)'s _foreach_ formulation, with the
//                 host's step count
// Options: beta1, beta2, eps, from --adam_beta1, --adam_beta2, --adam_epsilon; no --optim_args.
// State per parameter: exp_avg, exp_avg_sq (shaped like it), step. Elementwise: steps pieces.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>

#include <torch/torch.h>

#include <string_view>

namespace loom::optim {

/// What the two AdamW rules share: their options, their state, elementwise updates.
struct AdamW {
  static constexpr bool steps_pieces = true;  ///< elementwise
  static constexpr bool lazy_state = false;   ///< state created before the first step
  /// beta1, beta2 and eps from --adam_beta1, --adam_beta2, --adam_epsilon (no --optim_args).
  LOOM_INLINE static void read_args(OptimizerOptions& o, const TrainingArguments& args, const OptimArgs& optim_args);
  /// exp_avg and exp_avg_sq shaped like `p`, step.
  LOOM_INLINE static ParamState initial_state(const torch::Tensor& p, const OptimizerOptions& o);
};

/// adamw_torch_fused: at::_fused_adamw_ (torch.optim.AdamW(fused=True)).
struct AdamWFused : AdamW {
  static constexpr std::string_view name = loom::optimizer::AdamWTorchFused::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::adamw_fused;         ///< checkpoint id
  static constexpr bool skips_on_device = true;  ///< the kernel takes found_inf; a skipped step does not count
  /// One fused kernel over the group.
  LOOM_INLINE static void step(GroupStep& s);
};

/// adamw_torch: the _foreach_ formulation of torch.optim.AdamW(foreach=True).
struct AdamWForeach : AdamW {
  static constexpr std::string_view name = loom::optimizer::AdamWTorch::name;  ///< HF --optim name (its catalog entry)
  static constexpr Algorithm id = Algorithm::adamw_foreach;  ///< checkpoint id
  static constexpr bool skips_on_device = false;            ///< the fp16 skip is read on the host
  /// A few _foreach_ kernels over the group, bias corrections from the host step count.
  LOOM_INLINE static void step(GroupStep& s);
};

template <>
struct RuleFor<loom::optimizer::AdamWTorchFused> {
  using type = AdamWFused;
};
template <>
struct RuleFor<loom::optimizer::AdamWTorch> {
  using type = AdamWForeach;
};

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/rules/impl/adamw.ipp>
#endif
