#pragma once
// Definitions of peft/lora.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/paths.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>
#include <loom/core/host_memory.hpp>
#include <loom/peft/lora.hpp>

#include <ATen/autocast_mode.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::peft {

namespace detail {
inline constexpr std::string_view peft_prefix = "base_model.model.";
inline constexpr std::string_view all_linear = "all-linear";

// Each AdaptableLinear of `model` once, by its first name.
inline std::vector<std::pair<std::string, AdaptableLinearImpl*>> adaptable_layers(const torch::nn::Module& model) {
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

// `name` equals `pattern` or ends with "." + pattern (PEFT's suffix rule).
inline bool name_matches(const std::string& name, const std::string& pattern) {
  return name == pattern || (name.size() > pattern.size() && name.ends_with("." + pattern));
}

// PEFT's re.fullmatch(target_modules, name), in PCRE2 (Python's re dialect, where std::regex
// reads ECMAScript) with a bounded match: a catastrophic pattern such as (.*)*(.*)*x ends in an
// error naming it instead of backtracking for hours.
class TargetPattern {
 public:
  TargetPattern(const std::string& pattern, std::string_view where) : pattern_(pattern), where_(where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset, nullptr));
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail("{}: target_modules regex \"{}\" is not a valid regular expression (at offset {}: {})", where, pattern,
           offset, reinterpret_cast<const char*>(message.data()));
    }
    context_.reset(pcre2_match_context_create(nullptr));
    pcre2_set_match_limit(context_.get(), kMatchLimit);
    data_.reset(pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  }
  [[nodiscard]] bool full_match(const std::string& name) const {
    const int rc = pcre2_match(code_.get(), reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, 0, data_.get(),
                               context_.get());
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
      fail("{}: target_modules regex \"{}\" gave up on module name '{}' after {} backtracking steps (nested "
           "repetitions such as (.*)* try every split of the name); write it without nested quantifiers",
           where_, pattern_, name, kMatchLimit);
    fail("{}: target_modules regex \"{}\" failed on module name '{}' (PCRE2 error {})", where_, pattern_, name, rc);
  }

 private:
  static constexpr uint32_t kMatchLimit = 1'000'000;
  struct Free {
    void operator()(pcre2_code* p) const { pcre2_code_free(p); }
    void operator()(pcre2_match_context* p) const { pcre2_match_context_free(p); }
    void operator()(pcre2_match_data* p) const { pcre2_match_data_free(p); }
  };
  std::string pattern_, where_;
  std::unique_ptr<pcre2_code, Free> code_;
  std::unique_ptr<pcre2_match_context, Free> context_;
  std::unique_ptr<pcre2_match_data, Free> data_;
};

// The adapter's A and B over `layers` at rank r, refused before anything is allocated when
// they cannot fit this machine's host memory (a CPU run; a device's own allocator answers for
// it), as models' configs are (models/pretrained.hpp).
inline void check_adapter_memory(const std::vector<std::pair<std::string, AdaptableLinearImpl*>>& layers, int64_t r) {
  double parameters = 0, bytes = 0;
  bool on_host = false;
  for (const auto& [name, layer] : layers) {
    const auto& w = layer->weight;
    const double elements = static_cast<double>(r) * static_cast<double>(layer->in_features() + layer->out_features());
    const bool half = w.scalar_type() == torch::kBFloat16 || w.scalar_type() == torch::kHalf;  // kept in float32
    parameters += elements;
    bytes += elements * static_cast<double>(half ? 4 : w.element_size());
    on_host = on_host || w.device().is_cpu();
  }
  const double host = host_memory_bytes(), have = host / std::max(local_processes(), 1);
  check(!on_host || host <= 0 || bytes <= have,
        "LoRA rank r {} gives the adapter {:.0f} parameters over {} layers, {:.1f} GB, more than the {:.1f} GB of host "
        "memory each of this machine's {} process(es) has (MemTotal, or the cgroup's memory.max); lower r",
        r, parameters, layers.size(), bytes / 1e9, have / 1e9, std::max(local_processes(), 1));
}

// Whether `name` is a target of `c`; `pattern` is c.target_regex compiled (once, by the caller).
inline bool targeted(const LoraConfig& c, const TargetPattern* pattern, const std::string& name) {
  if (pattern != nullptr) return pattern->full_match(name);
  for (const auto& t : c.target_modules)
    if (t == all_linear || name_matches(name, t)) return true;
  return false;
}

// The parameters of the modules `modules` names, by their names in the model.
inline std::vector<std::pair<std::string, torch::Tensor>> saved_module_parameters(
    const torch::nn::Module& model, const std::vector<std::string>& modules) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  if (modules.empty()) return out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    if (is_lora_parameter(p.key())) continue;
    const auto dot = p.key().rfind('.');
    const std::string owner = dot == std::string::npos ? "" : p.key().substr(0, dot);
    for (const auto& m : modules)
      if (!owner.empty() && name_matches(owner, m)) {
        out.emplace_back(p.key(), p.value());
        break;
      }
  }
  return out;
}

// PEFT's PeftModelForSequenceClassification (task_type SEQ_CLS) adds its classification heads
// to modules_to_save, and writes both names to adapter_config.json whichever the model has.
inline constexpr std::string_view sequence_classification = "SEQ_CLS";
inline constexpr std::array<std::string_view, 2> classification_heads = {"classifier", "score"};

inline bool is_classification_head(const LoraConfig& c, const std::string& module) {
  return c.task_type == sequence_classification &&
         std::find(classification_heads.begin(), classification_heads.end(), module) != classification_heads.end();
}

// The modules `c` trains whole on `model`: c.modules_to_save (each once) and, with task_type
// SEQ_CLS, the classification heads the model has. A head the model lacks is left out, as
// PEFT passes over it; any other name is kept for apply_lora to refuse.
inline std::vector<std::string> modules_to_save(const torch::nn::Module& model, const LoraConfig& c) {
  std::vector<std::string> names = c.modules_to_save;
  if (c.task_type == sequence_classification) names.insert(names.end(), classification_heads.begin(), classification_heads.end());
  std::vector<std::string> out;
  for (const auto& m : names)
    if (std::find(out.begin(), out.end(), m) == out.end() &&
        (!is_classification_head(c, m) || !saved_module_parameters(model, {m}).empty()))
      out.push_back(m);
  return out;
}

// `name` is the module `module` names or lies inside it (a dotted prefix of `name` matches it).
inline bool inside_module(const std::string& name, const std::string& module) {
  for (auto end = name.find('.'); end != std::string::npos; end = name.find('.', end + 1))
    if (name_matches(name.substr(0, end), module)) return true;
  return name_matches(name, module);
}

inline bool any_fan_in_fan_out(const torch::nn::Module& model) {
  for (const auto& [name, layer] : adaptable_layers(model))
    if (layer->has_adapter() && layer->fan_in_fan_out()) return true;
  return false;
}

// One line naming at most 8 problems.
inline std::string problems_text(const std::vector<std::string>& problems) {
  std::string text;
  for (std::size_t i = 0; i < problems.size() && i < 8; ++i) text += (i ? "; " : "") + problems[i];
  if (problems.size() > 8) text += "; and " + std::to_string(problems.size() - 8) + " more";
  return text;
}
}  // namespace detail

LOOM_INLINE std::vector<std::pair<std::string, AdaptableLinearImpl*>> adaptable_layers(const torch::nn::Module& model) {
  return detail::adaptable_layers(model);
}

LOOM_INLINE bool is_lora_parameter(const std::string& name) { return detail::is_lora_parameter(name); }

LOOM_INLINE double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / static_cast<double>(r);
}

LOOM_INLINE void validate(const LoraConfig& c, std::string_view where) {
  check(c.r > 0, "{}: LoRA's r must be a positive integer, got {}", where, c.r);
  check(std::isfinite(c.lora_alpha) && c.lora_alpha > 0, "{}: lora_alpha must be a positive number, got {}", where,
        c.lora_alpha);
  check(c.lora_dropout >= 0.0 && c.lora_dropout < 1.0, "{}: lora_dropout must be in [0, 1), got {}", where,
        c.lora_dropout);
  check(c.bias == "none", "{}: LoRA's bias is \"{}\"; loom trains no bias (\"none\")", where, c.bias);
  // PEFT's task types: CAUSAL_LM and FEATURE_EXTRACTION add no module to the adapter, SEQ_CLS its
  // classification head; TOKEN_CLS and QUESTION_ANS would train heads loom does not add, and
  // SEQ_2_SEQ_LM needs an encoder-decoder model.
  check(c.task_type == "CAUSAL_LM" || c.task_type == detail::sequence_classification ||
            c.task_type == "FEATURE_EXTRACTION",
        "{}: task_type \"{}\" is not one loom implements: CAUSAL_LM, SEQ_CLS (the classification head trained and "
        "saved beside the adapter) or FEATURE_EXTRACTION", where, c.task_type);
  check(!c.target_modules.empty() || c.target_regex.has_value(),
        "{}: LoRA needs target_modules (module names, \"all-linear\", or a regex)", where);
  for (const auto& m : c.modules_to_save) check(!m.empty(), "{}: modules_to_save holds an empty name", where);
  if (c.target_regex) (void)detail::TargetPattern(*c.target_regex, where);
}

LOOM_INLINE AdaptableLinearImpl::AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool with_bias,
                                                     bool fan_in_fan_out)
    : fan_in_fan_out_(fan_in_fan_out), in_features_(in_features), out_features_(out_features) {
  // Zeros, drawing nothing from the generator: the model that holds the layer initializes it
  // (its init_weights). Storage-less under loom::DeferredInit.
  weight = register_parameter("weight", fan_in_fan_out ? new_parameter_tensor({in_features, out_features})
                                                       : new_parameter_tensor({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", new_parameter_tensor({out_features}));
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::forward(const torch::Tensor& x) {
  torch::Tensor result;
  if (quantized_) {
    check(!holds_no_storage(quantized_->packed), "a 4-bit layer's weight holds no memory here: it is not materialized "
          "yet (a model built under loom::DeferredInit), or FullShard keeps only this rank's shard outside the "
          "layer's unit");
    // bitsandbytes' Linear4bit.forward: input and bias in the compute dtype, the weight
    // dequantized to it, the output back in the input's dtype.
    const auto dtype = x.scalar_type();
    const auto b = bias.defined() ? bias.to(compute_dtype_) : bias;
    result = linear_4bit(x.to(compute_dtype_), *quantized_, b).to(dtype);
    if (lora_A.is_empty() || detail::adapters_disabled()) return result;
    // PEFT's LoRA on Linear4bit: the update computed in the adapter's dtype and brought to the
    // result's before the sum (outside autocast).
    auto in = x.to(lora_A->weight.scalar_type());
    if (dropout_ > 0.0) in = torch::nn::functional::dropout(in, torch::nn::functional::DropoutFuncOptions().p(dropout_).training(is_training()));
    auto update = lora_B(lora_A(in)) * scaling_;
    if (!at::autocast::is_autocast_enabled(x.device().type())) update = update.to(result.scalar_type());
    return result + update;
  }
  if (fan_in_fan_out_) {  // HF's Conv1D: bias + x @ weight
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(1);
    result = torch::addmm(bias, x.view({-1, x.size(-1)}), weight).view(sizes);
  } else {
    result = torch::nn::functional::linear(x, weight, bias);
  }
  if (lora_A.is_empty() || detail::adapters_disabled()) return result;
  // PEFT's lora.Linear.forward: the input in the adapter's dtype, then result + B(A(drop(x))) * s.
  const auto dtype = result.scalar_type();
  auto in = x.to(lora_A->weight.scalar_type());
  if (dropout_ > 0.0) in = torch::nn::functional::dropout(in, torch::nn::functional::DropoutFuncOptions().p(dropout_).training(is_training()));
  result = result + lora_B(lora_A(in)) * scaling_;
  return result.to(dtype);
}

LOOM_INLINE void AdaptableLinearImpl::add_adapter(std::shared_ptr<const LoraConfig> config) {
  check(!has_adapter(), "this layer already carries a LoRA adapter");
  // PEFT's autocast_adapter_dtype: an adapter on bf16 or fp16 weights is kept in float32.
  const auto dtype = weight.scalar_type() == torch::kBFloat16 || weight.scalar_type() == torch::kHalf
                         ? torch::kFloat
                         : weight.scalar_type();
  const auto options = torch::TensorOptions().dtype(dtype).device(weight.device());
  const int64_t in = in_features_, out = out_features_;
  lora_A = register_module("lora_A", torch::nn::Linear(torch::nn::LinearOptions(in, config->r).bias(false)));
  lora_B = register_module("lora_B", torch::nn::Linear(torch::nn::LinearOptions(config->r, out).bias(false)));
  lora_A->to(options.device(), options.dtype().toScalarType());
  lora_B->to(options.device(), options.dtype().toScalarType());
  torch::NoGradGuard no_grad;
  lora_B->weight.zero_();
  scaling_ = config->scaling();
  dropout_ = config->lora_dropout;
  config_ = std::move(config);
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::delta_weight() const {
  auto delta = lora_B->weight.matmul(lora_A->weight) * scaling_;  // [out, in]
  return fan_in_fan_out_ ? delta.t() : delta;
}

LOOM_INLINE void AdaptableLinearImpl::merge_adapter() {
  if (!has_adapter()) return;
  {
    torch::NoGradGuard no_grad;
    if (quantized_) {
      const auto& q = *quantized_;
      quantized_ = peft::quantize_4bit(merged_4bit_out_in().to(q.dtype), q.quant_type, q.nested(), q.blocksize);
    } else {
      weight.add_(delta_weight().to(weight.scalar_type()));
    }
  }
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_A = nullptr;
  lora_B = nullptr;
  config_.reset();
}

LOOM_INLINE void AdaptableLinearImpl::quantize_4bit(Bnb4Type type, bool nested, torch::ScalarType compute_dtype) {
  check(!has_adapter(), "quantize_4bit: the layer carries a LoRA adapter; quantize the base before adding it");
  check(!quantized_, "quantize_4bit: the layer is 4-bit already");
  check(compute_dtype == torch::kFloat || compute_dtype == torch::kBFloat16 || compute_dtype == torch::kHalf,
        "quantize_4bit: the compute dtype must be float32, bfloat16 or float16, got {}", c10::toString(compute_dtype));
  torch::NoGradGuard no_grad;
  if (holds_no_storage(weight)) {
    // Built under loom::DeferredInit: the 4-bit tensors' shapes now, their values when the
    // weight's are materialized (materialize_state), whole or a FullShard unit's slice.
    check(torch::isFloatingType(weight.scalar_type()), "quantize_4bit: bitsandbytes quantizes floats, the weight is {}",
          c10::toString(weight.scalar_type()));
    quantized_ = storage_less_4bit({out_features_, in_features_}, weight.scalar_type(), type, nested, weight.device());
  } else {
    const auto w = fan_in_fan_out_ ? weight.detach().t() : weight.detach();  // [out, in], as bitsandbytes holds it
    quantized_ = peft::quantize_4bit(w, type, nested);
  }
  compute_dtype_ = compute_dtype;
  // The parameter stays (a module cannot drop one) with no values: nothing counts, shards,
  // saves or trains a float copy of the base.
  weight.requires_grad_(false);
  weight.set_data(torch::empty({0}, weight.options()));
}

LOOM_INLINE std::vector<torch::Tensor> AdaptableLinearImpl::state_tensors() const {
  if (!quantized_) return {};
  std::vector<torch::Tensor> out{quantized_->packed, quantized_->absmax};
  if (quantized_->nested()) out.insert(out.end(), {quantized_->nested_absmax, quantized_->offset});
  return out;
}

LOOM_INLINE void AdaptableLinearImpl::set_state_tensors(const std::vector<torch::Tensor>& tensors) {
  const auto now = state_tensors();
  check(tensors.size() == now.size(), "set_state_tensors: the layer holds {} 4-bit tensors, not {}", now.size(),
        tensors.size());
  for (std::size_t i = 0; i < now.size(); ++i)
    check(tensors[i].sizes() == now[i].sizes() && tensors[i].scalar_type() == now[i].scalar_type(),
          "set_state_tensors: tensor {} has shape {} and dtype {}, the layer's {} and {}", i, c10::str(tensors[i].sizes()),
          c10::toString(tensors[i].scalar_type()), c10::str(now[i].sizes()), c10::toString(now[i].scalar_type()));
  auto& q = *quantized_;
  q.packed = tensors[0];
  q.absmax = tensors[1];
  if (q.nested()) {
    q.nested_absmax = tensors[2];
    q.offset = tensors[3];
  }
}

LOOM_INLINE void AdaptableLinearImpl::materialize_state(const DeferredValues& values, const std::string& prefix) {
  if (!quantized_ || !holds_no_storage(*this)) return;
  torch::NoGradGuard no_grad;
  // The whole weight (one layer at a time), quantized as quantize_4bit quantizes an eager one:
  // bitsandbytes' blocks run along the flattened [out, in] weight and double quantization
  // subtracts the mean of every block's absmax, so no slice of the codes can be computed from a
  // slice of the weight alone.
  const auto& q = *quantized_;
  const auto device = q.packed.device();
  const auto shape = weight_shape();
  auto w = torch::empty(shape, torch::TensorOptions().dtype(q.dtype).device(device));
  auto flat = w.view({-1});
  values.initial_values(prefix.empty() ? std::string("weight") : prefix + ".weight", w, 0, w.numel(), flat);
  quantized_ = peft::quantize_4bit(fan_in_fan_out_ ? w.t() : w, q.quant_type, q.nested(), q.blocksize).to(device);
}

LOOM_INLINE double AdaptableLinearImpl::materialize_bytes() const {
  if (!quantized_ || !holds_no_storage(*this)) return 0;
  return static_cast<double>(quantized_->numel()) * static_cast<double>(c10::elementSize(quantized_->dtype) + 8);
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::merged_4bit_out_in() const {
  torch::NoGradGuard no_grad;
  auto merged = base_weight(torch::kFloat);  // [out, in]
  if (has_adapter()) merged += (lora_B->weight.matmul(lora_A->weight) * scaling_).to(torch::kFloat);
  return merged;
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::merged_weight() const {
  torch::NoGradGuard no_grad;
  if (quantized_) return fan_in_fan_out_ ? merged_4bit_out_in().t().contiguous() : merged_4bit_out_in();
  if (!has_adapter()) return weight.detach();
  return weight.detach() + delta_weight().to(weight.scalar_type());
}

LOOM_INLINE const Bnb4Weight& AdaptableLinearImpl::quantized_weight() const {
  check(quantized_.has_value(), "quantized_weight: the layer is not 4-bit");
  return *quantized_;
}

LOOM_INLINE torch::Tensor AdaptableLinearImpl::base_weight(torch::ScalarType dtype) const {
  if (quantized_) return dequantize_4bit(*quantized_, dtype);
  return (fan_in_fan_out_ ? weight.detach().t() : weight.detach()).to(dtype);
}

LOOM_INLINE void AdaptableLinearImpl::to(torch::Device device, torch::Dtype dtype, bool non_blocking) {
  torch::nn::Module::to(device, dtype, non_blocking);
  to(device, non_blocking);
}

LOOM_INLINE void AdaptableLinearImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  if (!quantized_) return;
  if (holds_no_storage(*this)) {  // not computed yet: storage-less on the device, nothing to copy
    auto tensors = state_tensors();
    for (auto& t : tensors) t = storage_less(t.sizes(), t.options().device(device));
    set_state_tensors(tensors);
    return;
  }
  quantized_ = quantized_->to(device);
}

LOOM_INLINE int quantize_base_4bit(torch::nn::Module& model, const Bnb4Config& config,
                                   const std::vector<std::string>& skip) {
  const auto layers = detail::adaptable_layers(model);
  for (const auto& [name, layer] : layers)
    check(!layer->has_adapter(), "--load_in_4bit: the model already carries a LoRA adapter ({}); the base is made "
          "4-bit before the adapter goes on", name);
  // transformers' get_keys_to_not_convert: the module of the last parameter stays in full
  // precision (the output layer: lm_head, a classifier's score).
  std::string last;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) last = p.key();
  const auto owner = last.substr(0, last.rfind('.') == std::string::npos ? 0 : last.rfind('.'));
  int count = 0;
  for (const auto& [name, layer] : layers) {
    if (layer->quantized() || name == owner) continue;
    if (std::any_of(skip.begin(), skip.end(), [&n = name](const std::string& m) { return detail::inside_module(n, m); }))
      continue;
    layer->quantize_4bit(config.quant_type, config.use_double_quant, config.compute_dtype);
    ++count;
  }
  return count;
}

LOOM_INLINE QuantizedBase quantized_base(const torch::nn::Module& model) {
  QuantizedBase out;
  for (const auto& [name, layer] : detail::adaptable_layers(model)) {
    if (!layer->quantized()) continue;
    ++out.layers;
    out.values += layer->quantized_weight().numel();
    out.bytes += layer->quantized_weight().bytes();
  }
  return out;
}

LOOM_INLINE int apply_lora(torch::nn::Module& model, const LoraConfig& config) {
  validate(config, "LoraConfig");
  const auto layers = detail::adaptable_layers(model);
  for (const auto& [name, layer] : layers)
    check(!layer->has_adapter(), "the model already carries a LoRA adapter ({}); loom trains one adapter at a time",
          name);
  // The config the adapted layers carry: modules_to_save as PEFT completes it for SEQ_CLS.
  auto recorded = std::make_shared<LoraConfig>(config);
  recorded->modules_to_save = detail::modules_to_save(model, config);
  const auto to_save = detail::saved_module_parameters(model, recorded->modules_to_save);
  for (const auto& m : recorded->modules_to_save) {
    const bool found = std::any_of(to_save.begin(), to_save.end(), [&](const auto& p) {
      return detail::name_matches(p.first.substr(0, p.first.rfind('.')), m);
    });
    check(found, "LoRA modules_to_save names {}, which matches no module of the model that holds parameters", m);
  }
  // PEFT puts no adapter inside a module it saves whole: all-linear and a SEQ_CLS head pass
  // over it; a target named outright is an error.
  const bool all_linear = std::find(config.target_modules.begin(), config.target_modules.end(),
                                    detail::all_linear) != config.target_modules.end();
  std::vector<std::pair<std::string, AdaptableLinearImpl*>> chosen;
  std::vector<std::string> passed_over;
  std::optional<detail::TargetPattern> compiled;
  if (config.target_regex) compiled.emplace(*config.target_regex, "LoraConfig");
  const detail::TargetPattern* pattern = compiled ? &*compiled : nullptr;
  for (const auto& [name, layer] : layers) {
    if (!detail::targeted(config, pattern, name)) continue;
    // An init-capture: clang 14 (the fuzz build's) cannot capture a structured binding directly.
    const auto saved = std::find_if(recorded->modules_to_save.begin(), recorded->modules_to_save.end(),
                                    [&layer_name = name](const std::string& m) { return detail::inside_module(layer_name, m); });
    if (saved == recorded->modules_to_save.end()) {
      chosen.emplace_back(name, layer);
      continue;
    }
    check(all_linear || detail::is_classification_head(config, *saved),
          "LoRA module {} is both a target and in modules_to_save", name);
    passed_over.push_back(name);
  }
  if (chosen.empty()) {
    if (!passed_over.empty())
      fail("LoRA target_modules match only {}, which modules_to_save trains whole{}", passed_over.front(),
           config.task_type == detail::sequence_classification
               ? " (task_type SEQ_CLS saves the classification head)"
               : "");
    // A target naming a module that exists but cannot carry an adapter says so.
    std::string other;
    for (const auto& item : model.named_modules("", false))
      if (item.value()->as<AdaptableLinear>() == nullptr && detail::targeted(config, pattern, item.key())) {
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
    fail("LoRA target_modules ({}) match no module of the model; {}", targets,
         known.empty() ? "it has no layer that can carry an adapter (peft::AdaptableLinear)"
                       : "its linear projections are named " + known);
  }
  if (all_linear) {
    recorded->target_modules.clear();  // as PEFT writes "all-linear": the layers it chose
    for (const auto& [name, layer] : chosen) recorded->target_modules.push_back(name);
  }
  detail::check_adapter_memory(chosen, config.r);
  try {
    for (const auto& [name, layer] : chosen) layer->add_adapter(recorded);
  } catch (const c10::Error& e) {
    fail("LoRA rank r {}: allocating the adapter's {} layers failed ({}); lower r", config.r, chosen.size(),
         e.what_without_backtrace());
  }
  std::set<const c10::TensorImpl*> trainable;
  for (const auto& [name, t] : to_save) trainable.insert(t.unsafeGetTensorImpl());
  for (auto& p : model.named_parameters())
    if (!detail::is_lora_parameter(p.key()) && !trainable.contains(p.value().unsafeGetTensorImpl()))
      p.value().requires_grad_(false);
  return static_cast<int>(chosen.size());
}

LOOM_INLINE std::optional<LoraConfig> adapter_config(const torch::nn::Module& model) {
  for (const auto& [name, layer] : detail::adaptable_layers(model))
    if (layer->has_adapter() && layer->lora_config()) return *layer->lora_config();
  return std::nullopt;
}

LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> adapter_tensors(const torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  const auto config = adapter_config(model);
  if (!config) return out;
  for (const auto& p : model.named_parameters())
    if (detail::is_lora_parameter(p.key())) out.emplace_back(std::string(detail::peft_prefix) + p.key(), p.value());
  for (auto& [name, t] : detail::saved_module_parameters(model, config->modules_to_save))
    out.emplace_back(std::string(detail::peft_prefix) + name, t);
  return out;
}

LOOM_INLINE nlohmann::ordered_json lora_config_to_json(const LoraConfig& config, bool fan_in_fan_out) {
  const auto or_null = [](const auto& v) { return v.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v); };
  nlohmann::ordered_json j = {{"peft_type", "LORA"},
                              {"task_type", config.task_type},
                              {"r", config.r},
                              {"lora_alpha", config.lora_alpha},
                              {"lora_dropout", config.lora_dropout},
                              {"bias", config.bias},
                              {"use_rslora", config.use_rslora},
                              {"fan_in_fan_out", fan_in_fan_out},
                              {"init_lora_weights", true},
                              {"inference_mode", true},
                              {"modules_to_save", or_null(config.modules_to_save)},
                              {"use_dora", false},
                              {"base_model_name_or_path", config.base_model_name_or_path
                                                              ? nlohmann::ordered_json(*config.base_model_name_or_path)
                                                              : nlohmann::ordered_json(nullptr)}};
  if (config.target_regex) j["target_modules"] = *config.target_regex;
  else j["target_modules"] = config.target_modules;
  return j;
}

LOOM_INLINE void save_adapter(const torch::nn::Module& model, const std::filesystem::path& dir) {
  const auto config = adapter_config(model);
  check(config.has_value(), "save_adapter: the model carries no LoRA adapter (apply_lora or load_adapter first)");
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, t] : adapter_tensors(model)) tensors.emplace_back(name, t.detach().cpu().contiguous());
  std::filesystem::create_directories(dir);
  checkpoint::save_safetensors(tensors, dir / adapter_weights_file, {{"format", "pt"}});
  json::write_file(lora_config_to_json(*config, detail::any_fan_in_fan_out(model)), dir / adapter_config_file);
}

LOOM_INLINE LoraConfig lora_config_from_json(const nlohmann::json& j, std::string_view where) {
  check(j.is_object(), "{}: an adapter config must be a JSON object", where);
  // A string field: absent or null keeps the default; another type is an error naming it.
  const auto text = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    check(j[key].is_string(), "{}: field '{}' must be a string, got {}", where, key, j[key].dump());
    field = j[key].get<std::string>();
  };
  std::string peft_type = "LORA";
  text("peft_type", peft_type);
  check(peft_type == "LORA", "{}: peft_type is \"{}\"; loom reads LoRA adapters", where, peft_type);
  LoraConfig c;
  const auto number = [&](const char* key, auto& field) {
    if (!j.contains(key) || j[key].is_null()) return;
    const auto& v = j[key];
    if constexpr (std::is_integral_v<std::decay_t<decltype(field)>>) {
      // A float (4.5, 3e94) or an integer beyond int64 is no count: converting it is undefined.
      check(v.is_number_integer() && (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{1} << 62),
            "{}: field '{}' must be an integer, got {}", where, key, v.dump());
    } else {
      check(v.is_number(), "{}: field '{}' must be a number, got {}", where, key, v.dump());
    }
    field = v.get<std::decay_t<decltype(field)>>();
  };
  number("r", c.r);
  number("lora_alpha", c.lora_alpha);
  number("lora_dropout", c.lora_dropout);
  text("bias", c.bias);
  if (j.contains("use_rslora") && !j["use_rslora"].is_null()) {
    check(j["use_rslora"].is_boolean(), "{}: field 'use_rslora' must be true or false, got {}", where,
          j["use_rslora"].dump());
    c.use_rslora = j["use_rslora"].get<bool>();
  }
  // fan_in_fan_out follows the layer here (HF's Conv1D stores [in, out]), as PEFT sets it.
  text("task_type", c.task_type);
  std::string base;
  text("base_model_name_or_path", base);
  if (!base.empty()) c.base_model_name_or_path = base;
  const auto& save = j.contains("modules_to_save") ? j["modules_to_save"] : nlohmann::json();
  check(save.is_null() || save.is_array(), "{}: field 'modules_to_save' must be a list of module names or null", where);
  if (save.is_array())
    for (const auto& e : save) {
      check(e.is_string(), "{}: field 'modules_to_save' must hold strings", where);
      c.modules_to_save.push_back(e.get<std::string>());
    }
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
  for (const char* key : {"use_dora", "layers_to_transform", "rank_pattern", "alpha_pattern",
                          "exclude_modules", "target_parameters", "trainable_token_indices",
                          "layer_replication", "lora_bias"})
    off(key);
  // And PEFT's other variants: every use_* switch but use_rslora, every *_config block.
  for (const auto& [key, value] : j.items())
    if ((key.starts_with("use_") && key != "use_rslora") ||
        (key.ends_with("_config") && key != "megatron_config" && key != "loftq_config"))
      off(key.c_str());
  if (j.contains("loftq_config")) off("loftq_config");
  // Initialisations that rewrite the base weights (PiSSA, OLoRA, CorDA, LoftQ): the adapter's
  // weights belong to that rewritten base, not to the base loom loads.
  if (j.contains("init_lora_weights") && j["init_lora_weights"].is_string()) {
    const auto init = j["init_lora_weights"].get<std::string>();
    check(!(init.starts_with("pissa") || init == "olora" || init == "corda" || init == "loftq"),
          "{}: init_lora_weights \"{}\" rewrites the base weights when the adapter is made, and loom loads the base "
          "as it is; convert the adapter with PEFT first (path_initial_model_for_weight_conversion) or train it anew",
          where, init);
  }
  validate(c, where);
  return c;
}

LOOM_INLINE void load_adapter_weights(torch::nn::Module& model, const std::filesystem::path& dir) {
  const auto weights_path = dir / adapter_weights_file;
  check(path_exists(dir, PathKind::folder, "a PEFT adapter folder") && path_exists(weights_path, PathKind::file),
        "{} does not exist (a PEFT adapter folder holds {} and {})", weights_path.string(), adapter_config_file,
        adapter_weights_file);
  check(adapter_config(model).has_value(), "{}: the model carries no LoRA adapter to read it into", weights_path.string());
  const auto stored = checkpoint::load_safetensors(weights_path);
  std::map<std::string, torch::Tensor> params;
  for (auto& [name, t] : adapter_tensors(model)) params[name] = t;
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
    else if (it->second.is_floating_point() != t.is_floating_point())
      problems.push_back(name + " is " + std::string(c10::toString(t.scalar_type())) + " in the file but " +
                         std::string(c10::toString(it->second.scalar_type())) +
                         " here (adapter weights are floating-point; integers would be read as whole numbers)");
  }
  for (const auto& [name, p] : params)
    if (!found.contains(name)) problems.push_back("missing " + name);
  if (!problems.empty()) fail("{} does not fit this model: {}", weights_path.string(), detail::problems_text(problems));
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : stored) params.at(name).copy_(t);
}

LOOM_INLINE LoraConfig load_adapter(torch::nn::Module& model, const std::filesystem::path& dir) {
  const auto config_path = dir / adapter_config_file;
  check(path_exists(dir, PathKind::folder, "a PEFT adapter folder") && path_exists(config_path, PathKind::file),
        "{} does not exist (a PEFT adapter folder holds {} and {})", config_path.string(), adapter_config_file,
        adapter_weights_file);
  const auto config = lora_config_from_json(json::read_file(config_path), config_path.string());
  check(path_exists(dir / adapter_weights_file, PathKind::file), "{} does not exist",
        (dir / adapter_weights_file).string());  // before the model is changed
  apply_lora(model, config);
  load_adapter_weights(model, dir);
  return config;
}

LOOM_INLINE void merge_and_unload(torch::nn::Module& model) {
  for (auto& [name, layer] : detail::adaptable_layers(model)) layer->merge_adapter();
  for (auto& p : model.parameters()) p.requires_grad_(true);
}

LOOM_INLINE HiddenAdapters::HiddenAdapters(torch::nn::Module& model) {
  for (auto& [name, layer] : detail::adaptable_layers(model)) {
    if (!layer->has_adapter()) continue;
    held_.push_back({layer, layer->lora_A, layer->lora_B, layer->lora_config()});
    layer->unregister_module("lora_A");
    layer->unregister_module("lora_B");
    layer->lora_A = nullptr;
    layer->lora_B = nullptr;
  }
}

LOOM_INLINE HiddenAdapters::~HiddenAdapters() {
  for (auto& h : held_) {
    // The same modules again: their tensors are the ones the optimizer steps.
    h.layer->lora_A = h.layer->register_module("lora_A", h.a);
    h.layer->lora_B = h.layer->register_module("lora_B", h.b);
    h.layer->config_ = std::move(h.config);
  }
}

}  // namespace loom::peft
