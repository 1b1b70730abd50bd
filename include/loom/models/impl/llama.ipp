#pragma once
// Definitions of models/llama.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/models/activations.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/hf_folder.hpp>
#include <loom/models/llama.hpp>
#include <loom/models/pretrained.hpp>

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>
#include <string>
#include <tuple>
#include <utility>

namespace loom::models {

namespace detail {

// The keys of rope_parameters loom computes; any other changes the rope and is refused.
inline const std::set<std::string, std::less<>> rope_keys = {
    "rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
    "truncate", "short_factor", "long_factor", "partial_rotary_factor"};
// The rope types loom computes (transformers' ROPE_INIT_FUNCTIONS of the same names).
inline constexpr std::array<std::string_view, 6> rope_types = {"default", "linear", "dynamic",
                                                               "yarn",    "longrope", "llama3"};

// A number of the rope object `name` (rope_parameters, or Gemma 3's rope_parameters.<layer type>).
inline double rope_number(const nlohmann::json& rope, const char* key, std::string_view where,
                          std::string_view name = "rope_parameters") {
  const auto it = rope.find(key);
  check(it != rope.end() && it->is_number(), "{}: field '{}.{}' must be a number for rope_type {}", where, name, key,
        rope.value("rope_type", std::string("default")));
  return it->get<double>();
}
// An optional number of a rope object (absent or null: none).
inline std::optional<double> rope_optional(const nlohmann::json& rope, const char* key, std::string_view where,
                                           std::string_view name = "rope_parameters") {
  const auto it = rope.find(key);
  if (it == rope.end() || it->is_null()) return std::nullopt;
  check(it->is_number(), "{}: field '{}.{}' must be a number or null", where, name, key);
  return it->get<double>();
}

inline std::string rope_type(const nlohmann::json& rope) {
  if (rope.contains("rope_type") && rope["rope_type"].is_string()) return rope["rope_type"].get<std::string>();
  if (rope.contains("type") && rope["type"].is_string()) return rope["type"].get<std::string>();
  return "default";
}

// "llama, qwen2, qwen3, mistral, phi3": the families' model types, for messages.
inline std::string model_types_text() {
  std::string out;
  for (const auto& f : kLlamaFamilies) out += (out.empty() ? "" : ", ") + std::string(f.model_type);
  return out;
}

}  // namespace detail

LOOM_INLINE const LlamaFamily& llama_family(const LlamaConfig& c) {
  const LlamaFamily* family = find_llama_family(c.model_type);
  check(family != nullptr, "field 'model_type' is \"{}\"; loom's Llama architecture reads {}", c.model_type,
        detail::model_types_text());
  return *family;
}

LOOM_INLINE bool LlamaConfig::written(std::string_view key) const {
  if (key == "rope_theta" || key == "rope_scaling") return false;  // folded into rope_parameters
  const unsigned keys = llama_family(*this).keys;
  const auto has = [&](LlamaFamily::Keys k) { return (keys & k) != 0; };
  if (key == "use_sliding_window") return has(LlamaFamily::window_keys) || has(LlamaFamily::window_switch_key);
  if (key == "max_window_layers") return has(LlamaFamily::window_keys);
  if (key == "num_experts") return false;  // read into num_local_experts, as transformers' attribute_map
  if (key == "num_local_experts" || key == "num_experts_per_tok" || key == "output_router_logits" ||
      key == "router_aux_loss_coef")
    return has(LlamaFamily::moe_keys);
  if (key == "router_jitter_noise") return has(LlamaFamily::router_jitter_key);
  if (key == "moe_intermediate_size" || key == "decoder_sparse_step" || key == "mlp_only_layers" ||
      key == "norm_topk_prob")
    return has(LlamaFamily::sparse_step_keys);
  if (key == "layer_types") return has(LlamaFamily::layer_types_key);
  if (key == "query_pre_attn_scalar" || key == "attn_logit_softcapping" || key == "final_logit_softcapping" ||
      key == "hidden_activation")
    return has(LlamaFamily::softcap_keys);
  if (key == "hidden_act") return !has(LlamaFamily::softcap_keys);  // Gemma 2's and 3's name it hidden_activation
  // Gemma 3's older keys, folded into layer_types and rope_parameters.
  if (key == "sliding_window_pattern" || key == "rope_local_base_freq") return false;
  if (key == "sliding_window") return has(LlamaFamily::sliding_window_key);
  if (key == "attention_bias") return has(LlamaFamily::attention_bias_key);
  if (key == "mlp_bias" || key == "pretraining_tp") return has(LlamaFamily::mlp_bias_key);
  if (key == "head_dim") return has(LlamaFamily::head_dim_key);
  if (key == "resid_pdrop" || key == "embd_pdrop" || key == "original_max_position_embeddings")
    return has(LlamaFamily::phi3_keys);
  if (key == "use_bidirectional_attention") return has(LlamaFamily::bidirectional_key);
  // A classifier's labels (complete_labels filled them), as transformers writes them: not a
  // causal LM's, and num_labels never (id2label says it).
  if (key == "num_labels") return false;
  if (key == "id2label" || key == "label2id") return !id2label.empty();
  if (key == "problem_type") return problem_type.has_value();
  return true;
}

namespace detail {
// One rope object as transformers standardizes it: "type" renamed rope_type, rope_type
// "default" when absent.
inline void standard_rope(nlohmann::json& rope) {
  if (rope.contains("type") && !rope.contains("rope_type")) rope["rope_type"] = rope["type"];
  rope.erase("type");
  if (!rope.contains("rope_type")) rope["rope_type"] = "default";
}
}  // namespace detail

LOOM_INLINE void complete_config(LlamaConfig& c) {
  const LlamaFamily* const family = find_llama_family(c.model_type);
  const double default_theta = family != nullptr ? family->default_rope_theta : 10000.0;
  if (family != nullptr && family->local_rope_theta > 0) {
    // Gemma3TextConfig: a rope per layer type; the older rope_theta (and rope_scaling) are the
    // full-attention layers', rope_local_base_freq the sliding layers'.
    if (c.rope_parameters.is_null()) c.rope_parameters = nlohmann::json::object();
    auto& ropes = c.rope_parameters;
    if (ropes.is_object()) {
      for (const char* type : {"full_attention", "sliding_attention"})
        if (!ropes.contains(type) || ropes[type].is_null()) ropes[type] = nlohmann::json::object();
      if (c.rope_scaling.is_object() && ropes["full_attention"].is_object()) ropes["full_attention"].update(c.rope_scaling);
      const std::pair<const char*, double> thetas[] = {
          {"full_attention", c.rope_theta.value_or(default_theta)},
          {"sliding_attention", c.rope_local_base_freq.value_or(family->local_rope_theta)}};
      for (const auto& [type, theta] : thetas)
        if (auto& rope = ropes[type]; rope.is_object()) {
          detail::standard_rope(rope);
          if (!rope.contains("rope_theta")) rope["rope_theta"] = theta;
        }
    }
  } else if (c.rope_parameters.is_null()) {
    nlohmann::json rope = c.rope_scaling.is_object() ? c.rope_scaling : nlohmann::json::object();
    detail::standard_rope(rope);
    rope["rope_theta"] = c.rope_theta.value_or(default_theta);
    c.rope_parameters = rope;
  }
  if (family != nullptr && (family->keys & LlamaFamily::softcap_keys) != 0) {
    // Gemma2Config / Gemma3TextConfig: hidden_activation is the activation's key;
    // query_pre_attn_scalar 256 by default.
    if (c.hidden_activation) c.hidden_act = *c.hidden_activation;
    c.hidden_activation = c.hidden_act;
    if (!c.query_pre_attn_scalar) c.query_pre_attn_scalar = 256;
  }
  if (family != nullptr && family->sliding_pattern > 0 && c.layer_types.is_null()) {
    // Their __post_init__: every pattern-th layer full attention, the others sliding.
    const int64_t pattern = c.sliding_window_pattern.value_or(family->sliding_pattern);
    if (pattern > 0 && c.num_hidden_layers > 0 && c.num_hidden_layers <= ConfigLimits::layers) {
      c.layer_types = nlohmann::json::array();
      for (int64_t i = 0; i < c.num_hidden_layers; ++i)
        c.layer_types.push_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
    }
  }
  if (const auto* family = find_llama_family(c.model_type); family && family->fused_projections) {
    // Phi3Config: the older "su" and "yarn" are its longrope, whose original length may sit at
    // the config's top level.
    auto& rope = c.rope_parameters;
    if (rope.is_object()) {
      const std::string type = detail::rope_type(rope);
      if (type == "su" || type == "yarn") {
        rope["rope_type"] = "longrope";
        rope.erase("type");
      }
      if (detail::rope_type(rope) == "longrope" && !rope.contains("original_max_position_embeddings") &&
          c.original_max_position_embeddings)
        rope["original_max_position_embeddings"] = *c.original_max_position_embeddings;
    }
    if (!c.original_max_position_embeddings) c.original_max_position_embeddings = 4096;  // Phi3Config's default
  }
  if (const auto* family = find_llama_family(c.model_type); family && family->gelu_means_tanh && c.hidden_act == "gelu")
    c.hidden_act = "gelu_pytorch_tanh";  // GemmaConfig: the official releases' "gelu" meant the tanh approximation
  if (family != nullptr && family->default_experts > 0) {
    // MixtralConfig / Qwen3MoeConfig: num_experts is num_local_experts (attribute_map), and
    // their defaults; Qwen3-MoE's mlp_only_layers [] when null.
    if (!c.num_local_experts) c.num_local_experts = c.num_experts.value_or(family->default_experts);
    c.num_experts.reset();
    if (!c.num_experts_per_tok) c.num_experts_per_tok = family->default_experts_per_tok;
    if (family->default_moe_intermediate > 0 && !c.moe_intermediate_size)
      c.moe_intermediate_size = family->default_moe_intermediate;
    if ((family->keys & LlamaFamily::sparse_step_keys) != 0 && c.mlp_only_layers.is_null())
      c.mlp_only_layers = nlohmann::json::array();
  }
  if (!c.num_key_value_heads) c.num_key_value_heads = c.num_attention_heads;
  // A family whose HF config defaults head_dim (Qwen3's 128) takes that default; the others
  // hidden_size / num_attention_heads.
  if (const auto* family = find_llama_family(c.model_type); !c.head_dim && family && family->default_head_dim > 0)
    c.head_dim = family->default_head_dim;
  if (!c.head_dim && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
}

namespace detail {
// One rope object (rope_parameters, or Gemma 3's entry of a layer type, `name`): its keys, its
// rope_type and the numbers that type reads.
inline void validate_rope(const LlamaConfig& c, const nlohmann::json& rope, const std::string& name,
                          std::string_view where) {
  if (rope.is_object() && rope.contains("partial_rotary_factor")) {
    const auto& factor = rope["partial_rotary_factor"];
    // Only Phi-3's attention turns part of each head (transformers' other families' would not).
    check(factor == 1.0 || llama_family(c).partial_rotary,
          "{}: field '{}.partial_rotary_factor' is {}; loom's {} rotary embedding turns the whole head "
          "(1.0)", where, name, factor.dump(), c.model_type);
    check(factor.is_number() && factor.get<double>() > 0 && factor.get<double>() <= 1,
          "{}: field '{}.partial_rotary_factor' must be in (0, 1], got {}", where, name, factor.dump());
    const auto rotary = static_cast<int64_t>(static_cast<double>(llama_head_dim(c)) * factor.get<double>());
    check(rotary >= 2 && rotary % 2 == 0,
          "{}: field '{}.partial_rotary_factor' {} turns {} channels of each head; the rotary embedding "
          "needs an even number, at least 2", where, name, factor.dump(), rotary);
  }
  check(rope.is_object(), "{}: field '{}' must be an object", where, name);
  for (const auto& [key, value] : rope.items())
    check(detail::rope_keys.contains(key),
          "{}: field '{}.{}' is not supported (loom computes rope_type default, linear, dynamic, yarn, "
          "longrope and llama3)", where, name, key);
  const std::string type = detail::rope_type(rope);
  check(std::ranges::find(detail::rope_types, type) != detail::rope_types.end(),
        "{}: field '{}.rope_type' is \"{}\"; loom computes \"default\", \"linear\", \"dynamic\", "
        "\"yarn\", \"longrope\" and \"llama3\"", where, name, type);
  check(rope.contains("rope_theta") && rope["rope_theta"].is_number() && rope["rope_theta"].get<double>() > 0,
        "{}: field '{}.rope_theta' must be a positive number", where, name);
  if (type == "llama3") {
    const double factor = detail::rope_number(rope, "factor", where, name);
    const double low = detail::rope_number(rope, "low_freq_factor", where, name);
    const double high = detail::rope_number(rope, "high_freq_factor", where, name);
    const double original = detail::rope_number(rope, "original_max_position_embeddings", where, name);
    check(factor >= 1.0, "{}: field '{}.factor' must be at least 1, got {}", where, name, factor);
    check(high > low && low > 0, "{}: {} needs high_freq_factor > low_freq_factor > 0, got {} and {}",
          where, name, high, low);
    check(original > 0, "{}: field '{}.original_max_position_embeddings' must be positive", where, name);
  }
  if (type == "linear" || type == "dynamic")
    check(detail::rope_number(rope, "factor", where, name) >= 1.0, "{}: field '{}.factor' must be at least 1",
          where, name);
  if (type == "longrope") {
    const double original = detail::rope_number(rope, "original_max_position_embeddings", where, name);
    check(original > 1, "{}: field '{}.original_max_position_embeddings' must be above 1", where, name);
    const double partial = rope.contains("partial_rotary_factor") && rope["partial_rotary_factor"].is_number()
                               ? rope["partial_rotary_factor"].get<double>()
                               : 1.0;
    const int64_t half = static_cast<int64_t>(static_cast<double>(llama_head_dim(c)) * partial) / 2;
    for (const char* key : {"short_factor", "long_factor"}) {
      const auto it = rope.find(key);
      check(it != rope.end() && it->is_array() && std::cmp_equal(it->size(), half) &&
                std::all_of(it->begin(), it->end(), [](const auto& v) { return v.is_number() && v.template get<double>() > 0; }),
            "{}: field '{}.{}' must be a list of {} positive numbers (the rotary width / 2) for rope_type "
            "longrope",
            where, name, key, half);
    }
    if (const auto factor = detail::rope_optional(rope, "factor", where, name))
      check(*factor >= 1.0, "{}: field '{}.factor' must be at least 1, got {}", where, name, *factor);
  }
  if (type == "yarn") {
    const double original = detail::rope_number(rope, "original_max_position_embeddings", where, name);
    check(original > 0, "{}: field '{}.original_max_position_embeddings' must be positive", where, name);
    // factor null: max_position_embeddings / original_max_position_embeddings (transformers' rule).
    const double factor = detail::rope_optional(rope, "factor", where, name)
                              .value_or(static_cast<double>(c.max_position_embeddings) / original);
    check(factor >= 1.0, "{}: {}'s yarn factor must be at least 1, got {}", where, name, factor);
    for (const char* key : {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"})
      if (const auto v = detail::rope_optional(rope, key, where, name))
        check(*v >= 0, "{}: field '{}.{}' must not be negative, got {}", where, name, key, *v);
    if (rope.contains("truncate"))
      check(rope["truncate"].is_boolean(), "{}: field '{}.truncate' must be true or false", where, name);
  }
}
}  // namespace detail

LOOM_INLINE void validate(const LlamaConfig& c, std::string_view where) {
  check(find_llama_family(c.model_type) != nullptr,
        "{}: field 'model_type' is \"{}\"; loom's Llama architecture reads {}", where, c.model_type,
        detail::model_types_text());
  validate_labels(c.num_labels, c.problem_type, where);
  const auto positive = [&](int64_t v, const char* field) {
    check(v > 0, "{}: field '{}' must be a positive integer, got {}", where, field, v);
  };
  check_config_size(where, "vocab_size", c.vocab_size, ConfigLimits::vocab_size);
  check_config_size(where, "hidden_size", c.hidden_size, ConfigLimits::width);
  check_config_size(where, "intermediate_size", c.intermediate_size, ConfigLimits::feed_forward);
  check_config_size(where, "num_hidden_layers", c.num_hidden_layers, ConfigLimits::layers);
  check_config_size(where, "num_attention_heads", c.num_attention_heads, ConfigLimits::width);
  check_config_size(where, "max_position_embeddings", c.max_position_embeddings, ConfigLimits::positions);
  const int64_t kv = llama_kv_heads(c);
  check_config_size(where, "num_key_value_heads", kv, ConfigLimits::width);
  check(c.num_attention_heads % kv == 0, "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
        where, c.num_attention_heads, kv);
  if (c.head_dim) {
    check_config_size(where, "head_dim", *c.head_dim, ConfigLimits::width);
    check(*c.head_dim % 2 == 0, "{}: field 'head_dim' must be even (the rotary embedding pairs its halves), got {}",
          where, *c.head_dim);
  } else {
    check(c.hidden_size % c.num_attention_heads == 0,
          "{}: hidden_size ({}) must be a multiple of num_attention_heads ({}) when head_dim is not given", where,
          c.hidden_size, c.num_attention_heads);
  }
  check(is_known_activation(c.hidden_act), "{}: field 'hidden_act' is \"{}\"; loom knows {}", where, c.hidden_act,
        known_activations);
  check(c.rms_norm_eps > 0.0, "{}: field 'rms_norm_eps' must be positive, got {}", where, c.rms_norm_eps);
  check(c.attention_dropout >= 0.0 && c.attention_dropout < 1.0,
        "{}: field 'attention_dropout' must be in [0, 1), got {}", where, c.attention_dropout);
  check(c.resid_pdrop >= 0.0 && c.resid_pdrop < 1.0, "{}: field 'resid_pdrop' must be in [0, 1), got {}", where,
        c.resid_pdrop);
  check(c.embd_pdrop >= 0.0 && c.embd_pdrop < 1.0, "{}: field 'embd_pdrop' must be in [0, 1), got {}", where,
        c.embd_pdrop);
  if (c.original_max_position_embeddings) positive(*c.original_max_position_embeddings, "original_max_position_embeddings");
  check(!c.use_bidirectional_attention.value_or(false),
        "{}: field 'use_bidirectional_attention' is true; loom's Llama architecture attends causally (a decoder)", where);
  check(!c.pretraining_tp || *c.pretraining_tp == 1,
        "{}: field 'pretraining_tp' is {}; loom computes the plain product (only 1 is supported)", where,
        c.pretraining_tp.value_or(1));
  if (c.sliding_window) positive(*c.sliding_window, "sliding_window");
  check(!c.use_sliding_window.value_or(false) || c.sliding_window,
        "{}: field 'use_sliding_window' is true but 'sliding_window' is null; give the window's length", where);
  if (c.max_window_layers)
    check(*c.max_window_layers >= 0, "{}: field 'max_window_layers' must be at least 0, got {}", where,
          *c.max_window_layers);
  if (c.sliding_window_pattern) positive(*c.sliding_window_pattern, "sliding_window_pattern");
  if (c.query_pre_attn_scalar) positive(*c.query_pre_attn_scalar, "query_pre_attn_scalar");
  // transformers divides by the caps: a cap of 0 would be NaN, a negative one flips the scores.
  for (const auto& [field, cap] : {std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                                   std::pair{"final_logit_softcapping", c.final_logit_softcapping}})
    check(!cap || *cap > 0, "{}: field '{}' must be a positive number or null, got {}", where, field, cap.value_or(0));
  check(c.eos_token_id.is_null() || c.eos_token_id.is_number_integer() ||
            (c.eos_token_id.is_array() &&
             std::all_of(c.eos_token_id.begin(), c.eos_token_id.end(), [](const auto& e) { return e.is_number_integer(); })),
        "{}: field 'eos_token_id' must be an integer, a list of integers or null", where);
  if (!c.layer_types.is_null()) {
    check(c.layer_types.is_array() && std::cmp_equal(c.layer_types.size(), c.num_hidden_layers),
          "{}: field 'layer_types' must be a list of one entry per layer ({})", where, c.num_hidden_layers);
    for (const auto& t : c.layer_types)
      check(t == "full_attention" || t == "sliding_attention",
            "{}: field 'layer_types' holds {}; loom's Llama architecture has \"full_attention\" and "
            "\"sliding_attention\" layers", where, t.dump());
  }
  if (llama_family(c).default_experts > 0) {
    const int64_t experts = llama_experts(c), top_k = llama_experts_per_tok(c);
    check(experts >= 0 && experts <= ConfigLimits::width, "{}: field 'num_local_experts' must be in [0, {}], got {}",
          where, ConfigLimits::width, experts);
    check((llama_family(c).keys & LlamaFamily::sparse_step_keys) != 0 || experts > 0,
          "{}: field 'num_local_experts' must be a positive integer, got {}", where, experts);
    if (experts > 0)
      check(top_k >= 1 && top_k <= experts, "{}: field 'num_experts_per_tok' must be in [1, num_local_experts ({})], got {}",
            where, experts, top_k);
    check(std::isfinite(c.router_aux_loss_coef), "{}: field 'router_aux_loss_coef' must be a finite number", where);
    check(c.router_jitter_noise >= 0.0 && c.router_jitter_noise < 1.0,
          "{}: field 'router_jitter_noise' must be in [0, 1), got {}", where, c.router_jitter_noise);
    if (c.moe_intermediate_size) check_config_size(where, "moe_intermediate_size", *c.moe_intermediate_size,
                                                   ConfigLimits::feed_forward);
    positive(c.decoder_sparse_step, "decoder_sparse_step");
    check(c.mlp_only_layers.is_null() || c.mlp_only_layers.is_array(),
          "{}: field 'mlp_only_layers' must be a list of layer indices", where);
    if (c.mlp_only_layers.is_array())
      for (const auto& i : c.mlp_only_layers)
        check(i.is_number_integer() && i.get<int64_t>() >= 0 && i.get<int64_t>() < c.num_hidden_layers,
              "{}: field 'mlp_only_layers' holds {}; each entry must be a layer index in [0, {})", where, i.dump(),
              c.num_hidden_layers);
  }
  // The rope (complete_config made rope_parameters from the older keys): one, or (Gemma 3) one
  // per layer type.
  if (llama_family(c).local_rope_theta > 0) {
    check(c.rope_parameters.is_object(), "{}: field 'rope_parameters' must be an object", where);
    for (const auto& [key, value] : c.rope_parameters.items())
      check(key == "full_attention" || key == "sliding_attention",
            "{}: field 'rope_parameters.{}' is not supported; {}'s rope_parameters holds one rope per layer type, "
            "\"full_attention\" and \"sliding_attention\"", where, key, c.model_type);
    for (const char* type : {"full_attention", "sliding_attention"})
      detail::validate_rope(c, c.rope_parameters[type], "rope_parameters." + std::string(type), where);
  } else {
    detail::validate_rope(c, c.rope_parameters, "rope_parameters", where);
  }
}

LOOM_INLINE bool llama_layer_slides(const LlamaConfig& c, int64_t layer) {
  const LlamaFamily& family = llama_family(c);
  if ((family.keys & LlamaFamily::layer_types_key) != 0 && c.layer_types.is_array())
    return c.layer_types.at(static_cast<std::size_t>(layer)) == "sliding_attention";
  // Without layer_types: Gemma's pattern (complete_config writes it out), Qwen's
  // max_window_layers.
  if (family.sliding_pattern > 0) return (layer + 1) % c.sliding_window_pattern.value_or(family.sliding_pattern) != 0;
  if ((family.keys & LlamaFamily::window_switch_key) != 0) return true;  // Qwen3-MoE: every layer
  return (family.keys & LlamaFamily::window_keys) != 0 && layer >= c.max_window_layers.value_or(28);
}

LOOM_INLINE bool llama_layer_sparse(const LlamaConfig& c, int64_t layer) {
  const LlamaFamily& family = llama_family(c);
  if (family.moe_block.empty() || llama_experts(c) <= 0) return false;
  if ((family.keys & LlamaFamily::sparse_step_keys) == 0) return true;  // Mixtral: every layer
  // Qwen3MoeDecoderLayer: not in mlp_only_layers, and every decoder_sparse_step-th.
  if (c.mlp_only_layers.is_array())
    for (const auto& i : c.mlp_only_layers)
      if (i.is_number_integer() && i.get<int64_t>() == layer) return false;
  return c.decoder_sparse_step > 0 && (layer + 1) % c.decoder_sparse_step == 0;
}

LOOM_INLINE std::optional<int64_t> llama_layer_window(const LlamaConfig& c, int64_t layer) {
  const LlamaFamily& family = llama_family(c);
  if (family.window_attends) return c.sliding_window;  // Mistral: every layer
  // Gemma 2 and 3: the sliding layers; Qwen2 / Qwen3: those with use_sliding_window.
  if (family.sliding_pattern == 0 && !c.use_sliding_window.value_or(false)) return std::nullopt;
  return llama_layer_slides(c, layer) ? c.sliding_window : std::nullopt;
}

namespace detail {
// transformers' sliding_window_overlay on the causal mask: query i (at key index `offset` + i)
// sees key j when j <= offset + i and offset + i - j < window. bool [query, keys].
inline torch::Tensor sliding_window_mask(int64_t query, int64_t keys, int64_t window, const torch::Device& device) {
  const auto options = torch::TensorOptions().device(device).dtype(torch::kLong);
  const auto q = torch::arange(keys - query, keys, options).unsqueeze(1);
  const auto k = torch::arange(keys, options).unsqueeze(0);
  return k.le(q).logical_and(q.sub(k).lt(window));
}
// The most negative finite value of a floating dtype (torch.finfo(dtype).min).
inline double lowest_value(torch::ScalarType type) {
  switch (type) {
    case torch::kHalf: return static_cast<double>(std::numeric_limits<c10::Half>::lowest());
    case torch::kBFloat16: return static_cast<double>(std::numeric_limits<c10::BFloat16>::lowest());
    case torch::kDouble: return std::numeric_limits<double>::lowest();
    default: return std::numeric_limits<float>::lowest();
  }
}
// The causal mask alone (the last `query` of `keys` positions see the keys up to themselves),
// bool [1, 1, query, keys]: what the written-out attention masks with when no mask is given.
inline torch::Tensor causal_mask(int64_t query, int64_t keys, const torch::Device& device) {
  return sliding_window_mask(query, keys, keys, device).view({1, 1, query, keys});
}
}  // namespace detail

LOOM_INLINE std::vector<ConfigShape> config_shapes(const LlamaConfig& c) {
  const int64_t kv = llama_kv_heads(c), head_dim = llama_head_dim(c);
  const auto h = ", hidden_size " + std::to_string(c.hidden_size);
  const auto last = "model.layers." + std::to_string(c.num_hidden_layers - 1);
  const bool fused = llama_family(c).fused_projections;  // Phi-3: k is a slice of qkv_proj
  const LlamaFamily& family = llama_family(c);
  // A sparse last layer: its last expert's down projection (the experts' count and width).
  const bool sparse = llama_layer_sparse(c, c.num_hidden_layers - 1);
  const std::string down =
      sparse ? last + "." + std::string(family.moe_block) + ".experts." + std::to_string(llama_experts(c) - 1) + "." +
                   std::string(family.expert_projections[2]) + ".weight"
             : last + ".mlp.down_proj.weight";
  const int64_t width = sparse ? llama_expert_width(c) : c.intermediate_size;
  return {{"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, "vocab_size " + std::to_string(c.vocab_size) + h},
          {last + (fused ? ".self_attn.qkv_proj.weight" : ".self_attn.k_proj.weight"),
           {(fused ? c.num_attention_heads * head_dim + 2 * kv * head_dim : kv * head_dim), c.hidden_size},
           "num_hidden_layers " + std::to_string(c.num_hidden_layers) + ", num_key_value_heads " + std::to_string(kv) +
               ", head_dim " + std::to_string(head_dim) + h},
          {down, {c.hidden_size, width},
           (sparse ? "num_local_experts " + std::to_string(llama_experts(c)) + ", expert width " : "intermediate_size ") +
               std::to_string(width) + h}};
}

LOOM_INLINE int64_t parameter_count(const LlamaConfig& c) {
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  const int64_t heads = c.num_attention_heads, kv = llama_kv_heads(c), head_dim = llama_head_dim(c);
  const int64_t attention = h * (heads + 2 * kv) * head_dim + (llama_qkv_bias(c) ? (heads + 2 * kv) * head_dim : 0) +
                            heads * head_dim * h + (c.attention_bias ? h : 0) +
                            (llama_family(c).qk_norm ? 2 * head_dim : 0);
  const int64_t mlp = 3 * h * i + (c.mlp_bias ? 2 * i + h : 0);
  const int64_t layer = attention + (llama_family(c).sandwich_norms ? 4 : 2) * h;  // and the RMSNorms
  // A sparse layer: the router and its experts, in place of the dense MLP.
  const int64_t sparse = llama_experts(c) * (h + 3 * h * llama_expert_width(c));
  int64_t layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) layers += layer + (llama_layer_sparse(c, l) ? sparse : mlp);
  return c.vocab_size * h + layers + h + (c.tie_word_embeddings ? 0 : c.vocab_size * h);
}

// ---- norm, attention, MLP, layer ----------------------------------------------------------

LOOM_INLINE LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t hidden_size, double eps, bool plus_one)
    : eps_(eps), plus_one_(plus_one) {
  weight = register_parameter("weight", new_parameter_tensor({hidden_size}, plus_one ? 0.0 : 1.0));
}

LOOM_INLINE torch::Tensor LlamaRMSNormImpl::forward(const torch::Tensor& x) {
  const auto dtype = x.scalar_type();
  const auto h = x.to(torch::kFloat);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  const auto normed = h * torch::rsqrt(variance + eps_);
  // GemmaRMSNorm: the product in float32, then the input's dtype; Llama's: the weight times the
  // normed input already in the input's dtype.
  if (plus_one_) return (normed * (1.0 + weight.to(torch::kFloat))).to(dtype);
  return weight * normed.to(dtype);
}

LOOM_INLINE LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c, int64_t layer)
    : heads_(c.num_attention_heads),
      kv_heads_(llama_kv_heads(c)),
      head_dim_(llama_head_dim(c)),
      dropout_(c.attention_dropout),
      // Gemma 2 and 3: query_pre_attn_scalar ** -0.5; the others head_dim ** -0.5.
      scaling_(std::pow(static_cast<double>((llama_family(c).keys & LlamaFamily::softcap_keys) != 0
                                                ? c.query_pre_attn_scalar.value_or(256)
                                                : head_dim_),
                        -0.5)),
      window_(llama_layer_window(c, layer)),
      softcap_(llama_family(c).attention_softcap ? c.attn_logit_softcapping : std::nullopt) {
  const bool qkv_bias = llama_qkv_bias(c);
  const auto linear = [&](int64_t in, int64_t out, bool bias) { return peft::AdaptableLinear(in, out, bias); };
  if (llama_family(c).fused_projections) {  // Phi3Attention registers o_proj, then qkv_proj
    o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size, c.attention_bias));
    qkv_proj = register_module("qkv_proj", linear(c.hidden_size, (heads_ + 2 * kv_heads_) * head_dim_, qkv_bias));
  } else {
    q_proj = register_module("q_proj", linear(c.hidden_size, heads_ * head_dim_, qkv_bias));
    k_proj = register_module("k_proj", linear(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    v_proj = register_module("v_proj", linear(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
    o_proj = register_module("o_proj", linear(heads_ * head_dim_, c.hidden_size, c.attention_bias));
  }
  if (llama_family(c).qk_norm) {  // registered after o_proj, as Qwen3Attention's
    q_norm = register_module("q_norm", LlamaRMSNorm(head_dim_, c.rms_norm_eps, llama_family(c).norm_plus_one));
    k_norm = register_module("k_norm", LlamaRMSNorm(head_dim_, c.rms_norm_eps, llama_family(c).norm_plus_one));
  }
}

LOOM_INLINE std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> LlamaAttentionImpl::project(const torch::Tensor& x) {
  if (qkv_proj.is_empty()) return {q_proj(x), k_proj(x), v_proj(x)};
  // Phi3Attention: q, then k, then v along the last dimension of the one projection.
  const auto qkv = qkv_proj(x);
  const int64_t q_width = heads_ * head_dim_, kv_width = kv_heads_ * head_dim_;
  return {qkv.narrow(-1, 0, q_width), qkv.narrow(-1, q_width, kv_width), qkv.narrow(-1, q_width + kv_width, kv_width)};
}

LOOM_INLINE torch::Tensor LlamaAttentionImpl::split_heads(const torch::Tensor& t, LlamaRMSNorm norm) const {
  // Qwen3Attention: the norm over each head's width of [batch, seq, heads, head_dim], then the
  // heads to dim 1.
  auto h = t.view({t.size(0), t.size(1), -1, head_dim_});
  if (!norm.is_empty()) h = norm->forward(h);
  return h.transpose(1, 2);
}

namespace detail {
// rotate_half: the second half of the last dimension, negated, then the first half.
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  const auto x1 = x.narrow(-1, 0, half);
  const auto x2 = x.narrow(-1, half, half);
  return torch::cat({-x2, x1}, -1);
}
}  // namespace detail

namespace detail {
// apply_rotary_pos_emb on [batch, heads, seq, head_dim] with cos/sin broadcast over the heads:
// the whole head, or (a partial rotary factor, Phi-3's) its first cos.size(-1) channels, the
// rest passed through.
inline torch::Tensor apply_rope(const torch::Tensor& t, const torch::Tensor& c, const torch::Tensor& s) {
  const int64_t rotary = c.size(-1);
  if (rotary == t.size(-1)) return (t * c) + (rotate_half(t) * s);
  const auto turned = t.narrow(-1, 0, rotary);
  return torch::cat({(turned * c) + (rotate_half(turned) * s), t.narrow(-1, rotary, t.size(-1) - rotary)}, -1);
}

// transformers' repeat_kv: the key/value heads [batch, kv_heads, seq, head_dim] each repeated
// `groups` times in place, [batch, kv_heads * groups, seq, head_dim].
inline torch::Tensor repeat_kv(const torch::Tensor& t, int64_t groups) {
  if (groups == 1) return t;
  const int64_t batch = t.size(0), kv_heads = t.size(1), seq = t.size(2), head_dim = t.size(3);
  return t.unsqueeze(2).expand({batch, kv_heads, groups, seq, head_dim}).reshape({batch, kv_heads * groups, seq, head_dim});
}

// The half-precision dtype the flash kernel runs in for `q`: its own, or autocast's on CUDA;
// none when neither is half precision.
inline std::optional<torch::ScalarType> flash_dtype(const torch::Tensor& q) {
  const auto half = [](torch::ScalarType t) { return t == torch::kHalf || t == torch::kBFloat16; };
  if (half(q.scalar_type())) return q.scalar_type();
  if (at::autocast::is_autocast_enabled(at::kCUDA) && half(at::autocast::get_autocast_dtype(at::kCUDA)))
    return at::autocast::get_autocast_dtype(at::kCUDA);
  return std::nullopt;
}
}  // namespace detail

LOOM_INLINE torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                      const torch::Tensor& sin, const torch::Tensor& mask,
                                                      const torch::Tensor& cu_seqlens) {
  const int64_t batch = x.size(0), seq = x.size(1);
  // A window shorter than the sequence: the causal mask (or the packed documents') narrowed to it.
  const bool windowed = window_ && seq > *window_;
  torch::Tensor attention_mask = mask;
  if (windowed) {
    const auto sliding = detail::sliding_window_mask(seq, seq, *window_, x.device());
    attention_mask = mask.defined() ? mask.logical_and(sliding) : sliding.view({1, 1, seq, seq});
  }
  const auto [q_flat, k_flat, v_flat] = project(x);
  auto q = split_heads(q_flat, q_norm);
  auto k = split_heads(k_flat, k_norm);
  const auto v = split_heads(v_flat, nullptr);
  // apply_rotary_pos_emb: cos/sin [batch, seq, head_dim] broadcast over the heads.
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  q = detail::apply_rope(q, c, s);
  k = detail::apply_rope(k, c, s);
  if (softcap_) {  // the scores capped before the mask: written out, under the causal mask at least
    auto y = eager_attention(
        q, k, v, attention_mask.defined() ? attention_mask : detail::causal_mask(seq, seq, x.device()));
    return o_proj(y.transpose(1, 2).contiguous().reshape({batch, seq, -1}).contiguous());
  }
  // Packed documents on CUDA in half precision: the variable-length flash kernel over the
  // flattened tokens ([tokens, heads, head_dim]), causal within each document (a window that
  // binds takes the mask below instead).
  if (cu_seqlens.defined() && !windowed && head_dim_ % 8 == 0 && head_dim_ <= 256)
    if (const auto dtype = detail::flash_dtype(q)) {
      const auto flat = [&](const torch::Tensor& t, int64_t n) {
        return t.transpose(1, 2).reshape({batch * seq, n, head_dim_}).to(*dtype);
      };
      const auto out = std::get<0>(at::_flash_attention_forward(
          flat(q, heads_), flat(k, kv_heads_), flat(v, kv_heads_), cu_seqlens, cu_seqlens, seq, seq,
          is_training() ? dropout_ : 0.0, /*is_causal=*/true, /*return_debug_mask=*/false, scaling_));
      return o_proj(out.reshape({batch, seq, -1}));
    }
  // Causal, or a mask: padding, packed documents (causal within each) and / or the sliding
  // window. transformers' sdpa_attention_forward: grouped heads by SDPA's enable_gqa without a
  // mask (head_dim up to 256), else the key/value heads repeated (repeat_kv), which also keeps
  // a masked CUDA call off SDPA's math kernel (the memory-efficient one takes no enable_gqa).
  const double dropout = is_training() ? dropout_ : 0.0;
  const int64_t groups = heads_ / kv_heads_;
  torch::Tensor y;
  if (attention_mask.defined())
    y = at::scaled_dot_product_attention(q, detail::repeat_kv(k, groups), detail::repeat_kv(v, groups), attention_mask,
                                         dropout, /*is_causal=*/false, scaling_);
  else if (groups > 1 && head_dim_ > 256)
    y = at::scaled_dot_product_attention(q, detail::repeat_kv(k, groups), detail::repeat_kv(v, groups), {}, dropout,
                                         /*is_causal=*/seq > 1, scaling_);
  else
    y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout, /*is_causal=*/seq > 1, scaling_,
                                         /*enable_gqa=*/groups > 1);
  y = y.transpose(1, 2).contiguous().reshape({batch, seq, -1}).contiguous();
  return o_proj(y);
}

LOOM_INLINE torch::Tensor LlamaAttentionImpl::forward_step(const torch::Tensor& x, const torch::Tensor& cos,
                                                           const torch::Tensor& sin, const AttentionStep& step) {
  const int64_t batch = x.size(0), seq = x.size(1);
  const auto [q_flat, k_flat, v_flat] = project(x);
  auto q = split_heads(q_flat, q_norm);
  auto k = split_heads(k_flat, k_norm);
  auto v = split_heads(v_flat, nullptr);
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  q = detail::apply_rope(q, c, s);
  k = detail::apply_rope(k, c, s);
  if (step.cache != nullptr) std::tie(k, v) = step.cache->update(k, v);
  const int64_t keys = k.size(2);
  // Past the window: the step's mask (causal, or with left padding) narrowed to it.
  AttentionStep windowed{step.mask, step.cache};
  if (window_ && keys > *window_) {
    const auto sliding = detail::sliding_window_mask(seq, keys, *window_, x.device());
    windowed.mask = step.mask.defined() ? step.mask.logical_and(sliding) : sliding.view({1, 1, seq, keys});
  }
  const AttentionStep& masked = windowed;
  if (softcap_) {
    auto y = eager_attention(q, k, v, masked.mask.defined() ? masked.mask : detail::causal_mask(seq, keys, x.device()));
    return o_proj(y.transpose(1, 2).contiguous().reshape({batch, seq, -1}).contiguous());
  }
  // transformers' sdpa_attention_forward: grouped heads by sdpa's enable_gqa without a mask;
  // a single query with a mask as [batch, kv_heads, groups] queries against the kv heads;
  // else the key/value heads repeated (repeat_kv).
  const int64_t groups = heads_ / kv_heads_;
  const bool causal = seq > 1 && !masked.mask.defined();
  torch::Tensor y;
  if (groups > 1 && !masked.mask.defined() && head_dim_ <= 256) {
    y = at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scaling_, /*enable_gqa=*/true);
  } else if (groups > 1 && seq == 1) {
    y = at::scaled_dot_product_attention(q.reshape({batch, kv_heads_, groups, head_dim_}), k, v, masked.sdpa_mask(), 0.0,
                                         false, scaling_)
            .reshape({batch, -1, seq, head_dim_});
  } else {
    y = at::scaled_dot_product_attention(q, detail::repeat_kv(k, groups), detail::repeat_kv(v, groups),
                                         masked.sdpa_mask(), 0.0, causal, scaling_);
  }
  y = y.transpose(1, 2).contiguous().reshape({batch, seq, -1}).contiguous();
  return o_proj(y);
}

LOOM_INLINE torch::Tensor LlamaAttentionImpl::eager_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                              const torch::Tensor& v, const torch::Tensor& mask) const {
  // transformers' eager_attention_forward, op by op: repeat_kv, the scaled scores, the soft-cap
  // (divide, tanh, multiply), the mask (an added finfo.min there: the same value, as |scores| is
  // far below its rounding), softmax in float32 back to q's dtype, dropout, the values.
  const int64_t groups = heads_ / kv_heads_;
  auto scores = torch::matmul(q, detail::repeat_kv(k, groups).transpose(2, 3)) * scaling_;
  if (softcap_) scores = torch::tanh(scores / *softcap_) * *softcap_;
  scores = scores.masked_fill(mask.logical_not(), detail::lowest_value(scores.scalar_type()));
  auto weights = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  if (is_training() && dropout_ > 0) weights = torch::dropout(weights, dropout_, /*train=*/true);
  return torch::matmul(weights, detail::repeat_kv(v, groups));
}

LOOM_INLINE LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c)
    : activation_(activation_fn(c.hidden_act)), intermediate_(c.intermediate_size) {
  const auto linear = [&](int64_t in, int64_t out) { return peft::AdaptableLinear(in, out, c.mlp_bias); };
  if (llama_family(c).fused_projections) {  // Phi3MLP: gate_up_proj, then down_proj
    gate_up_proj = register_module("gate_up_proj", linear(c.hidden_size, 2 * c.intermediate_size));
  } else {
    gate_proj = register_module("gate_proj", linear(c.hidden_size, c.intermediate_size));
    up_proj = register_module("up_proj", linear(c.hidden_size, c.intermediate_size));
  }
  down_proj = register_module("down_proj", linear(c.intermediate_size, c.hidden_size));
}

LOOM_INLINE LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c, int64_t intermediate,
                                       const std::array<std::string_view, 3>& names)
    : activation_(activation_fn(c.hidden_act)), intermediate_(intermediate) {
  // transformers' files name an expert's projections (Mixtral's w1, w3, w2); none has a bias.
  const auto linear = [&](int64_t in, int64_t out) { return peft::AdaptableLinear(in, out, /*bias=*/false); };
  gate_proj = register_module(std::string(names[0]), linear(c.hidden_size, intermediate));
  up_proj = register_module(std::string(names[1]), linear(c.hidden_size, intermediate));
  down_proj = register_module(std::string(names[2]), linear(intermediate, c.hidden_size));
  expert_ = true;
}

LOOM_INLINE torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  if (!gate_up_proj.is_empty()) {  // Phi3MLP: the first half is the gate, the second the up projection
    const auto both = gate_up_proj(x);
    return down_proj(both.narrow(-1, intermediate_, intermediate_) * activation_(both.narrow(-1, 0, intermediate_)));
  }
  if (expert_ && torch::GradMode::is_enabled() && !gate_proj->has_adapter() && !up_proj->has_adapter() &&
      !gate_proj->quantized() && !up_proj->quantized()) {
    // transformers 5.23 fuses an expert's gate and up projections at load ([gate; up], its
    // experts.gate_up_proj) and runs them as one product: so here, over the two weights
    // concatenated, when a backward may follow. The input's gradient is then one product as
    // there; two summed round otherwise (the forward's values are the same either way, so
    // evaluation and generation skip the copy). The parameters stay the two of the files.
    const auto both = torch::nn::functional::linear(x, torch::cat({gate_proj->weight, up_proj->weight}));
    return down_proj(activation_(both.narrow(-1, 0, intermediate_)) * both.narrow(-1, intermediate_, intermediate_));
  }
  const auto gated = activation_(gate_proj(x));
  return down_proj(gated * up_proj(x));
}

LOOM_INLINE LlamaSparseMoeBlockImpl::LlamaSparseMoeBlockImpl(const LlamaConfig& c)
    : top_k_(llama_experts_per_tok(c)),
      normalize_(llama_family(c).always_norm_topk || c.norm_topk_prob),
      float_weights_(llama_family(c).float_routing_weights),
      jitter_(c.router_jitter_noise),
      class_name_(llama_family(c).moe_block_class) {
  const int64_t count = llama_experts(c);
  const bool experts_first = llama_family(c).experts_before_router;
  if (!experts_first) gate = register_module("gate", new_linear(c.hidden_size, count, /*bias=*/false));
  experts = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < count; ++e) {
    expert_mlps.emplace_back(c, llama_expert_width(c), llama_family(c).expert_projections);
    experts->push_back(expert_mlps.back());
  }
  if (experts_first) gate = register_module("gate", new_linear(c.hidden_size, count, /*bias=*/false));
}

LOOM_INLINE std::vector<std::vector<torch::Tensor>> LlamaSparseMoeBlockImpl::fused_gradients() const {
  // transformers 5.23's experts.gate_up_proj ([experts, 2 x width, hidden]: each expert's gate
  // then up) and experts.down_proj ([experts, hidden, width]).
  std::vector<torch::Tensor> gate_up, down;
  for (const auto& e : expert_mlps) {
    gate_up.push_back(e->gate_proj->weight);
    gate_up.push_back(e->up_proj->weight);
    down.push_back(e->down_proj->weight);
  }
  return {std::move(gate_up), std::move(down)};
}

LOOM_INLINE torch::Tensor LlamaSparseMoeBlockImpl::forward(const torch::Tensor& input, bool router_logits) {
  const int64_t width = input.size(-1), count = static_cast<int64_t>(expert_mlps.size());
  auto x = input.reshape({-1, width});
  // MixtralSparseMoeBlock's jitter: the input times uniform(1 - j, 1 + j) noise, in training.
  if (jitter_ > 0 && is_training()) x = x * torch::empty_like(x).uniform_(1.0 - jitter_, 1.0 + jitter_);
  // The router (MixtralTopKRouter, Qwen3MoeTopKRouter): softmax in float32, the top k, their
  // weights renormalized (Mixtral always, Qwen3-MoE by norm_topk_prob), Qwen3-MoE's cast back.
  const auto logits = gate(x);
  auto [weights, chosen] = torch::softmax(logits, -1, torch::kFloat).topk(top_k_, -1);
  if (normalize_) weights = weights / weights.sum(-1, /*keepdim=*/true);
  if (!float_weights_) weights = weights.to(logits.scalar_type());
  // transformers' grouped_mm experts: the (token, k) pairs sorted by expert, each expert's
  // SwiGLU on its rows, the products weighted, put back in token order and summed over k.
  const auto flat = chosen.reshape({-1});
  // torch.sort's default, not stable, as transformers sorts: the rows of an expert in the same
  // order, so its weight gradient sums them in the same order.
  const auto [sorted, order] = flat.sort(/*dim=*/0);
  const auto rows = x.index_select(0, order.div(top_k_, "floor"));
  const auto counts = torch::bincount(flat, {}, count).cpu();  // a host sync: each expert's rows
  const auto* per_expert = counts.data_ptr<int64_t>();
  std::vector<torch::Tensor> outs;
  int64_t start = 0;
  for (int64_t e = 0; e < count; ++e) {
    outs.push_back(expert_mlps[e]->forward(rows.narrow(0, start, per_expert[e])));
    start += per_expert[e];
  }
  auto weighted = torch::cat(outs) * weights.reshape({-1}).index_select(0, order).unsqueeze(-1);
  weighted = torch::zeros_like(weighted).index_copy(0, order, weighted);
  auto out = weighted.view({-1, top_k_, width}).sum(1).to(x.scalar_type());
  if (!router_logits) return out;
  return torch::cat({out, logits.to(out.scalar_type())}, -1);
}

LOOM_INLINE LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c, int64_t layer)
    : decoder_layer_(llama_family(c).decoder_layer), resid_dropout_(c.resid_pdrop) {
  self_attn = register_module("self_attn", LlamaAttention(c, layer));
  if (llama_layer_sparse(c, layer)) {  // MixtralDecoderLayer's block_sparse_moe, Qwen3MoeDecoderLayer's mlp
    moe = full_shard_unit(LlamaSparseMoeBlock(c));
    register_module(std::string(llama_family(c).moe_block), moe);
    router_logits_ = c.output_router_logits;
  } else {
    mlp = register_module("mlp", LlamaMLP(c));
  }
  const bool plus_one = llama_family(c).norm_plus_one;
  input_layernorm = register_module("input_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps, plus_one));
  post_attention_layernorm =
      register_module("post_attention_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps, plus_one));
  if (llama_family(c).sandwich_norms) {  // Gemma2DecoderLayer's order
    pre_feedforward_layernorm =
        register_module("pre_feedforward_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps, plus_one));
    post_feedforward_layernorm =
        register_module("post_feedforward_layernorm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps, plus_one));
  }
}

LOOM_INLINE torch::Tensor LlamaDecoderLayerImpl::after_attention(const torch::Tensor& x, const torch::Tensor& attended,
                                                                 bool router_logits) {
  if (!post_feedforward_layernorm.is_empty()) {  // Gemma 2 and 3: each sublayer's output normed before its sum
    const auto h = x + post_attention_layernorm(attended);
    return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
  }
  // Phi3DecoderLayer's resid_attn_dropout and resid_mlp_dropout (0 elsewhere: no op).
  const auto drop = [&](const torch::Tensor& t) {
    return resid_dropout_ > 0 && is_training() ? torch::dropout(t, resid_dropout_, /*train=*/true) : t;
  };
  const auto h = x + drop(attended);
  if (moe.is_empty()) return h + drop(mlp(post_attention_layernorm(h)));
  const int64_t width = h.size(-1);
  const auto routed = moe->forward(post_attention_layernorm(h), router_logits);  // [tokens, hidden (+ experts)]
  const auto out = h + drop(routed.narrow(-1, 0, width).reshape(h.sizes()));
  if (!router_logits) return out;
  auto shape = h.sizes().vec();
  shape.back() = routed.size(-1) - width;
  return torch::cat({out, routed.narrow(-1, width, shape.back()).reshape(shape)}, -1);
}

LOOM_INLINE torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                         const torch::Tensor& sin, const torch::Tensor& mask,
                                                         const torch::Tensor& cu_seqlens) {
  return after_attention(x, self_attn(input_layernorm(x), cos, sin, mask, cu_seqlens), router_logits_);
}

LOOM_INLINE torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                         const torch::Tensor& sin, const AttentionStep& step) {
  return after_attention(x, self_attn->forward_step(input_layernorm(x), cos, sin, step));
}

// ---- the body ------------------------------------------------------------------------------

LOOM_INLINE LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c) {
  // Untied, the embeddings and the head are FullShard units of their own (torchtitan's
  // layout), so neither stays gathered through the whole step; tied, both stay in the root.
  if (c.tie_word_embeddings) {
    embed_tokens = register_module("embed_tokens", new_embedding(c.vocab_size, c.hidden_size));
  } else {
    embed_unit = register_module("embed_tokens", full_shard_unit(new_embedding(c.vocab_size, c.hidden_size)));
    embed_unit->loom_never_recompute = true;
    embed_tokens = embed_unit->inner();
  }
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    units.push_back(full_shard_unit(LlamaDecoderLayer(c, i)));
    layers->push_back(units.back());
  }
  norm = register_module("norm", LlamaRMSNorm(c.hidden_size, c.rms_norm_eps, llama_family(c).norm_plus_one));
  // Gemma's scaled embedding: sqrt(hidden_size) (Python's hidden_size**0.5) as a float32 scalar.
  if (llama_family(c).embed_scale) embed_scale_ = std::pow(static_cast<double>(c.hidden_size), 0.5);
  // The rotary tables: one, or (Gemma 3) the full-attention layers' and the sliding layers'.
  const bool per_type = llama_family(c).local_rope_theta > 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layer_rope_.push_back(per_type && llama_layer_slides(c, i) ? 1 : 0);
  if (per_type) {
    ropes_.emplace_back(c, c.rope_parameters.at("full_attention"));
    ropes_.emplace_back(c, c.rope_parameters.at("sliding_attention"));
  } else {
    ropes_.emplace_back(c, c.rope_parameters);
  }
}

LOOM_INLINE LlamaRotaryEmbedding::LlamaRotaryEmbedding(const LlamaConfig& c, const nlohmann::json& rope) {
  // The rope's inverse frequencies (transformers' rope init functions), in float32.
  // The rotary width: the head's, or its first partial_rotary_factor share (Phi-3's; int() as transformers).
  const int64_t dim = static_cast<int64_t>(static_cast<double>(c.head_dim.value_or(c.hidden_size / c.num_attention_heads)) *
                                           rope.value("partial_rotary_factor", 1.0));
  const double theta = rope.value("rope_theta", 10000.0);
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim);
  if (detail::rope_type(rope) == "llama3") {
    const double factor = rope["factor"].get<double>(), low = rope["low_freq_factor"].get<double>(),
                 high = rope["high_freq_factor"].get<double>(),
                 old_len = rope["original_max_position_embeddings"].get<double>();
    const double low_wavelen = old_len / low, high_wavelen = old_len / high;
    const auto wavelen = 2 * std::numbers::pi / inv_freq;
    auto scaled = torch::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
    const auto smooth = (old_len / wavelen - low) / (high - low);
    const auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
    const auto medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
    inv_freq = torch::where(medium, smoothed, scaled);
  } else if (detail::rope_type(rope) == "linear") {  // _compute_linear_scaling_rope_parameters
    inv_freq = inv_freq / rope["factor"].get<double>();
  } else if (detail::rope_type(rope) == "yarn") {  // _compute_yarn_parameters, op for op
    const double original = rope["original_max_position_embeddings"].get<double>();
    const double factor = detail::rope_optional(rope, "factor", "config.json")
                              .value_or(static_cast<double>(c.max_position_embeddings) / original);
    const auto mscale_of = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
    const auto mscale = detail::rope_optional(rope, "mscale", "config.json");
    const auto mscale_all_dim = detail::rope_optional(rope, "mscale_all_dim", "config.json");
    if (const auto given = detail::rope_optional(rope, "attention_factor", "config.json")) attention_scaling_ = *given;
    else if (mscale.value_or(0) != 0 && mscale_all_dim.value_or(0) != 0)
      attention_scaling_ = mscale_of(factor, *mscale) / mscale_of(factor, *mscale_all_dim);
    else attention_scaling_ = mscale_of(factor, 1.0);
    const auto or_default = [&](const char* key, double fallback) {  // Python's `get(key) or fallback`
      const auto v = detail::rope_optional(rope, key, "config.json");
      return v && *v != 0 ? *v : fallback;
    };
    const double beta_fast = or_default("beta_fast", 32.0), beta_slow = or_default("beta_slow", 1.0);
    const auto correction_dim = [&](double rotations) {
      return (static_cast<double>(dim) * std::log(original / (rotations * 2 * std::numbers::pi))) / (2 * std::log(theta));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (rope.value("truncate", true)) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, static_cast<double>(dim - 1));
    if (low == high) high += 0.001;  // linear_ramp_factor's guard
    const auto pos_freqs = torch::pow(theta, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim);
    const auto extrapolation = 1.0 / pos_freqs;
    const auto interpolation = 1.0 / (factor * pos_freqs);
    const auto ramp = torch::clamp((torch::arange(dim / 2, torch::kFloat) - low) / (high - low), 0, 1);
    const auto extrapolation_factor = 1 - ramp;
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor;
  } else if (detail::rope_type(rope) == "dynamic") {
    // _compute_dynamic_ntk_parameters at init (seq_len = max_position_embeddings), in Python's doubles.
    const double factor = rope["factor"].get<double>(), m = static_cast<double>(c.max_position_embeddings);
    const double base = theta * std::pow(factor * m / m - (factor - 1), static_cast<double>(dim) / (dim - 2.0));
    inv_freq = 1.0 / torch::pow(base, torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim);
  } else if (detail::rope_type(rope) == "longrope") {  // _compute_longrope_parameters
    const double original = rope["original_max_position_embeddings"].get<double>();
    const double factor = detail::rope_optional(rope, "factor", "config.json")
                              .value_or(static_cast<double>(c.max_position_embeddings) / original);
    if (const auto given = detail::rope_optional(rope, "attention_factor", "config.json")) attention_scaling_ = *given;
    else attention_scaling_ = factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(original));
    const auto shape = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
    const auto with = [&](const char* key) {
      return 1.0 / (torch::tensor(rope[key].get<std::vector<double>>(), torch::kFloat) * torch::pow(theta, shape));
    };
    inv_freq = with("short_factor");
    long_inv_freq_ = with("long_factor");
  }
  inv_freq_ = inv_freq;
  rope_type_ = detail::rope_type(rope);
  rope_ = rope;
  rope_dim_ = dim;
  max_positions_ = max_seq_len_cached_ = c.max_position_embeddings;
  original_inv_freq_ = inv_freq.clone();
}

LOOM_INLINE torch::Tensor LlamaModelImpl::embed(const torch::Tensor& input_ids) {
  auto x = embed_unit ? embed_unit->forward(input_ids) : embed_tokens(input_ids);
  if (!embed_scale_) return x;
  // GemmaTextScaledWordEmbedding: times the scale as a float32 tensor cast to the weight's dtype.
  const auto scale = torch::scalar_tensor(*embed_scale_, torch::TensorOptions().dtype(torch::kFloat).device(x.device()));
  return x * scale.to(embed_tokens->weight.scalar_type());
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> LlamaModelImpl::rotary(int64_t seq, const torch::Device& device) {
  return rotary(torch::arange(seq, torch::TensorOptions().device(device).dtype(torch::kLong)).unsqueeze(0));
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> LlamaModelImpl::rotary(const torch::Tensor& positions) {
  return ropes_.front()(positions);
}

LOOM_INLINE std::vector<std::pair<torch::Tensor, torch::Tensor>> LlamaModelImpl::rotary_tables(
    const torch::Tensor& positions, torch::ScalarType dtype) {
  std::vector<std::pair<torch::Tensor, torch::Tensor>> tables;
  for (auto& rope : ropes_) {
    auto [cos, sin] = rope(positions);
    tables.emplace_back(cos.to(dtype), sin.to(dtype));
  }
  return tables;
}

LOOM_INLINE std::pair<torch::Tensor, torch::Tensor> LlamaRotaryEmbedding::operator()(const torch::Tensor& positions) {
  if (rope_type_ == "dynamic" || rope_type_ == "longrope") {
    // transformers' dynamic_rope_update, from the longest position (a host read).
    const int64_t seq_len = positions.max().item<int64_t>() + 1;
    const auto device = positions.device();
    if (rope_type_ == "longrope") {
      const double original = rope_["original_max_position_embeddings"].get<double>();
      inv_freq_ = (static_cast<double>(seq_len) > original ? long_inv_freq_ : original_inv_freq_).to(device);
    } else {
      const int64_t cached = max_seq_len_cached_;
      if (seq_len > cached) {  // growth: _compute_dynamic_ntk_parameters at seq_len, in float32 as there
        const double factor = rope_["factor"].get<double>(), theta = rope_.value("rope_theta", 10000.0);
        const auto length = torch::tensor(seq_len, torch::kLong);
        const auto base = ((length * factor) / max_positions_ - (factor - 1))
                              .pow(static_cast<double>(rope_dim_) / (rope_dim_ - 2.0)) * theta;
        inv_freq_ = (1.0 / torch::pow(base, torch::arange(0, rope_dim_, 2, torch::kLong).to(torch::kFloat) / rope_dim_))
                        .to(device);
        max_seq_len_cached_ = seq_len;
      }
      if (seq_len < max_positions_ && cached > max_positions_) {  // reset to the original frequencies
        inv_freq_ = original_inv_freq_.to(device);
        max_seq_len_cached_ = max_positions_;
      }
    }
  }
  if (inv_freq_.device() != positions.device()) inv_freq_ = inv_freq_.to(positions.device());
  // LlamaRotaryEmbedding.forward: float32, autocast off; position x frequency, [batch, seq, dim].
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto freqs = positions.to(torch::kFloat).unsqueeze(-1).matmul(inv_freq_.view({1, 1, -1}));
  const auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos() * attention_scaling_, emb.sin() * attention_scaling_};
}

namespace detail {
// Packed documents: a query attends to the keys of its own document (whose positions restart
// at 0), at or before it. bool [batch, 1, seq, seq].
inline torch::Tensor packed_attention_mask(const torch::Tensor& position_ids) {
  const auto document = position_ids.eq(0).cumsum(1);
  const auto same = document.unsqueeze(2).eq(document.unsqueeze(1));
  const int64_t seq = position_ids.size(1);
  const auto causal = torch::ones({seq, seq}, position_ids.options().dtype(torch::kBool)).tril();
  return same.logical_and(causal).unsqueeze(1);
}
// The same documents for the variable-length kernel: where each starts in the flattened
// tokens (a position 0, or a row's first token), then the number of tokens; int32.
inline torch::Tensor packed_cu_seqlens(const torch::Tensor& position_ids) {
  auto starts = position_ids.eq(0);
  starts.select(1, 0).fill_(true);
  const auto begin = starts.reshape({-1}).nonzero().reshape({-1});  // a host sync: the count
  const auto total = torch::full({1}, position_ids.numel(), begin.options());
  return torch::cat({begin, total}).to(torch::kInt);
}
}  // namespace detail

LOOM_INLINE torch::Tensor LlamaModelImpl::forward(const torch::Tensor& input_ids, const torch::Tensor& position_ids,
                                                  bool varlen, const torch::Tensor& attention_mask) {
  check(input_ids.dim() == 2, "the Llama architecture takes input_ids of shape [batch, seq], got {}",
        c10::str(input_ids.sizes()));
  torch::Tensor mask, cu_seqlens;
  if (attention_mask.defined()) {
    check(!position_ids.defined(), "the Llama architecture takes an attention_mask (padding) or position_ids (packed "
                                   "documents), not both");
    mask = padding_attention_mask(attention_mask, input_ids);
  }
  if (position_ids.defined()) {
    check(position_ids.sizes() == input_ids.sizes(), "position_ids of shape {} do not match input_ids of shape {}",
          c10::str(position_ids.sizes()), c10::str(input_ids.sizes()));
    const auto positions = position_ids.to(input_ids.device());
    mask = detail::packed_attention_mask(positions);
    if (varlen && input_ids.is_cuda()) cu_seqlens = detail::packed_cu_seqlens(positions);
  }
  auto x = embedding_noise(embed(input_ids), is_training());
  const auto positions =
      position_ids.defined()
          ? position_ids.to(x.device())
          : torch::arange(input_ids.size(1), torch::TensorOptions().device(x.device()).dtype(torch::kLong)).unsqueeze(0);
  const auto tables = rotary_tables(positions, x.scalar_type());
  router_logits_.clear();
  const int64_t width = x.size(-1);
  for (std::size_t i = 0; i < units.size(); ++i) {
    const auto& [cos, sin] = tables[layer_rope_[i]];
    x = units[i]->forward(x, cos, sin, mask, cu_seqlens);
    if (units[i]->inner()->emits_router_logits()) {  // a sparse layer's router logits beside its output
      router_logits_.push_back(x.narrow(-1, width, x.size(-1) - width).reshape({-1, x.size(-1) - width}));
      x = x.narrow(-1, 0, width).contiguous();
    }
  }
  return norm(x);
}

LOOM_INLINE torch::Tensor LlamaModelImpl::forward_step(const DecodeStep& step) {
  // LlamaModel.forward as generate calls it: the rotary table at the step's positions, the
  // causal mask with padding, each layer with its layer of the cache.
  const int64_t query = step.input_ids.size(1);
  const int64_t past = step.cache != nullptr ? step.cache->seq_length() : 0;
  if (step.cache != nullptr) step.cache->layers.resize(units.size());
  auto x = embed(step.input_ids);
  const auto tables = rotary_tables(step.position_ids.to(x.device()), x.scalar_type());
  const auto mask = step_attention_mask(step.attention_mask, query, past + query, x.device());
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& [cos, sin] = tables[layer_rope_[i]];
    x = units[i]->forward(x, cos, sin, AttentionStep{mask, step.cache != nullptr ? &step.cache->layers[i] : nullptr});
  }
  return norm(x);
}

// ---- the causal LM -------------------------------------------------------------------------

LOOM_INLINE LlamaForCausalLMImpl::LlamaForCausalLMImpl(LlamaConfig config)
    : PreTrainedModel(std::move(config), "LlamaConfig") {
  {
    // libtorch's modules draw their own initialization; it is replaced below, parameter by
    // parameter, so the default generator keeps its state (one draw, the seed, in all).
    const detail::KeepCpuGeneratorState keep;
    model = register_module("model", LlamaModel(config_));
    if (!config_.tie_word_embeddings) {
      head_unit = register_module("lm_head", full_shard_unit(new_linear(config_.hidden_size, config_.vocab_size, /*bias=*/false)));
      head_unit->loom_never_recompute = true;
      lm_head = head_unit->inner();
    }
  }
  init_seeded_parameters();
}

LOOM_INLINE void detail::init_llama_parameter(const torch::nn::Module& root, const LlamaConfig& config,
                                              const std::string& name, torch::Tensor& t, at::Generator generator) {
  torch::NoGradGuard no_grad;
  const double std = config.initializer_range;
  const auto dot = name.rfind('.');
  const std::string owner = dot == std::string::npos ? std::string() : name.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
  // (Not include_self: the root may be under construction, not yet held by a shared_ptr.)
  const torch::nn::Module* module = owner.empty() ? &root : nullptr;
  for (const auto& item : root.named_modules("", /*include_self=*/false))
    if (item.key() == owner) {
      module = item.value().get();
      break;
    }
  check(module != nullptr, "no module of the model holds parameter {}", name);
  // A unit's wrapper registers its block's parameters as its own: the block says what they are.
  if (const auto* unit = dynamic_cast<const dist::FullShardUnitBase*>(module)) module = &unit->block();
  const bool bias = leaf == "bias";
  if (module->as<torch::nn::Linear>() != nullptr || module->as<peft::AdaptableLinear>() != nullptr) {
    bias ? t.zero_() : t.normal_(0.0, std, generator);
  } else if (module->as<torch::nn::Embedding>() != nullptr) {
    t.normal_(0.0, std, generator);
    if (config.pad_token_id && *config.pad_token_id >= 0 && *config.pad_token_id < config.vocab_size)
      t[*config.pad_token_id].zero_();
  } else if (const auto* norm = module->as<LlamaRMSNorm>()) {
    t.fill_(norm->initial_weight());
  } else {
    fail("no initialization is known for parameter {} (a {})", name, c10::demangle(typeid(*module).name()));
  }
}

LOOM_INLINE torch::Tensor LlamaForCausalLMImpl::logits(const torch::Tensor& input_ids) {
  return forward({input_ids, {}}).logits;
}

LOOM_INLINE CausalLMOutput LlamaForCausalLMImpl::forward(const data::CausalLMBatch& batch) {
  const auto hidden = model(batch.input_ids, batch.position_ids, fast_kernels(kernels_, batch.input_ids),
                            batch.attention_mask);
  auto out = with_head(
      hidden,
      [&](const torch::Tensor& weight) {
        return causal_lm_output(hidden, weight, batch.labels, fast_kernels(kernels_, hidden), llama_final_softcap(config_));
      },
      [](const CausalLMOutput& o) { return std::vector<torch::Tensor>{o.loss, o.logits}; });
  // MixtralForCausalLM's output_router_logits: loss + router_aux_loss_coef * the load-balancing loss.
  if (const auto routers = model->take_router_logits(); !routers.empty() && out.loss.defined())
    out.loss = out.loss + load_balancing_loss(routers, llama_experts(config_), llama_experts_per_tok(config_),
                                              batch.attention_mask)
                                  .to(out.loss.device()) *
                              config_.router_aux_loss_coef;
  return out;
}

LOOM_INLINE torch::Tensor load_balancing_loss(const std::vector<torch::Tensor>& router_logits, int64_t experts,
                                              int64_t top_k, const torch::Tensor& attention_mask) {
  check(!router_logits.empty(), "load_balancing_loss: no router logits (a model with sparse layers and "
                                "output_router_logits gives them)");
  // transformers' load_balancing_loss_func op by op: counts by histc (float on the CPU, int on
  // a GPU) or, under a mask, a scatter of its weights; the rows a Python float, or the mask's sum.
  const auto device = router_logits.front().device();
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
  auto tokens = torch::zeros({experts}, f32), probabilities = torch::zeros({experts}, f32);
  torch::Tensor mask, masked_rows;
  double rows = 0.0;
  if (attention_mask.defined()) {
    mask = attention_mask.reshape({-1}).to(f32);
    masked_rows = torch::zeros({}, f32);
  }
  for (const auto& layer : router_logits) {
    const auto routing = torch::softmax(layer.to(device), -1);
    const auto selected = std::get<1>(routing.topk(top_k, -1)).reshape({-1});
    if (!mask.defined()) {
      const bool on_cpu = device.is_cpu() || device.is_mps();
      tokens = tokens + torch::histc(selected.to(on_cpu ? torch::kFloat : torch::kInt), experts, 0, experts);
      probabilities = probabilities + routing.to(torch::kFloat).sum(0);
      rows += static_cast<double>(routing.size(0));
    } else {
      check(mask.size(0) == routing.size(0), "load_balancing_loss: an attention_mask of {} tokens for router logits of {}",
            mask.size(0), routing.size(0));
      tokens = tokens + torch::zeros({experts}, f32).scatter_add(0, selected, mask.repeat_interleave(top_k));
      probabilities = probabilities + (routing.to(torch::kFloat) * mask.unsqueeze(-1)).sum(0);
      masked_rows = masked_rows + mask.sum();
    }
  }
  const auto per_expert = mask.defined() ? tokens / masked_rows : tokens / rows;
  const auto probability = mask.defined() ? probabilities / masked_rows : probabilities / rows;
  return torch::sum(per_expert * probability.unsqueeze(0)) * experts;
}

LOOM_INLINE TokenScores LlamaForCausalLMImpl::token_scores(const data::CausalLMBatch& batch, bool statistics,
                                                       std::optional<bool> chunked) {
  const auto hidden = model(batch.input_ids, batch.position_ids, fast_kernels(kernels_, batch.input_ids));
  return with_head(
      hidden,
      [&](const torch::Tensor& weight) {
        return models::token_scores(hidden, weight, batch.labels, fast_kernels(kernels_, hidden), statistics, chunked,
                                    llama_final_softcap(config_));
      },
      [](const TokenScores& out) { return std::vector<torch::Tensor>{out.log_probs}; });
}

LOOM_INLINE torch::Tensor LlamaForCausalLMImpl::next_token_logits(const DecodeStep& step) {
  const auto hidden = model->forward_step(step);
  const auto last = hidden.narrow(1, hidden.size(1) - 1, 1);
  return with_head(
      last,
      [&](const torch::Tensor& weight) {
        const auto logits = lm_head_logits(last, weight, fast_kernels(kernels_, last), llama_final_softcap(config_))
                                .narrow(-1, 0, weight.size(0));
        return logits.select(1, 0).to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
      },
      [](const torch::Tensor& logits) { return std::vector<torch::Tensor>{logits}; });
}

LOOM_INLINE void LlamaForCausalLMImpl::check_generation_positions(int64_t positions) const {
  // Far past any position table loom reads (a max_new_tokens typed with extra digits) the run
  // would go on for hours, growing its key/value cache: refused before the first step.
  check(positions <= ConfigLimits::positions,
        "generate: the longest prompt plus max_new_tokens needs {} positions, past {}, the most loom generates to (the "
        "largest position table it reads); lower max_new_tokens",
        positions, ConfigLimits::positions);
  if (positions > config_.max_position_embeddings)
    log_message(LogLevel::warning,
                "generate: the longest prompt plus max_new_tokens needs {} positions, past the config's "
                "max_position_embeddings ({}); the rotary embeddings extrapolate (as in transformers), where the "
                "model was not trained",
                positions, config_.max_position_embeddings);
}

LOOM_INLINE std::string_view LlamaForCausalLMImpl::architecture_name() const {
  return llama_family(config_).causal_lm;
}

LOOM_INLINE HfNameRules LlamaForCausalLMImpl::name_rules() const {
  HfNameRules rules;
  rules.base_prefix = "model";
  if (config_.tie_word_embeddings) rules.derived.emplace_back("lm_head.weight", "model.embed_tokens.weight");
  // Older transformers versions saved the rotary table's frequencies.
  rules.ignored_suffixes = {".rotary_emb.inv_freq"};
  return rules;
}

// ---- the sequence classifier ------------------------------------------------------------------

LOOM_INLINE LlamaForSequenceClassificationImpl::LlamaForSequenceClassificationImpl(LlamaConfig config)
    : PreTrainedModel(std::move(config), "LlamaConfig") {
  {
    const detail::KeepCpuGeneratorState keep;  // as the causal LM's
    model = register_module("model", LlamaModel(config_));
    score = register_module("score", peft::AdaptableLinear(config_.hidden_size, config_.num_labels, /*bias=*/false));
  }
  init_seeded_parameters();
}

LOOM_INLINE int64_t LlamaForSequenceClassificationImpl::parameter_count(const LlamaConfig& c) {
  return models::parameter_count(c) - (c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size) +
         c.num_labels * c.hidden_size;
}

LOOM_INLINE torch::Tensor LlamaForSequenceClassificationImpl::pooled_positions(const torch::Tensor& input_ids) const {
  return last_token_positions(input_ids, config_.pad_token_id, architecture_name());
}

LOOM_INLINE torch::Tensor LlamaForSequenceClassificationImpl::logits(const torch::Tensor& input_ids,
                                                                     const torch::Tensor& attention_mask) {
  const auto hidden = model->forward(input_ids, torch::Tensor(), false, attention_mask);
  model->take_router_logits();  // transformers' sequence classifiers add no auxiliary loss
  return score(states_at(hidden, pooled_positions(input_ids)));
}

LOOM_INLINE SequenceClassifierOutput LlamaForSequenceClassificationImpl::forward(const data::SequenceBatch& batch) {
  SequenceClassifierOutput out;
  out.logits = logits(batch.input_ids, batch.attention_mask);
  if (batch.labels.defined())
    out.loss = sequence_classification_loss(config_.problem_type, config_.num_labels, out.logits, batch.labels,
                                            architecture_name());
  return out;
}

LOOM_INLINE std::string_view LlamaForSequenceClassificationImpl::architecture_name() const {
  return llama_family(config_).sequence_classification;
}

LOOM_INLINE HfNameRules LlamaForSequenceClassificationImpl::name_rules() const {
  return HfNameRules{.base_prefix = "model", .derived = {}, .ignored_suffixes = {"lm_head.weight"},
                     .may_be_new = {"score.weight"}};
}

}  // namespace loom::models
