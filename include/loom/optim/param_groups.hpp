#pragma once
// HF's weight-decay groups: every trainable parameter decays except biases and the
// parameters of normalization layers (LayerNorm, GroupNorm, BatchNorm, InstanceNorm,
// LocalResponseNorm; libtorch has no RMSNorm module) or whose names mark them as norms ("layernorm", "rmsnorm",
// "norm" as a name component, "_norm" suffix), as transformers' get_decay_parameter_names.

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

namespace loom::optim {

/// Parameters sharing hyper-parameters.
struct ParamGroup {
  std::vector<torch::Tensor> params;  ///< the tensors (leaf, requires_grad)
  std::vector<std::string> names;     ///< their names in the model
  double weight_decay = 0.0;          ///< weight decay of this group (decoupled or L2, per the rule)
  /// This group's own peak learning rate (torch's group "lr"): the scheduler scales it by the
  /// same factor as --learning_rate. Unset: the group steps at the scheduler's lr.
  std::optional<double> lr;
};

namespace detail {
// True for libtorch's normalization modules (LayerNorm, GroupNorm, BatchNorm*, InstanceNorm*,
// LocalResponseNorm).
LOOM_INLINE bool is_norm_module(const torch::nn::Module& m);
// True when a parameter name marks a bias or a norm ("bias", "layernorm", "rmsnorm", "norm" as a
// name component, "_norm" suffix), case-insensitively.
LOOM_INLINE bool is_norm_name(std::string name);
}  // namespace detail

/// Names of the parameters that get weight decay (HF's get_decay_parameter_names).
LOOM_INLINE std::vector<std::string> decay_parameter_names(const torch::nn::Module& model);

/// Two groups, [decay, no-decay], over the trainable parameters of `model` (empty groups dropped).
LOOM_INLINE std::vector<ParamGroup> decay_groups(const torch::nn::Module& model, double weight_decay);

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/param_groups.ipp>
#endif
