#pragma once
// NEFTune (Jain et al., 2023, "NEFTune: Noisy Embeddings Improve Instruction Finetuning"):
// while training, uniform noise is added to the input embeddings. The rule is the one
// transformers.Trainer applies through a forward hook on get_input_embeddings() when
// --neftune_noise_alpha is set: for embeddings of shape [batch, seq, dim],
//
//   embeds + U(-alpha / sqrt(seq * dim), +alpha / sqrt(seq * dim))
//
// in training mode only (evaluation sees the embeddings unchanged), drawn from torch's
// generator of the embeddings' device. libtorch modules have no forward hooks, so a model
// takes part by holding a loom::NEFTune and passing its token embeddings through it:
//
//   struct MyModelImpl : torch::nn::Module {
//     loom::NEFTune& neftune() { return neftune_; }          // what the Trainer looks for
//     torch::Tensor forward(const Batch& b) {
//       auto x = neftune_(embed(b.input_ids), is_training());  // before positions are added
//       ...
//     }
//     loom::NEFTune neftune_;
//   };
//
// The Trainer sets noise_alpha from --neftune_noise_alpha when train() starts and sets it back
// to 0 when train() returns (HF deactivates NEFTune after training). loom's GPT-2 and BERT
// models take part (word embeddings, as HF's hook).

#include <loom/config/inline.hpp>

#include <torch/torch.h>

#include <concepts>

namespace loom {

/// The noise NEFTune adds to input embeddings; noise_alpha 0 (the default) is off.
struct NEFTune {
  double noise_alpha = 0;
  /// `embeds` plus the noise when `training` and noise_alpha > 0, else `embeds` itself.
  LOOM_INLINE torch::Tensor operator()(const torch::Tensor& embeds, bool training) const;
};

/// A model (its module or its ModuleHolder) that exposes `loom::NEFTune& neftune()`.
template <class Model>
concept ExposesNEFTune = requires(Model& model) {
  { model->neftune() } -> std::same_as<NEFTune&>;
} || requires(Model& model) {
  { model.neftune() } -> std::same_as<NEFTune&>;
};

/// The model's NEFTune (a model that ExposesNEFTune).
template <ExposesNEFTune Model>
NEFTune& neftune_of(Model& model) {
  if constexpr (requires { { model->neftune() } -> std::same_as<NEFTune&>; }) return model->neftune();
  else return model.neftune();
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/core/impl/neftune.ipp>
#endif
