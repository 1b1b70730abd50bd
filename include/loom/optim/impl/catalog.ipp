#pragma once
// Definitions of optim/catalog.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/optim/catalog.hpp>

#include <string>
#include <string_view>

namespace loom::optim {

LOOM_INLINE Algorithm algorithm_from_name(std::string_view name) {
  if (const Rule* rule = find_rule(name)) return rule->id;
  std::string known;
  for (const auto& r : kOptimizerRules) known += (known.empty() ? "" : ", ") + std::string(r.name);
  fail("--optim '{}' is not one of {}", name, known);
}

LOOM_INLINE std::string_view algorithm_name(Algorithm algorithm) {
  if (algorithm == Algorithm::torch) return "torch";
  const Rule* rule = find_rule(algorithm);
  return rule != nullptr ? rule->name : std::string_view{};
}

}  // namespace loom::optim
