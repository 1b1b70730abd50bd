#pragma once
// NEFTune's noise (core/neftune.hpp).

#include <loom/core/error.hpp>
#include <loom/core/neftune.hpp>

#include <cmath>

namespace loom {

LOOM_INLINE torch::Tensor NEFTune::operator()(const torch::Tensor& embeds, bool training) const {
  if (!training || noise_alpha <= 0) return embeds;
  check(embeds.dim() == 3, "NEFTune adds noise to embeddings of shape [batch, seq, dim], got {}",
        c10::str(embeds.sizes()));
  // HF: dims = seq * dim; mag_norm = alpha / sqrt(dims); output + zeros_like(output).uniform_(-mag_norm, mag_norm)
  const double dims = static_cast<double>(embeds.size(1) * embeds.size(2));
  const double magnitude = noise_alpha / std::sqrt(dims);
  torch::Tensor noise;
  {
    torch::NoGradGuard no_grad;
    noise = torch::zeros_like(embeds).uniform_(-magnitude, magnitude);
  }
  return embeds + noise;
}

}  // namespace loom
