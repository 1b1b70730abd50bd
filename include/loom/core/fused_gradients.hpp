#pragma once
// Parameters that transformers holds as one tensor where loom keeps the files' pieces: a sparse
// MoE block's experts (transformers 5.23 fuses them at load into 3-d gate_up_proj / down_proj;
// its files, and loom's parameters, hold each expert's projections). The global gradient norm
// is a norm of the per-tensor norms, so where the tensors are cut changes its last bits. A
// module that derives from FusedGradients lists, in `fused_gradients`, each of transformers'
// tensors as the parameters whose flattened concatenation it is; the Accelerator finds such
// modules in the model when it takes the optimizer (a virtual call there, never in a step) and
// takes the norm of each concatenation as one tensor, as HF's clip_grad_norm_ does (the
// clipping itself scales every gradient alike).
//
//   struct BlockImpl : torch::nn::Module, loom::FusedGradients {
//     std::vector<std::vector<torch::Tensor>> fused_gradients() const override {
//       return {{w1_0, w3_0, w1_1, w3_1}, {w2_0, w2_1}};
//     }
//   };

#include <torch/torch.h>

#include <vector>

namespace loom {

/// A module whose parameters transformers holds as fewer tensors (see above).
struct FusedGradients {
  virtual ~FusedGradients() = default;
  /// Each of transformers' tensors: the parameters it concatenates, in its order.
  [[nodiscard]] virtual std::vector<std::vector<torch::Tensor>> fused_gradients() const = 0;
};

/// The groups `module` declares (none when it is no FusedGradients). The Accelerator asks every
/// module of the model, and the block inside each FullShard unit.
inline std::vector<std::vector<torch::Tensor>> fused_gradients_of(const torch::nn::Module& module) {
  const auto* fused = dynamic_cast<const FusedGradients*>(&module);
  return fused != nullptr ? fused->fused_gradients() : std::vector<std::vector<torch::Tensor>>{};
}

}  // namespace loom
