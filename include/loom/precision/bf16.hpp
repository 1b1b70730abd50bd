#pragma once
// precision::BF16: forward and loss under bfloat16 autocast (CPU or CUDA); parameters,
// gradients and optimizer state stay float32, so no loss scaling is needed.
#include <loom/precision/precision_decl.hpp>

namespace loom::precision {
template <>
struct PrecisionImpl<BF16> {
  PrecisionImpl(const TrainingArguments&, torch::Device device) : device_(device) {}
  [[nodiscard]] Autocast autocast() const { return {device_, torch::kBFloat16}; }
  [[nodiscard]] torch::Tensor scale_loss(const torch::Tensor& loss) const { return loss; }
  void unscale(const std::vector<torch::Tensor>&) {}
  [[nodiscard]] torch::Tensor found_inf() const { return {}; }
  void update() {}
  [[nodiscard]] nlohmann::json state_dict() const { return nlohmann::json::object(); }
  void load_state_dict(const nlohmann::json&) {}

 private:
  torch::Device device_;
};
}  // namespace loom::precision
