#pragma once
// Definitions of optim/param_groups.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/optim/param_groups.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <string>
#include <utility>
#include <vector>

namespace loom::optim {

namespace detail {
LOOM_INLINE bool is_norm_module(const torch::nn::Module& m) {
  return m.as<torch::nn::LayerNorm>() || m.as<torch::nn::GroupNorm>() || m.as<torch::nn::BatchNorm1d>() ||
         m.as<torch::nn::BatchNorm2d>() || m.as<torch::nn::BatchNorm3d>() ||
         m.as<torch::nn::InstanceNorm1d>() || m.as<torch::nn::InstanceNorm2d>() ||
         m.as<torch::nn::InstanceNorm3d>() || m.as<torch::nn::LocalResponseNorm>();
}
LOOM_INLINE bool is_norm_name(std::string name) {
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::regex pattern(R"(bias|layernorm|rmsnorm|(?:^|\.)norm(?:$|\.)|_norm(?:$|\.))");
  return std::regex_search(name, pattern);
}
}  // namespace detail

LOOM_INLINE std::vector<std::string> decay_parameter_names(const torch::nn::Module& model) {
  std::vector<std::string> norm_prefixes;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (detail::is_norm_module(*item.value())) norm_prefixes.push_back(item.key() + ".");
  std::vector<std::string> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    bool in_norm = false;
    for (const auto& prefix : norm_prefixes) in_norm = in_norm || name.rfind(prefix, 0) == 0;
    if (!in_norm && !detail::is_norm_name(name)) out.push_back(name);
  }
  return out;
}

LOOM_INLINE std::vector<ParamGroup> decay_groups(const torch::nn::Module& model, double weight_decay) {
  const auto decay = decay_parameter_names(model);
  ParamGroup with{{}, {}, weight_decay, std::nullopt}, without{{}, {}, 0.0, std::nullopt};
  for (const auto& item : model.named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    const bool d = std::find(decay.begin(), decay.end(), item.key()) != decay.end();
    auto& g = d ? with : without;
    g.params.push_back(item.value());
    g.names.push_back(item.key());
  }
  std::vector<ParamGroup> groups;
  if (!with.params.empty()) groups.push_back(std::move(with));
  if (!without.params.empty()) groups.push_back(std::move(without));
  return groups;
}

}  // namespace loom::optim
