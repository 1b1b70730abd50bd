#pragma once
// AutocastPrecision<Dtype>: forward and loss under `Dtype` autocast (CPU or CUDA), with
// parameters, gradients and optimizer state in float32, so no loss scaling: every other
// hook is a no-op. Dtype kFloat means no autocast at all (float32 everywhere).
// PrecisionImpl<FP32> and PrecisionImpl<BF16> are this template; FP16 adds a loss scaler
// (fp16.hpp).
#include <loom/precision/precision_decl.hpp>

namespace loom::precision {

/// A precision policy that only autocasts the forward pass to `Dtype` (kFloat: not at all).
template <torch::ScalarType Dtype>
struct AutocastPrecision {
  AutocastPrecision(const TrainingArguments&, torch::Device device) : device_(device) {}
  [[nodiscard]] Autocast autocast() const {
    if constexpr (Dtype == torch::kFloat) return {};
    else return {device_, Dtype};
  }
  [[nodiscard]] torch::Tensor scale_loss(const torch::Tensor& loss) const { return loss; }
  void unscale(const std::vector<torch::Tensor>&) {}
  [[nodiscard]] torch::Tensor found_inf() const { return {}; }
  void update() {}
  [[nodiscard]] nlohmann::json state_dict() const { return nlohmann::json::object(); }
  void load_state_dict(const nlohmann::json&) {}

 private:
  torch::Device device_;
};

/// precision::FP32: float32 everywhere; every hook is a no-op.
template <>
struct PrecisionImpl<FP32> : AutocastPrecision<torch::kFloat> {
  using AutocastPrecision::AutocastPrecision;
};
static_assert(PrecisionPolicy<PrecisionImpl<FP32>>, "loom: PrecisionImpl<FP32> does not model PrecisionPolicy");

/// precision::BF16: forward and loss under bfloat16 autocast; parameters, gradients and
/// optimizer state stay float32, so no loss scaling is needed.
template <>
struct PrecisionImpl<BF16> : AutocastPrecision<torch::kBFloat16> {
  using AutocastPrecision::AutocastPrecision;
};
static_assert(PrecisionPolicy<PrecisionImpl<BF16>>, "loom: PrecisionImpl<BF16> does not model PrecisionPolicy");

}  // namespace loom::precision
