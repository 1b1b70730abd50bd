#pragma once
// precision::FP32: float32 everywhere; every hook is a no-op.
#include <loom/precision/precision_decl.hpp>

namespace loom::precision {
template <>
struct PrecisionImpl<FP32> {
  PrecisionImpl(const TrainingArguments&, torch::Device) {}
  [[nodiscard]] Autocast autocast() const { return {}; }
  [[nodiscard]] torch::Tensor scale_loss(const torch::Tensor& loss) const { return loss; }
  void unscale(const std::vector<torch::Tensor>&) {}
  [[nodiscard]] torch::Tensor found_inf() const { return {}; }
  void update() {}
  [[nodiscard]] nlohmann::json state_dict() const { return nlohmann::json::object(); }
  void load_state_dict(const nlohmann::json&) {}
};
}  // namespace loom::precision
