#pragma once
// Definitions of config/optim_args.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/optim_args.hpp>
#include <loom/policy/catalog.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

namespace detail {

// The keys `optim` reads from --optim_args (its catalog entry's), empty for an unknown name.
LOOM_INLINE std::span<const OptimArg> optim_arg_keys(std::string_view optim) {
  std::span<const OptimArg> keys;
  visit_member<OptimizerCatalog>(optim, [&]<class Tag>() { keys = Tag::optim_args; });
  return keys;
}

LOOM_INLINE std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

LOOM_INLINE std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace detail

LOOM_INLINE std::vector<std::pair<std::string, double>> parse_optim_args(std::string_view optim,
                                                                         std::string_view text) {
  std::string compact;
  for (char c : text)
    if (c != ' ') compact += c;
  std::vector<std::pair<std::string, double>> out;
  if (compact.empty()) return out;
  std::string known;
  const auto keys = detail::optim_arg_keys(optim);
  for (const auto& k : keys) known += (known.empty() ? "" : ", ") + std::string(k.key);
  std::size_t start = 0;
  while (start <= compact.size()) {
    const auto comma = std::min(compact.find(',', start), compact.size());
    const std::string pair = compact.substr(start, comma - start);
    start = comma + 1;
    const auto eq = pair.find('=');
    if (eq == std::string::npos || eq == 0 || pair.find('=', eq + 1) != std::string::npos)
      throw Error("loom: --optim_args must be key=value pairs separated by commas such as "
                  "'momentum=0.9,nesterov=True', got '" + pair + "' in '" + std::string(text) + "'");
    const std::string key = pair.substr(0, eq), value = pair.substr(eq + 1);
    if (key == "weight_decay")
      throw Error("loom: --optim_args weight_decay has no effect (the decay groups carry their own, as in HF); "
                  "use --weight_decay");
    const OptimArg* spec = nullptr;
    for (const auto& k : keys)
      if (k.key == key) spec = &k;
    if (spec == nullptr)
      throw Error("loom: --optim_args key '" + key + "' is not read by --optim " + std::string(optim) +
                  (known.empty() ? std::string(", which takes no --optim_args") : "; it reads " + known));
    for (const auto& [seen, v] : out)
      if (seen == key) throw Error("loom: --optim_args gives '" + key + "' twice");
    double number = 0.0;
    if (spec->boolean) {
      const auto v = detail::lower(value);
      if (v == "true" || v == "1" || v == "yes") number = 1.0;
      else if (v == "false" || v == "0" || v == "no") number = 0.0;
      else throw Error("loom: --optim_args " + key + " must be True or False, got '" + value + "'");
    } else {
      char* end = nullptr;
      number = value.empty() ? 0.0 : std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(number))
        throw Error("loom: --optim_args " + key + " must be a number, got '" + value + "'");
      const bool above = spec->high_included ? number > spec->high : number >= spec->high;
      if (number < spec->low || above)
        throw Error("loom: --optim_args " + key + " must be " +
                    (spec->high >= optimizer::kNoLimit ? ">= " + detail::short_number(spec->low)
                                                    : "in [" + detail::short_number(spec->low) + ", " + detail::short_number(spec->high) +
                                                          (spec->high_included ? "]" : ")")) +
                    ", got " + value);
    }
    out.emplace_back(key, number);
  }
  // A rule across keys, where the optimizer's catalog entry has one (SGD's nesterov).
  visit_member<OptimizerCatalog>(optim, [&]<class Tag>() {
    auto value = [&](std::string_view key) {
      for (const auto& [k, v] : out)
        if (k == key) return v;
      return 0.0;
    };
    if constexpr (requires { Tag::check_args(value); }) {
      const std::string_view problem = Tag::check_args(value);
      if (!problem.empty()) throw Error("loom: --optim_args " + std::string(problem));
    }
  });
  return out;
}

}  // namespace loom
