#pragma once
// Definitions of config/optim_args.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/optim_args.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

namespace detail {

// One key an optimizer reads from --optim_args, and the values it accepts.
struct OptimArgKey {
  std::string_view optim, key;
  bool boolean;
  double low, high;    // accepted range
  bool high_included;  // [low, high] or [low, high)
};

inline constexpr double kNoLimit = 1e300;

inline constexpr std::array<OptimArgKey, 15> kOptimArgKeys = {{
    {"sgd", "momentum", false, 0.0, kNoLimit, true},
    {"sgd", "dampening", false, -kNoLimit, kNoLimit, true},
    {"sgd", "nesterov", true, 0.0, 1.0, true},
    {"adagrad", "lr_decay", false, 0.0, kNoLimit, true},
    {"adagrad", "eps", false, 0.0, kNoLimit, true},
    {"adagrad", "initial_accumulator_value", false, 0.0, kNoLimit, true},
    {"rmsprop", "momentum", false, 0.0, kNoLimit, true},
    {"rmsprop", "alpha", false, 0.0, kNoLimit, true},
    {"rmsprop", "eps", false, 0.0, kNoLimit, true},
    {"rmsprop", "centered", true, 0.0, 1.0, true},
    {"lion", "beta1", false, 0.0, 1.0, true},
    {"lion", "beta2", false, 0.0, 1.0, true},
    {"adafactor", "beta1", false, 0.0, 1.0, false},
    {"adafactor", "decay_rate", false, -kNoLimit, kNoLimit, true},
    {"adafactor", "clip_threshold", false, 0.0, kNoLimit, true},
}};

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
  for (const auto& k : detail::kOptimArgKeys)
    if (k.optim == optim) known += (known.empty() ? "" : ", ") + std::string(k.key);
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
    const detail::OptimArgKey* spec = nullptr;
    for (const auto& k : detail::kOptimArgKeys)
      if (k.optim == optim && k.key == key) spec = &k;
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
                    (spec->high >= detail::kNoLimit ? ">= " + detail::short_number(spec->low)
                                                    : "in [" + detail::short_number(spec->low) + ", " + detail::short_number(spec->high) +
                                                          (spec->high_included ? "]" : ")")) +
                    ", got " + value);
    }
    out.emplace_back(key, number);
  }
  if (optim == "sgd") {  // torch.optim.SGD's rule
    double momentum = 0.0, dampening = 0.0, nesterov = 0.0;
    for (const auto& [k, v] : out) (k == "momentum" ? momentum : k == "dampening" ? dampening : nesterov) = v;
    if (nesterov != 0.0 && (momentum <= 0.0 || dampening != 0.0))
      throw Error("loom: --optim_args nesterov=True needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  return out;
}

}  // namespace loom
