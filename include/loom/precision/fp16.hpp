#pragma once
// precision::FP16: float16 autocast plus a dynamic loss scaler with PyTorch's GradScaler
// defaults (initial scale 2^16, growth 2.0, backoff 0.5, growth interval 2000). Everything
// is decided on the device with ATen's AMP kernels: the gradients are unscaled and checked
// by _amp_foreach_non_finite_check_and_unscale_ (before clipping), the optimizer step reads
// found_inf on the device (the fused AdamW kernel skips itself), and _amp_update_scale_
// backs off or grows the scale. The scaler state is checkpointed (HF forgets it).
#include <loom/config/error.hpp>
#include <loom/config/json.hpp>
#include <loom/precision/precision_decl.hpp>

#include <sstream>

namespace loom::precision {

/// GradScaler's knobs.
struct ScalerOptions {
  double init_scale = 65536.0;   ///< 2^16
  double growth_factor = 2.0;    ///< scale *= this after growth_interval clean steps
  double backoff_factor = 0.5;   ///< scale *= this after a step with inf/nan gradients
  int64_t growth_interval = 2000;  ///< clean steps between growths
  /// Below this scale after a skipped step the run stops with a loom::Error: the loss
  /// overflows float16 even unscaled, so every step is skipped (DeepSpeed's min_loss_scale, 1).
  double min_scale = 1.0;
};

template <>
struct PrecisionImpl<FP16> {
  PrecisionImpl(const TrainingArguments&, torch::Device device, ScalerOptions options = {})
      : device_(device), options_(options) {
    const auto f = torch::TensorOptions().device(device).dtype(torch::kFloat);
    scale_ = torch::full({1}, options.init_scale, f);
    growth_tracker_ = torch::zeros({1}, f.dtype(torch::kInt));
    found_inf_ = torch::zeros({1}, f);
  }
  [[nodiscard]] Autocast autocast() const { return {device_, torch::kHalf}; }
  /// loss * scale (float32).
  [[nodiscard]] torch::Tensor scale_loss(const torch::Tensor& loss) const { return loss.to(torch::kFloat) * scale_; }
  /// Divides every gradient by the scale and records whether any is inf/nan.
  void unscale(const std::vector<torch::Tensor>& params) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : params)
      if (p.grad().defined()) grads.push_back(p.grad());
    found_inf_.zero_();
    if (grads.empty()) return;
    torch::NoGradGuard no_grad;
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf_, scale_.to(torch::kDouble).reciprocal().to(torch::kFloat));
  }
  /// 1.0 on the device when the last unscale found inf/nan, else 0.0.
  [[nodiscard]] torch::Tensor found_inf() const { return found_inf_; }
  /// Backs off or grows the scale from found_inf.
  void update() {
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  }
  /// The current scale (a device tensor of one element).
  [[nodiscard]] const torch::Tensor& scale() const { return scale_; }
  /// Called after a skipped step (a host read of the scale): below min_scale, a loom::Error.
  void check_scale_floor(int64_t skipped_steps, int64_t global_step) const {
    const double s = scale_.item<double>();
    if (s >= options_.min_scale) return;
    std::ostringstream m;
    m << "loom: the fp16 loss scale fell to " << s << " (below " << options_.min_scale << ") at step " << global_step
      << " after " << skipped_steps << " skipped steps: the gradients overflow at every step, so nothing trains. "
      << "Lower --learning_rate, train in --bf16, or look for inf/nan in the loss";
    throw Error(m.str());
  }
  [[nodiscard]] nlohmann::json state_dict() const {
    return {{"scale", scale_.item<double>()},
            {"growth_factor", options_.growth_factor},
            {"backoff_factor", options_.backoff_factor},
            {"growth_interval", options_.growth_interval},
            {"_growth_tracker", growth_tracker_.item<int64_t>()}};
  }
  /// Restores state_dict() output (torch.amp.GradScaler's keys); out-of-range values are
  /// loom::Errors naming the field.
  void load_state_dict(const nlohmann::json& j) {
    const json::Fields f(j, "");
    const double scale = f.number("scale", 0.0);
    if (!(scale > 0)) f.fail("scale", "must be positive, got " + j["scale"].dump());
    const double growth = f.number("growth_factor", 1.0);
    const double backoff = f.number("backoff_factor", 0.0);
    if (!(backoff > 0 && backoff < 1)) f.fail("backoff_factor", "must be in (0, 1), got " + j["backoff_factor"].dump());
    const int64_t interval = f.integer("growth_interval", 1);
    const int64_t tracker = f.integer("_growth_tracker", 0);
    scale_.fill_(scale);
    growth_tracker_.fill_(tracker);
    options_.growth_factor = growth;
    options_.backoff_factor = backoff;
    options_.growth_interval = interval;
  }

 private:
  torch::Device device_;
  ScalerOptions options_;
  torch::Tensor scale_, growth_tracker_, found_inf_;
};
static_assert(PrecisionPolicy<PrecisionImpl<FP16>>, "loom: PrecisionImpl<FP16> does not model PrecisionPolicy");
}  // namespace loom::precision
