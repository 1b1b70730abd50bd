#pragma once
// precision::FromArgs: the member of PrecisionCatalog that --bf16 / --fp16 name (neither:
// FP32), chosen when the run starts. It holds that member's PrecisionImpl and forwards each
// call to it: one branch per call, a handful per optimizer step. A Trainer or Accelerator
// typed with it is one instantiation for every precision, where select_policies makes one per
// member.

#include <loom/config/validate.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/precision/bf16.hpp>
#include <loom/precision/fp16.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/precision_decl.hpp>

#include <optional>
#include <tuple>
#include <variant>

namespace loom::precision {

namespace detail {
template <class Catalog>
struct impl_variant;
template <class... Tags>
struct impl_variant<std::tuple<Tags...>> {
  using type = std::variant<PrecisionImpl<Tags>...>;
};
}  // namespace detail

template <>
class PrecisionImpl<FromArgs> {
 private:
  // The chosen member's call (defined before the public calls: their return types are deduced).
  template <class F>
  decltype(auto) visit(F&& f) const {
    return std::visit(f, *impl_);
  }
  template <class F>
  decltype(auto) visit(F&& f) {
    return std::visit(f, *impl_);
  }

 public:
  /// The member `args` name (--bf16 / --fp16; neither: the catalog's first, FP32).
  PrecisionImpl(const TrainingArguments& args, torch::Device device) {
    const std::string_view chosen = loom::detail::precision_member_chosen(args);
    visit_member<PrecisionCatalog>(chosen, [&]<class Tag>() {
      impl_.emplace(std::in_place_type<PrecisionImpl<Tag>>, args, device);
      facts_ = Tag::facts;
    });
    check(impl_.has_value(), "no precision policy is called {}", chosen);
  }
  /// The chosen member's facts (its name, whether it scales the loss).
  [[nodiscard]] const PrecisionFacts& facts() const { return facts_; }

  [[nodiscard]] Autocast autocast() const {
    return visit([](const auto& p) { return p.autocast(); });
  }
  [[nodiscard]] torch::Tensor scale_loss(const torch::Tensor& loss) const {
    return visit([&](const auto& p) { return torch::Tensor(p.scale_loss(loss)); });
  }
  void unscale(const std::vector<torch::Tensor>& params) {
    visit([&](auto& p) { p.unscale(params); });
  }
  [[nodiscard]] torch::Tensor found_inf() const {
    return visit([](const auto& p) { return torch::Tensor(p.found_inf()); });
  }
  void update() {
    visit([](auto& p) { p.update(); });
  }
  [[nodiscard]] nlohmann::json state_dict() const {
    return visit([](const auto& p) { return nlohmann::json(p.state_dict()); });
  }
  void load_state_dict(const nlohmann::json& state) {
    visit([&](auto& p) { p.load_state_dict(state); });
  }
  /// The loss scale of a member that scales the loss (FP16); an undefined tensor otherwise.
  [[nodiscard]] torch::Tensor scale() const {
    return visit([](const auto& p) -> torch::Tensor {
      if constexpr (ScalesLoss<std::decay_t<decltype(p)>>) return p.scale();
      else return {};
    });
  }
  /// The chosen member's floor check after a skipped step (only a loss-scaling member skips).
  void check_scale_floor(int64_t skipped_steps, int64_t global_step) const {
    visit([&](const auto& p) {
      if constexpr (ScalesLoss<std::decay_t<decltype(p)>>) p.check_scale_floor(skipped_steps, global_step);
    });
  }

 private:
  std::optional<typename detail::impl_variant<PrecisionCatalog>::type> impl_;  // set by the constructor
  PrecisionFacts facts_{};
};
static_assert(PrecisionPolicy<PrecisionImpl<FromArgs>>, "loom: PrecisionImpl<FromArgs> does not model PrecisionPolicy");
static_assert(ScalesLoss<PrecisionImpl<FromArgs>>, "loom: PrecisionImpl<FromArgs> must offer the loss-scaling calls");

}  // namespace loom::precision
