#pragma once
// Precision policies. PrecisionImpl<Tag> is specialized once per precision tag, each in its
// own file; the primary template only fails loudly. A specialization provides:
//   explicit PrecisionImpl(const TrainingArguments&, torch::Device)
//   Autocast autocast() const                     RAII scope for forward + loss
//   torch::Tensor scale_loss(const torch::Tensor&)  what backward() is called on
//   void unscale(const std::vector<torch::Tensor>& params)  before clipping
//   torch::Tensor found_inf() const               device flag (undefined: never skips)
//   void update()                                 after the optimizer step
//   nlohmann::json state_dict() const / void load_state_dict(const nlohmann::json&)

#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/policy/tags.hpp>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <vector>

namespace loom::precision {

template <class T>
inline constexpr bool dependent_false = false;

/// Specialized per precision tag (see the top of this file).
template <class Tag>
struct PrecisionImpl {
  static_assert(dependent_false<Tag>, "loom: no PrecisionImpl for this precision tag; include its header "
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

}  // namespace loom::precision
