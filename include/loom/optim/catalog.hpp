#pragma once
// The update rules of OptimizerCatalog (policy/tags.hpp: each optimizer's --optim name and
// --optim_args keys, which validation reads), in HF's order. The lookups by name and by
// checkpoint id fold over that list, so adding an optimizer is its catalog entry, one rule file
// in optim/rules/ (rule.hpp lists what it declares, and it specializes RuleFor for its tag) and
// that file's #include here.

#include <loom/config/inline.hpp>
#include <loom/optim/rule.hpp>
#include <loom/optim/rules/adafactor.hpp>
#include <loom/optim/rules/adagrad.hpp>
#include <loom/optim/rules/adamw.hpp>
#include <loom/optim/rules/lion.hpp>
#include <loom/optim/rules/rmsprop.hpp>
#include <loom/optim/rules/sgd.hpp>
#include <loom/policy/tags.hpp>

#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>

namespace loom::optim {

namespace detail {
template <class... Tags>
std::tuple<typename RuleFor<Tags>::type...> rules_for(std::tuple<Tags...>*);
}  // namespace detail

/// Every update rule selectable by --optim: OptimizerCatalog's members (policy/tags.hpp)
/// mapped to their rules, in the catalog's (HF's) order.
using OptimizerRules = decltype(detail::rules_for(static_cast<OptimizerCatalog*>(nullptr)));

namespace detail {
template <class... R>
constexpr std::array<Rule, sizeof...(R)> rules_of(std::tuple<R...>*) {
  return {rule_of<R>()...};
}
}  // namespace detail

/// The Rule record of every rule of OptimizerRules, in its order.
inline constexpr auto kOptimizerRules = detail::rules_of(static_cast<OptimizerRules*>(nullptr));

namespace detail {
constexpr bool names_and_ids_unique() {
  for (std::size_t i = 0; i < kOptimizerRules.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (kOptimizerRules[i].name == kOptimizerRules[j].name || kOptimizerRules[i].id == kOptimizerRules[j].id)
        return false;
  return true;
}
}  // namespace detail
static_assert(detail::names_and_ids_unique(), "loom: two optimizer rules share a name or an Algorithm value");

/// The rule with checkpoint id `id`, null for none (Algorithm::torch, a wrapped torch optimizer).
constexpr const Rule* find_rule(Algorithm id) {
  for (const auto& r : kOptimizerRules)
    if (r.id == id) return &r;
  return nullptr;
}

/// The rule with HF --optim name `name`, null for none.
constexpr const Rule* find_rule(std::string_view name) {
  for (const auto& r : kOptimizerRules)
    if (r.name == name) return &r;
  return nullptr;
}

/// Algorithm for an HF `optim` name; unknown names are a loom::Error.
LOOM_INLINE Algorithm algorithm_from_name(std::string_view name);
/// The HF `optim` name of `algorithm` ("torch" for a wrapped torch::optim::Optimizer; empty for a
/// value no rule has).
LOOM_INLINE std::string_view algorithm_name(Algorithm algorithm);

}  // namespace loom::optim

#if defined(LOOM_HEADER_ONLY)
#include <loom/optim/impl/catalog.ipp>
#endif
