#pragma once
// precision::FP16: float16 autocast plus a dynamic loss scaler. By default it is PyTorch's
// GradScaler (initial scale 2^16, growth 2.0, backoff 0.5, growth interval 2000), HF's; with
// --loss_scale_rule deepspeed (a --deepspeed config's fp16 section) it is DeepSpeed's
// DynamicLossScaler: the scale doubles each time loss_scale_window clean steps have passed since
// the last overflow, and halves (to at least min_loss_scale) only when loss_scale_hysteresis
// overflows have used up the hysteresis, which a growth (or, with consecutive_hysteresis, any
// clean step) refills. Everything is decided on the device: the gradients are unscaled and
// checked by _amp_foreach_non_finite_check_and_unscale_ (before clipping), the optimizer step
// reads found_inf on the device (the fused AdamW kernel skips itself), and _amp_update_scale_
// (or DeepSpeed's rule in tensor ops) backs off or grows the scale. The scaler state is
// checkpointed (HF forgets it).
#include <loom/config/error.hpp>
#include <loom/config/json.hpp>
#include <loom/config/validate.hpp>
#include <loom/precision/precision_decl.hpp>

#include <sstream>

namespace loom::precision {

/// The loss scaler's knobs.
struct ScalerOptions {
  double init_scale = 65536.0;   ///< 2^16
  double growth_factor = 2.0;    ///< scale *= this after growth_interval clean steps
  double backoff_factor = 0.5;   ///< scale *= this after a step with inf/nan gradients
  int64_t growth_interval = 2000;  ///< clean steps between growths
  /// The smallest scale: below it after a skipped step (torch's rule), or at it when a step
  /// overflows (DeepSpeed's), the run stops with a loom::Error: the loss overflows float16
  /// even unscaled, so every step is skipped.
  double min_scale = 1.0;
  bool deepspeed = false;          ///< DeepSpeed's DynamicLossScaler rule instead of GradScaler's
  int64_t hysteresis = 2;          ///< DeepSpeed's delayed_shift (hysteresis)
  bool consecutive_hysteresis = false;
};

/// The options --fp16's flags give (the loss scale group of TrainingArguments).
inline ScalerOptions scaler_options(const TrainingArguments& args) {
  ScalerOptions o;
  o.deepspeed = args.loss_scale_rule == loom::detail::kLossScaleRules[1];
  o.init_scale = args.initial_loss_scale;
  o.growth_interval = args.loss_scale_window.value_or(o.deepspeed ? 1000 : 2000);
  o.min_scale = args.min_loss_scale;
  o.hysteresis = args.loss_scale_hysteresis.value_or(2);
  o.consecutive_hysteresis = args.consecutive_hysteresis;
  return o;
}

template <>
struct PrecisionImpl<FP16> {
  PrecisionImpl(const TrainingArguments& args, torch::Device device) : PrecisionImpl(device, scaler_options(args)) {}
  PrecisionImpl(torch::Device device, ScalerOptions options) : device_(device), options_(options) {
    const auto f = torch::TensorOptions().device(device).dtype(torch::kFloat);
    scale_ = torch::full({1}, options.init_scale, f);
    growth_tracker_ = torch::zeros({1}, f.dtype(torch::kInt));
    found_inf_ = torch::zeros({1}, f);
    // DeepSpeed's counters: iterations since the last overflow (cur_iter - last_overflow_iter,
    // 1 at the start), the hysteresis left, and whether an overflow came at the minimum scale.
    since_overflow_ = torch::ones({1}, f.dtype(torch::kLong));
    hysteresis_ = torch::full({1}, options.hysteresis, f.dtype(torch::kLong));
    at_floor_ = torch::zeros({1}, f.dtype(torch::kBool));
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
    if (options_.deepspeed) return update_deepspeed();
    at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                           options_.growth_interval);
  }
  /// The current scale (a device tensor of one element).
  [[nodiscard]] const torch::Tensor& scale() const { return scale_; }
  /// Called after a skipped step (a host read of the scale): below min_scale, a loom::Error.
  void check_scale_floor(int64_t skipped_steps, int64_t global_step) const {
    const double s = scale_.item<double>();
    if (options_.deepspeed ? !at_floor_.item<bool>() : s >= options_.min_scale) return;
    std::ostringstream m;
    if (options_.deepspeed)
      m << "loom: the fp16 loss scale is at its minimum (" << s << ", --min_loss_scale) and step " << global_step
        << " overflowed again (DeepSpeed stops here too: \"Current loss scale already at minimum\"), after "
        << skipped_steps << " skipped steps: nothing trains. ";
    else
      m << "loom: the fp16 loss scale fell to " << s << " (below " << options_.min_scale << ") at step " << global_step
        << " after " << skipped_steps << " skipped steps: the gradients overflow at every step, so nothing trains. ";
    m << "Lower --learning_rate, train in --bf16, or look for inf/nan in the loss";
    throw Error(m.str());
  }
  [[nodiscard]] nlohmann::json state_dict() const {
    if (options_.deepspeed)  // DeepSpeed's DynamicLossScaler's fields, by its names
      return {{"rule", "deepspeed"},
              {"cur_scale", scale_.item<double>()},
              {"cur_hysteresis", hysteresis_.item<int64_t>()},
              {"iterations_since_overflow", since_overflow_.item<int64_t>()},
              {"scale_window", options_.growth_interval},
              {"min_scale", options_.min_scale},
              {"delayed_shift", options_.hysteresis},
              {"consecutive_hysteresis", options_.consecutive_hysteresis}};
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
    const bool saved_deepspeed = j.is_object() && j.contains("rule") && j["rule"] == "deepspeed";
    if (saved_deepspeed != options_.deepspeed)
      throw Error(std::string("loom: the checkpoint's fp16 loss scaler follows ") +
                  (saved_deepspeed ? "DeepSpeed's rule" : "torch's GradScaler rule") + ", this run " +
                  (options_.deepspeed ? "DeepSpeed's" : "torch's") + " (--loss_scale_rule): resume with the same rule");
    if (options_.deepspeed) {
      const double scale = f.number("cur_scale", 0.0);
      if (!(scale > 0)) f.fail("cur_scale", "must be positive, got " + j["cur_scale"].dump());
      const int64_t hysteresis = f.integer("cur_hysteresis", 1);
      const int64_t since = f.integer("iterations_since_overflow", 1);
      scale_.fill_(scale);
      hysteresis_.fill_(hysteresis);
      since_overflow_.fill_(since);
      return;
    }
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
  // DeepSpeed's DynamicLossScaler.update_scale, in tensor ops on the device (no host sync).
  void update_deepspeed() {
    torch::NoGradGuard no_grad;
    const auto overflow = found_inf_ > 0;
    const auto shift = options_.hysteresis == 1 ? torch::ones_like(overflow) : hysteresis_ == 1;
    // At the minimum with nothing left to absorb it, DeepSpeed raises; check_scale_floor reports it.
    at_floor_.logical_or_(overflow.logical_and(shift).logical_and(scale_ == options_.min_scale));
    const auto backed_off = torch::where(shift, (scale_ / 2).clamp_min(options_.min_scale), scale_);
    const auto absorbed = torch::where(shift, hysteresis_, hysteresis_ - 1);
    const auto stable = since_overflow_ - 1;
    const auto grow = stable.gt(0).logical_and(stable.remainder(options_.growth_interval).eq(0));
    const auto grown = torch::where(grow, scale_ * 2, scale_);
    const auto refilled = options_.consecutive_hysteresis
                              ? torch::full_like(hysteresis_, options_.hysteresis)
                              : torch::where(grow, torch::full_like(hysteresis_, options_.hysteresis), hysteresis_);
    scale_.copy_(torch::where(overflow, backed_off, grown));
    hysteresis_.copy_(torch::where(overflow, absorbed, refilled));
    since_overflow_.copy_(torch::where(overflow, torch::ones_like(since_overflow_), since_overflow_ + 1));
  }

  torch::Tensor scale_, growth_tracker_, found_inf_;
  torch::Tensor since_overflow_, hysteresis_, at_floor_;
};
static_assert(PrecisionPolicy<PrecisionImpl<FP16>>, "loom: PrecisionImpl<FP16> does not model PrecisionPolicy");
}  // namespace loom::precision
