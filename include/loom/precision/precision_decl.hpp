#pragma once
// Precision policies: PrecisionImpl<Tag>, one specialization per tag, each a PrecisionPolicy.

#include <loom/config/meta.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/policy/tags.hpp>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <concepts>
#include <utility>
#include <vector>

namespace loom::precision {

/// Specialized per precision tag, each a PrecisionPolicy; this primary template only fails loudly.
template <class Tag>
struct PrecisionImpl {
  static_assert(dependent_false_v<Tag>, "loom: no PrecisionImpl for this precision tag; include its header "
                                      "from loom/precision/");
};

/// Autocast to `dtype` on `device`'s type for the lifetime of the object (nestable);
/// a default-constructed one does nothing.
class Autocast {
 public:
  Autocast() = default;
  /// Enables autocast for `device`'s type with `dtype`.
  Autocast(torch::Device device, torch::ScalarType dtype) : active_(true), type_(device.type()) {
    prev_enabled_ = at::autocast::is_autocast_enabled(type_);
    prev_dtype_ = at::autocast::get_autocast_dtype(type_);
    at::autocast::set_autocast_enabled(type_, true);
    at::autocast::set_autocast_dtype(type_, dtype);
    at::autocast::increment_nesting();
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  /// Takes over `other`'s scope (precision::FromArgs returns its member's); `other` then does nothing.
  Autocast(Autocast&& other) noexcept
      : active_(std::exchange(other.active_, false)), type_(other.type_), prev_enabled_(other.prev_enabled_),
        prev_dtype_(other.prev_dtype_) {}
  Autocast& operator=(Autocast&&) = delete;
  ~Autocast() {
    if (!active_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, prev_enabled_);
    at::autocast::set_autocast_dtype(type_, prev_dtype_);
  }

 private:
  bool active_ = false;
  c10::DeviceType type_ = c10::DeviceType::CPU;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

/// What the Trainer needs of a precision policy (PrecisionImpl<Tag> for each tag).
template <class P>
concept PrecisionPolicy =
    std::constructible_from<P, const TrainingArguments&, torch::Device> &&
    requires(P& p, const P& cp, const torch::Tensor& loss, const std::vector<torch::Tensor>& params,
             const nlohmann::json& state) {
      { cp.autocast() } -> std::same_as<Autocast>;                   // RAII scope for forward + loss
      { cp.scale_loss(loss) } -> std::convertible_to<torch::Tensor>;  // what backward() is called on
      p.unscale(params);                                             // before clipping
      { cp.found_inf() } -> std::convertible_to<torch::Tensor>;       // device flag (undefined: never skips)
      p.update();                                                    // after the optimizer step
      { cp.state_dict() } -> std::convertible_to<nlohmann::json>;     // what scaler.json holds
      p.load_state_dict(state);
    };

/// A precision policy that scales the loss and may skip steps (FP16): the Trainer logs the
/// skipped steps of each logging window and stops when the scale collapses.
template <class P>
concept ScalesLoss = PrecisionPolicy<P> && requires(const P& cp, int64_t n) {
  { cp.scale() } -> std::convertible_to<torch::Tensor>;
  cp.check_scale_floor(n, n);  // throws loom::Error below the floor
};

}  // namespace loom::precision
