#pragma once
// LoRA (Hu et al., 2021) as PEFT computes and stores it: a frozen base layer W and a trainable
// low-rank update, y = W x + B(A(dropout(x))) * scaling, scaling = lora_alpha / r (or
// lora_alpha / sqrt(r) with use_rslora), A initialized as torch's Linear (Kaiming uniform),
// B at zero. It works on any module built from AdaptableLinear layers (every loom model family's
// projections), which is why it sits below accelerate/ and models/: the Accelerator and the
// Trainer see a model's adapter and save it, load it and merge it as HF's Trainer does with a
// PeftModel.
//
//   loom::peft::LoraConfig lora;  lora.r = 16;  lora.lora_alpha = 32;  lora.target_modules = {"q_proj", "v_proj"};
//   loom::peft::apply_lora(*model, lora);          // adapters on, everything else frozen
//   ... train (the Trainer saves adapter files in its checkpoints and in save_model) ...
//   loom::peft::save_adapter(*model, "out");       // adapter_config.json + adapter_model.safetensors (PEFT's)
//   loom::peft::load_adapter(*model, "peft-adapter");  // one PEFT saved, onto the same base
//   loom::peft::merge_and_unload(*model);          // W += B A * scaling; a plain model again
//
// Parameter names stay the model's (q_proj.weight); an adapter adds q_proj.lora_A.weight and
// q_proj.lora_B.weight, which are PEFT's adapter-file names after its "base_model.model."
// prefix. target_modules matches as PEFT does: each name equals a module's name or ends it
// after a dot ("all-linear": every adaptable layer), or target_regex fully matches the
// module's name. modules_to_save names modules (matched the same way) that are trained whole
// and stored in the adapter file under their own names, as PEFT stores them. With task_type
// "SEQ_CLS" the classification head is one of them, as PeftModelForSequenceClassification
// makes it: "classifier" or "score", whichever the model has (BERT's classifier, saved as
// base_model.model.classifier.weight and .bias). No adapter goes inside a module to save:
// all-linear and a SEQ_CLS head pass over it, as PEFT does.
//
// apply_lora records its config in every layer it adapts, so a model carries its adapter's
// description: adapter_config(model) reads it back, and save_adapter needs nothing else.

#include <loom/config/inline.hpp>
#include <loom/core/deferred.hpp>
#include <loom/peft/bnb4.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::peft {

/// PEFT's file names inside an adapter folder.
inline constexpr std::string_view adapter_config_file = "adapter_config.json";
inline constexpr std::string_view adapter_weights_file = "adapter_model.safetensors";

/// PEFT's LoraConfig, the fields loom implements (adapter_config.json's names).
struct LoraConfig {
  int64_t r = 8;                                 ///< rank of the update
  double lora_alpha = 8;                         ///< scaling numerator
  double lora_dropout = 0.0;                     ///< dropout on the adapter's input (training)
  std::vector<std::string> target_modules;       ///< module names, matched as suffixes after a dot; "all-linear"
  std::optional<std::string> target_regex;       ///< or: a regex that fully matches a module's name
  std::vector<std::string> modules_to_save;      ///< modules trained whole and saved with the adapter
  std::string bias = "none";                     ///< only "none": no bias is trained
  bool use_rslora = false;                       ///< scaling lora_alpha / sqrt(r)
  std::string task_type = "CAUSAL_LM";           ///< written to adapter_config.json; SEQ_CLS also saves the head
  std::optional<std::string> base_model_name_or_path;  ///< written to adapter_config.json

  /// The factor of the update: lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
  [[nodiscard]] double scaling() const;
};

/// Checks `config` (r > 0, dropout in [0, 1), bias none, a target); errors name `where`.
LOOM_INLINE void validate(const LoraConfig& config, std::string_view where);

class HiddenAdapters;

/// A linear layer (weight [out, in], optional bias: torch's Linear, HF's names; or with
/// fan_in_fan_out the weight stored [in, out], HF's Conv1D) that can carry a LoRA adapter:
/// lora_A [r, in] and lora_B [out, r], registered beside weight and bias. Built with zero
/// weights: the model holding it draws them (init_weights).
///
/// Its base weight can be made 4-bit (quantize_4bit: bitsandbytes' Linear4bit, QLoRA's base):
/// the 4-bit state ([out, in], whatever the layout) replaces the weight's values, the `weight`
/// parameter stays registered but empty (0 values, frozen), and the forward computes as
/// Linear4bit does, in the compute dtype. The 4-bit state is the layer's ModuleState: a weight
/// without memory (loom::DeferredInit) is quantized when it is materialized, and FullShard
/// shards the state with the layer's unit.
class AdaptableLinearImpl : public torch::nn::Module, public ModuleState {
 public:
  LOOM_INLINE AdaptableLinearImpl(int64_t in_features, int64_t out_features, bool bias, bool fan_in_fan_out = false);
  LOOM_INLINE torch::Tensor forward(const torch::Tensor& x);
  [[nodiscard]] int64_t in_features() const { return in_features_; }
  [[nodiscard]] int64_t out_features() const { return out_features_; }
  /// Replaces the base weight by bitsandbytes' 4-bit form of it (quant type, double
  /// quantization of the absmaxes, the dtype the forward computes in). The layer must carry
  /// no adapter yet (QLoRA quantizes the base first, as transformers' from_pretrained does).
  /// A weight without memory (built under loom::DeferredInit) is quantized later, when its
  /// values are materialized (materialize_state): until then the 4-bit tensors hold no memory.
  LOOM_INLINE void quantize_4bit(Bnb4Type type, bool nested, torch::ScalarType compute_dtype);
  // ---- ModuleState: the 4-bit tensors (packed codes, absmax, then nested absmax and offset when
  // double-quantized); none when the layer is not 4-bit.
  [[nodiscard]] LOOM_INLINE std::vector<torch::Tensor> state_tensors() const override;
  LOOM_INLINE void materialize_state(const DeferredValues& values, const std::string& prefix) override;
  LOOM_INLINE void set_state_tensors(const std::vector<torch::Tensor>& tensors) override;
  /// Not materialized yet: the whole weight in its dtype and quantize_4bit's float32 scratch
  /// (the scaled values and their code indices), about weight + 8 bytes a value.
  [[nodiscard]] LOOM_INLINE double materialize_bytes() const override;
  [[nodiscard]] bool quantized() const { return quantized_.has_value(); }
  /// The 4-bit state (quantized() only).
  [[nodiscard]] LOOM_INLINE const Bnb4Weight& quantized_weight() const;
  [[nodiscard]] torch::ScalarType compute_dtype() const { return compute_dtype_; }
  /// The base weight's values in `dtype`, [out, in] (dequantized when 4-bit).
  [[nodiscard]] LOOM_INLINE torch::Tensor base_weight(torch::ScalarType dtype) const;
  // Moving the layer moves its 4-bit state too (the state is not a registered tensor).
  using torch::nn::Module::to;
  LOOM_INLINE void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  LOOM_INLINE void to(torch::Device device, bool non_blocking = false) override;
  /// Adds the adapter `config` describes (A drawn from torch's default generator, B zero); the
  /// layer keeps `config` (adapter_config reads it).
  LOOM_INLINE void add_adapter(std::shared_ptr<const LoraConfig> config);
  /// W += B A * scaling, then the adapter is removed. A 4-bit base is dequantized, summed and
  /// quantized again with its options, as PEFT merges into bitsandbytes' Linear4bit.
  LOOM_INLINE void merge_adapter();
  /// B A * scaling in the weight's layout ([out, in], or [in, out] with fan_in_fan_out).
  [[nodiscard]] LOOM_INLINE torch::Tensor delta_weight() const;
  /// The weight merge_and_unload leaves, without changing the layer: W + B A * scaling in the
  /// weight's layout and dtype (W alone without an adapter); a 4-bit base dequantized to
  /// float32 and the update added in float32 (a float weight, as PEFT's merge dequantizes).
  [[nodiscard]] LOOM_INLINE torch::Tensor merged_weight() const;
  /// The shape of the base weight as registered ([out, in], or [in, out] with fan_in_fan_out),
  /// also when it is 4-bit and the parameter is empty.
  [[nodiscard]] std::vector<int64_t> weight_shape() const {
    return fan_in_fan_out_ ? std::vector<int64_t>{in_features_, out_features_} : std::vector<int64_t>{out_features_, in_features_};
  }
  [[nodiscard]] bool has_adapter() const { return !lora_A.is_empty(); }
  [[nodiscard]] bool fan_in_fan_out() const { return fan_in_fan_out_; }
  /// The config of the adapter this layer carries (null without one).
  [[nodiscard]] const std::shared_ptr<const LoraConfig>& lora_config() const { return config_; }
  /// The dropout on the adapter's input in training (the config's lora_dropout until set):
  /// TRL's disable_dropout sets it to 0, as it zeroes PEFT's lora_dropout modules.
  [[nodiscard]] double lora_dropout() const { return dropout_; }
  void set_lora_dropout(double p) { dropout_ = p; }

  torch::Tensor weight, bias;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  ///< the adapter (no bias), when added

 private:
  friend class HiddenAdapters;  // hides an adapter and puts it back
  bool fan_in_fan_out_ = false;
  int64_t in_features_ = 0, out_features_ = 0;
  std::optional<Bnb4Weight> quantized_;
  torch::ScalarType compute_dtype_ = torch::kFloat;
  double scaling_ = 1.0, dropout_ = 0.0;
  std::shared_ptr<const LoraConfig> config_;
  // A 4-bit layer's dequantized base plus its update (if any), float32, [out, in].
  [[nodiscard]] LOOM_INLINE torch::Tensor merged_4bit_out_in() const;
};
TORCH_MODULE(AdaptableLinear);

/// Each AdaptableLinear of `model` once, with its (first) module name, in module order.
[[nodiscard]] LOOM_INLINE std::vector<std::pair<std::string, AdaptableLinearImpl*>> adaptable_layers(
    const torch::nn::Module& model);
/// Whether the parameter named `name` in the model is an adapter's (<layer>.lora_A.weight,
/// <layer>.lora_B.weight).
[[nodiscard]] LOOM_INLINE bool is_lora_parameter(const std::string& name);

/// Adds an adapter to every AdaptableLinear of `model` that `config` targets, freezes every
/// other parameter except those of the modules to save (config.modules_to_save and, with
/// task_type SEQ_CLS, the model's classifier or score, which the layers' config then lists);
/// returns how many layers got one.
/// A target or module to save that matches no module, a module that cannot carry an adapter,
/// and a model that already carries one are loom::Errors.
LOOM_INLINE int apply_lora(torch::nn::Module& model, const LoraConfig& config);

/// bitsandbytes' 4-bit options of a base (transformers' BitsAndBytesConfig with load_in_4bit).
struct Bnb4Config {
  Bnb4Type quant_type = Bnb4Type::nf4;             ///< bnb_4bit_quant_type
  bool use_double_quant = false;                   ///< bnb_4bit_use_double_quant (TRL: use_bnb_nested_quant)
  torch::ScalarType compute_dtype = torch::kFloat;  ///< bnb_4bit_compute_dtype
};

/// Makes the base of `model` 4-bit as transformers' from_pretrained does with
/// BitsAndBytesConfig(load_in_4bit=True): every AdaptableLinear except the module of the
/// model's last parameter (the output layer, which transformers keeps in full precision) and
/// those in `skip`; returns how many layers it quantized. Call it before the adapter goes on
/// (a model carrying one is a loom::Error).
LOOM_INLINE int quantize_base_4bit(torch::nn::Module& model, const Bnb4Config& config,
                                   const std::vector<std::string>& skip = {});

/// The 4-bit layers of `model`: how many, the values their weights hold, and their bytes.
struct QuantizedBase {
  int layers = 0;
  int64_t values = 0;
  int64_t bytes = 0;
};
[[nodiscard]] LOOM_INLINE QuantizedBase quantized_base(const torch::nn::Module& model);

/// The config of the adapter `model` carries (what apply_lora or load_adapter put on it);
/// none when it carries none.
[[nodiscard]] LOOM_INLINE std::optional<LoraConfig> adapter_config(const torch::nn::Module& model);

/// What an adapter file holds for `model`, by PEFT's key names
/// (base_model.model.<layer>.lora_A.weight / lora_B.weight, base_model.model.<module to
/// save>.<param>), each paired with the model's own tensor (not copied).
[[nodiscard]] LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> adapter_tensors(
    const torch::nn::Module& model);

/// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors as PEFT's
/// save_pretrained does, from the adapter `model` carries.
LOOM_INLINE void save_adapter(const torch::nn::Module& model, const std::filesystem::path& dir);

/// Reads a PEFT adapter folder onto `model` (apply_lora with its config, then its weights,
/// strictly: a missing, extra or differently shaped tensor is a loom::Error naming it).
LOOM_INLINE LoraConfig load_adapter(torch::nn::Module& model, const std::filesystem::path& dir);

/// Reads `dir`/adapter_model.safetensors into the adapter `model` already carries (a
/// checkpoint's adapter on resume), strictly as load_adapter.
LOOM_INLINE void load_adapter_weights(torch::nn::Module& model, const std::filesystem::path& dir);

/// PEFT's merge_and_unload: every adapter merged into its base weight and removed; every
/// parameter trainable again.
LOOM_INLINE void merge_and_unload(torch::nn::Module& model);

/// While it lives, every adapter of `model` is out of the module tree, so the model's
/// parameters are a plain model's base weights, as they are (reading base weights into an
/// adapted model). Its destructor puts the same adapter modules back.
class HiddenAdapters {
 public:
  LOOM_INLINE explicit HiddenAdapters(torch::nn::Module& model);
  LOOM_INLINE ~HiddenAdapters();
  HiddenAdapters(const HiddenAdapters&) = delete;
  HiddenAdapters& operator=(const HiddenAdapters&) = delete;

 private:
  struct Held {
    AdaptableLinearImpl* layer;
    torch::nn::Linear a, b;
    std::shared_ptr<const LoraConfig> config;
  };
  std::vector<Held> held_;
};

namespace detail {
/// Whether this thread's forwards run without their adapters (DisabledAdapters).
[[nodiscard]] inline bool& adapters_disabled() {
  thread_local bool disabled = false;
  return disabled;
}
}  // namespace detail

/// While it lives, the LoRA adapters are off in this thread's forwards (PEFT's
/// disable_adapter()): each adapted layer computes with its base weight alone. The module tree,
/// the parameters and the adapters stay as they are, so a sharding engine sees the same model;
/// DPO's reference model is the base this way, without a second copy. Scopes nest.
class DisabledAdapters {
 public:
  DisabledAdapters() : before_(std::exchange(detail::adapters_disabled(), true)) {}
  ~DisabledAdapters() { detail::adapters_disabled() = before_; }
  DisabledAdapters(const DisabledAdapters&) = delete;
  DisabledAdapters& operator=(const DisabledAdapters&) = delete;

 private:
  bool before_;
};

/// adapter_config.json's fields as a LoraConfig (PEFT's keys; those loom does not implement
/// must hold their defaults); errors name `where`.
LOOM_INLINE LoraConfig lora_config_from_json(const nlohmann::json& j, std::string_view where);

/// PEFT's adapter_config.json for `config` (fan_in_fan_out as the model's adapted layers are).
[[nodiscard]] LOOM_INLINE nlohmann::ordered_json lora_config_to_json(const LoraConfig& config, bool fan_in_fan_out);

}  // namespace loom::peft

#if defined(LOOM_HEADER_ONLY)
#include <loom/peft/impl/lora.ipp>
#endif
