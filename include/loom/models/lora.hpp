#pragma once
// LoRA (Hu et al., 2021) as PEFT computes and stores it: a frozen base layer W and a trainable
// low-rank update, y = W x + B(A(dropout(x))) * scaling, scaling = lora_alpha / r (or
// lora_alpha / sqrt(r) with use_rslora), A initialized as torch's Linear (Kaiming uniform),
// B at zero.
//
//   loom::models::LoraConfig lora;  lora.r = 16;  lora.lora_alpha = 32;  lora.target_modules = {"q_proj", "v_proj"};
//   loom::models::apply_lora(*model, lora);          // adapters on, everything else frozen
//   ... train ...
//   loom::models::save_adapter(*model, lora, "out"); // adapter_config.json + adapter_model.safetensors (PEFT's)
//   loom::models::load_adapter(*model, "peft-adapter");  // one PEFT saved, onto the same base
//   loom::models::merge_and_unload(*model);          // W += B A * scaling; a plain model again
//
// The layers that can carry an adapter are the models' AdaptableLinear layers (the Llama
// architecture's projections). Their parameter names stay HF's (q_proj.weight); an adapter
// adds q_proj.lora_A.weight and q_proj.lora_B.weight, which are PEFT's adapter-file names
// after its "base_model.model." prefix. target_modules matches as PEFT does: each name equals
// a module's name or ends it after a dot, or target_regex fully matches the module's name.

#include <loom/config/inline.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace loom::models {

/// PEFT's LoraConfig, the fields loom implements (adapter_config.json's names).
struct LoraConfig {
  int64_t r = 8;                                 ///< rank of the update
  double lora_alpha = 8;                         ///< scaling numerator
  double lora_dropout = 0.0;                     ///< dropout on the adapter's input (training)
  std::vector<std::string> target_modules;       ///< module names, matched as suffixes after a dot
  std::optional<std::string> target_regex;       ///< or: a regex that fully matches a module's name
  std::string bias = "none";                     ///< only "none": no bias is trained
  bool use_rslora = false;                       ///< scaling lora_alpha / sqrt(r)
  std::string task_type = "CAUSAL_LM";           ///< written to adapter_config.json
  std::optional<std::string> base_model_name_or_path;  ///< written to adapter_config.json

  /// The factor of the update: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
  [[nodiscard]] double scaling() const;
};

/// Checks `config` (r > 0, dropout in [0, 1), bias none, a target); errors name `where`.
LOOM_INLINE void validate(const LoraConfig& config, std::string_view where);

/// A linear layer (weight [out, in], optional bias: torch's Linear, HF's names; or with
/// fan_in_fan_out the weight stored [in, out], HF's Conv1D) that can carry a LoRA adapter:
/// lora_A [r, in] and lora_B [out, r], registered beside weight and bias. Built with zero
/// weights: the model holding it draws them (init_weights).
class AdaptableLinearImpl : public torch::nn::Module {
 public:
  LOOM_INLINE AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool bias, bool fan_in_fan_out = false);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  /// Adds an adapter (A drawn from torch's default generator, B zero).
  LOOM_INLINE void add_adapter(int64_t r, double scaling, double dropout);
  /// W += B A * scaling, then the adapter is removed.
  LOOM_INLINE void merge_adapter();
  [[nodiscard]] bool has_adapter() const { return !lora_A.is_empty(); }
  [[nodiscard]] bool fan_in_fan_out() const { return fan_in_fan_out_; }

  torch::Tensor weight, bias;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  ///< the adapter (no bias), when added

 private:
  bool fan_in_fan_out_ = false;
  double scaling_ = 1.0, dropout_ = 0.0;
};
TORCH_MODULE(AdaptableLinear);

/// Adds an adapter to every AdaptableLinear of `model` that `config` targets and freezes every
/// other parameter; returns how many layers got one. A target that matches no module, or a
/// module that cannot carry an adapter, is a loom::Error.
LOOM_INLINE int apply_lora(torch::nn::Module& model, const LoraConfig& config);

/// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors as PEFT's
/// save_pretrained does (keys base_model.model.<name>.lora_A.weight / lora_B.weight).
LOOM_INLINE void save_adapter(const torch::nn::Module& model, const LoraConfig& config, const std::filesystem::path& dir);

/// Reads a PEFT adapter folder onto `model` (apply_lora with its config, then its weights,
/// strictly: a missing, extra or differently shaped tensor is a loom::Error naming it).
LOOM_INLINE LoraConfig load_adapter(torch::nn::Module& model, const std::filesystem::path& dir);

/// PEFT's merge_and_unload: every adapter merged into its base weight and removed; every
/// parameter trainable again.
LOOM_INLINE void merge_and_unload(torch::nn::Module& model);

/// adapter_config.json's fields as a LoraConfig (PEFT's keys; those loom does not implement
/// must hold their defaults); errors name `where`.
LOOM_INLINE LoraConfig lora_config_from_json(const nlohmann::json& j, std::string_view where);

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/lora.ipp>
#endif
