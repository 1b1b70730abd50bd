#pragma once
// Definitions of models/lora.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/models/lora.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom::models {

namespace detail {
inline constexpr std::string_view peft_prefix = "base_model.model.";
inline constexpr std::string_view adapter_config_file = "adapter_config.json";
inline constexpr std::string_view adapter_weights_file = "adapter_model.safetensors";

// Each AdaptableLinear of `model` once, by its first name.
inline std::vector<std::pair<std::string, AdaptableLinearImpl*>> adaptable_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, AdaptableLinearImpl*>> out;
  std::set<const torch::nn::Module*> seen;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* layer = item.value()->as<AdaptableLinear>();
    if (layer != nullptr && seen.insert(layer).second) out.emplace_back(item.key(), layer);
  }
  return out;
}

// An adapter's parameter (<layer>.lora_A.weight / lora_B.weight), by its name in the model.
inline bool is_lora_parameter(const std::string& name) {
  return name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
}

inline bool any_fan_in_fan_out(const torch::nn::Module& model) {
  for (const auto& m : model.modules(/*include_self=*/false))
    if (const auto* layer = m->as<AdaptableLinear>(); layer != nullptr && layer->has_adapter() && layer->fan_in_fan_out())
      return true;
  return false;
}

inline bool targeted(const LoraConfig& c, const std::string& name) {
  if (c.target_regex) return std::regex_match(name, std::regex(*c.target_regex));
  for (const auto& t : c.target_modules)
    if (name == t || (name.size() > t.size() && name.ends_with("." + t))) return true;
  return false;
}
}  // namespace detail

LOOM_INLINE double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

LOOM_INLINE void validate(const LoraConfig& c, std::string_view where) {
  check(c.r > 0, "{}: LoRA's r must be a positive integer, got {}", where, c.r);
  check(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0, "{}: lora_dropout must be in [0, 1), got {}", where,
        c.lora_dropout);
  check(c.bias == "none", "{}: LoRA's bias is \"{}\"; loom trains no bias (\"none\")", where, c.bias);
  check(!c.target_modules.empty() || c.target_regex.has_value(),
        "{}: LoRA needs target_modules (module names, or a regex)", where);
  if (c.target_regex) {
    try {
      (void)std::regex(*c.target_regex);
    } catch (const std::regex_error& e) {
      fail("{}: target_modules regex \"{}\" is not a valid regular expression: {}", where, *c.target_regex, e.what());
    }
  }
}

LOOM_INLINE AdaptableLinearImpl::AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool with_bias,
                                                     bool fan_in_fan_out)
    : fan_in_fan_out_(fan_in_fan_out) {
  // Zeros, drawing nothing from the generator: the model that holds the layer initializes it
  // (its init_weights), in the order of its own draws.
  weight = register_parameter("weight", fan_in_fan_out ? torch::zeros({in_features, out_features})
                                                       : torch::zeros({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out_features}));
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor result;
  if (fan_in_fan_out_) {  // HF's Conv1D: bias + x @ weight
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(1);
    result = torch::addmm(bias, x.view({-1, x.size(-1)}), weight).view(sizes);
  } else {
    result = torch::nn::functional::linear(x, weight, bias);
  }
  if (lora_A.is_empty()) return result;
  // PEFT's lora.Linear.forward: the input in the adapter's dtype, then result + B(A(drop(x))) * s.
  const auto dtype = result.scalar_type();
  auto in = x.to(lora_A->weight.scalar_type());
  if (dropout_ > 0.0) in = torch::nn::functional::dropout(in, torch::nn::functional::DropoutFuncOptions().p(dropout_).training(is_training()));
  result = result + lora_B(lora_A(in)) * scaling_;
  return result.to(dtype);
}

LOOM_INLINE void AdaptableLinearImpl::add_adapter(int64_t r, double scaling, double dropout) {
  check(!has_adapter(), "this layer already carries a LoRA adapter");
  const auto options = torch::TensorOptions().dtype(weight.scalar_type()).device(weight.device());
  const int64_t in = fan_in_fan_out_ ? weight.size(0) : weight.size(1);
  const int64_t out = fan_in_fan_out_ ? weight.size(1) : weight.size(0);
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, r).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(r, out).bias(false)));
  lora_A->to(options.device(), options.dtype().toScalarType());
  lora_B->to(options.device(), options.dtype().toScalarType());
  torch::NoGradGuard no_grad;
  lora_B->weight.zero_();
  scaling_ = scaling;
  dropout_ = dropout;
}

LOOM_INLINE void AdaptableLinearImpl::merge_adapter() {
  if (!has_adapter()) return;
  {
    torch::NoGradGuard no_grad;
    auto delta = lora_B->weight.matmul(lora_A->weight) * scaling_;  // [out, in]
    if (fan_in_fan_out_) delta = delta.t();
    weight.add_(delta.to(weight.scalar_type()));
  }
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_A = nullptr;
  lora_B = nullptr;
}

LOOM_INLINE int apply_lora(torch::nn::Module& model, const LoraConfig& config) {
  validate(config, "LoraConfig");
  const auto layers = detail::adaptable_layers(model);
  int count = 0;
  for (const auto& [name, layer] : layers)
    if (detail::targeted(config, name)) {
      layer->add_adapter(config.r, config.scaling(), config.lora_dropout);
      ++count;
    }
  if (count == 0) {
    // A target naming a module that exists but cannot carry an adapter says so.
    std::string other;
    for (const auto& item : model.named_modules("", false))
      if (item.value()->as<AdaptableLinear>() == nullptr && detail::targeted(config, item.key())) {
        other = item.key();
        break;
      }
    if (!other.empty())
      fail("LoRA target {} is a {}; loom's adapters go on the models' linear projections", other,
           model.named_modules("", false)[other]->name());
    std::string targets = config.target_regex ? "regex \"" + *config.target_regex + "\"" : "";
    for (const auto& t : config.target_modules) targets += (targets.empty() ? "" : ", ") + t;
    std::string known;
    std::set<std::string> suffixes;
    for (const auto& [name, layer] : layers) suffixes.insert(name.substr(name.rfind('.') + 1));
    for (const auto& s : suffixes) known += (known.empty() ? "" : ", ") + s;
    fail("LoRA target_modules ({}) match no module of the model; its linear projections are named {}", targets, known);
  }
  for (auto& p : model.named_parameters())
    if (!detail::is_lora_parameter(p.key()))
      p.value().requires_grad_(false);
  return count;
}

LOOM_INLINE void save_adapter(const torch::nn::Module& model, const LoraConfig& config,
                              const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : model.named_parameters())
    if (detail::is_lora_parameter(p.key()))
      tensors.emplace_back(std::string(detail::peft_prefix) + p.key(), p.value().detach().cpu().contiguous());
  check(!tensors.empty(), "save_adapter: the model carries no LoRA adapter (apply_lora or load_adapter first)");
  std::filesystem::create_directories(dir);
  checkpoint::save_safetensors(tensors, dir / detail::adapter_weights_file, {{"format", "pt"}});
  nlohmann::ordered_json j = {{"peft_type", "LORA"},
                      {"task_type", config.task_type},
                      {"r", config.r},
                      {"lora_alpha", config.lora_alpha},
                      {"lora_dropout", config.lora_dropout},
                      {"bias", config.bias},
                      {"use_rslora", config.use_rslora},
                      {"fan_in_fan_out", detail::any_fan_in_fan_out(model)},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"modules_to_save", nullptr},
                      {"use_dora", false},
                      {"base_model_name_or_path", config.base_model_name_or_path
                                                      ? nlohmann::ordered_json(*config.base_model_name_or_path)
                                                      : nlohmann::ordered_json(nullptr)}};
  if (config.target_regex) j["target_modules"] = *config.target_regex;
  else j["target_modules"] = config.target_modules;
  json::write_file(j, dir / detail::adapter_config_file);
}

LOOM_INLINE LoraConfig lora_config_from_json(const nlohmann::json& j, std::string_view where) {
  check(j.is_object(), "{}: an adapter config must be a JSON object", where);
  const auto peft_type = j.value("peft_type", std::string("LORA"));
  check(peft_type == "LORA", "{}: peft_type is \"{}\"; loom reads LoRA adapters", where, peft_type);
  LoraConfig c;
  const auto number = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    check(j[key].is_number(), "{}: field '{}' must be a number", where, key);
    field = j[key].get<std::decay_t<decltype(field)>>();
  };
  number("r", c.r);
  number("lora_alpha", c.lora_alpha);
  number("lora_dropout", c.lora_dropout);
  if (j.contains("bias") && j["bias"].is_string()) c.bias = j["bias"].get<std::string>();
  if (j.contains("use_rslora") && j["use_rslora"].is_boolean()) c.use_rslora = j["use_rslora"].get<bool>();
  // fan_in_fan_out follows the layer here (HF's Conv1D stores [in, out]), as PEFT sets it.
  if (j.contains("task_type") && j["task_type"].is_string()) c.task_type = j["task_type"].get<std::string>();
  if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  const auto& t = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
  if (t.is_string()) c.target_regex = t.get<std::string>();
  else if (t.is_array())
    for (const auto& e : t) {
      check(e.is_string(), "{}: field 'target_modules' must hold strings", where);
      c.target_modules.push_back(e.get<std::string>());
    }
  // What changes the arithmetic and loom does not implement must be absent or default.
  const auto off = [&](const char* key) {
    if (!j.contains(key)) return;
    const auto& v = j[key];
    const bool is_default = v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty());
    check(is_default, "{}: field '{}' is {}; loom's LoRA does not implement it", where, key, v.dump());
  };
  for (const char* key : {"use_dora", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern",
                          "exclude_modules", "target_parameters", "trainable_token_indices",
                          "layer_replication", "lora_bias"})
    off(key);
  // And PEFT's other variants: every use_* switch but use_rslora, every *_config block.
  for (const auto& [key, value] : j.items())
    if ((key.starts_with("use_") && key != "use_rslora") ||
        (key.ends_with("_config") && key != "megatron_config" && key != "loftq_config"))
      off(key.c_str());
  if (j.contains("loftq_config")) off("loftq_config");
  validate(c, where);
  return c;
}

LOOM_INLINE LoraConfig load_adapter(torch::nn::Module& model, const std::filesystem::path& dir) {
  const auto config_path = dir / detail::adapter_config_file;
  check(std::filesystem::is_regular_file(config_path), "{} does not exist (a PEFT adapter folder holds {} and {})",
        config_path.string(), detail::adapter_config_file, detail::adapter_weights_file);
  const auto config = lora_config_from_json(json::read_file(config_path), config_path.string());
  const auto weights_path = dir / detail::adapter_weights_file;
  check(std::filesystem::is_regular_file(weights_path), "{} does not exist", weights_path.string());
  const auto stored = checkpoint::load_safetensors(weights_path);
  apply_lora(model, config);
  std::map<std::string, torch::Tensor> params;
  for (const auto& p : model.named_parameters())
    if (detail::is_lora_parameter(p.key()))
      params[std::string(detail::peft_prefix) + p.key()] = p.value();
  std::vector<std::string> problems;
  std::set<std::string> found;
  for (const auto& [name, t] : stored) {
    const auto it = params.find(name);
    if (it == params.end()) {
      problems.push_back("unexpected " + name);
      continue;
    }
    found.insert(name);
    if (it->second.sizes() != t.sizes())
      problems.push_back(name + " has shape " + c10::str(t.sizes()) + " in the file but " +
                         c10::str(it->second.sizes()) + " here (an adapter made for another base model)");
  }
  for (const auto& [name, p] : params)
    if (!found.contains(name)) problems.push_back("missing " + name);
  if (!problems.empty()) {
    std::string text;
    for (std::size_t i = 0; i < problems.size() && i < 8; ++i) text += (i ? "; " : "") + problems[i];
    if (problems.size() > 8) text += "; and " + std::to_string(problems.size() - 8) + " more";
    fail("{} does not fit this model: {}", weights_path.string(), text);
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : stored) params.at(name).copy_(t);
  return config;
}

LOOM_INLINE void merge_and_unload(torch::nn::Module& model) {
  for (auto& [name, layer] : detail::adaptable_layers(model)) layer->merge_adapter();
  for (auto& p : model.parameters()) p.requires_grad_(true);
}

}  // namespace loom::models
