#pragma once
// LoraArguments: the command-line face of LoRA, TRL's ModelConfig flags (--use_peft,
// --lora_r, --lora_alpha, --lora_dropout, --lora_target_modules, --lora_modules_to_save,
// --use_rslora, --lora_task_type) with TRL's defaults, plus --lora_config (an
// adapter_config.json that gives the whole config) and --lora_adapter (a PEFT adapter folder
// to go on training); and TRL's quantization flags for QLoRA (--load_in_4bit,
// --bnb_4bit_quant_type, --use_bnb_nested_quant, with --bnb_4bit_compute_dtype), which make the
// base bitsandbytes' 4-bit before the adapter goes on (peft/bnb4.hpp). A program parses them beside TrainingArguments and hands the model to
// prepare_lora:
//
//   auto [lora_args, args] = loom::parse_args(argc, argv, loom::peft::LoraArguments{}, loom::TrainingArguments{});
//   auto model = ...;                                            // the base, loaded or built
//   loom::peft::prepare_lora(*model, lora_args, "llama");        // adapters on, base frozen (if asked)
//
// Without a target, the targets are PEFT's defaults for the model type
// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q_proj and v_proj for the Llama
// family, c_attn for GPT-2, query and value for BERT).

#include <loom/config/field_help.hpp>
#include <loom/config/given_flags.hpp>
#include <loom/config/inline.hpp>
#include <loom/peft/lora.hpp>

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::peft {

/// TRL's LoRA flags (ModelConfig), with its defaults, and loom's two folder flags.
struct LoraArguments {
  bool use_peft = false;                             ///< train a LoRA adapter; the base model stays frozen
  int64_t lora_r = 16;                               ///< rank of the update
  double lora_alpha = 32;                            ///< scaling numerator (scaling = alpha / r)
  double lora_dropout = 0.05;                        ///< dropout on the adapter's input
  std::optional<std::string> lora_target_modules;    ///< comma-separated module names, or all-linear
  std::optional<std::string> lora_target_regex;      ///< instead: a regex matching whole module names
  std::optional<std::string> lora_modules_to_save;   ///< comma-separated modules trained whole and saved with the adapter
  bool use_rslora = false;                           ///< scaling alpha / sqrt(r)
  std::string lora_task_type = "CAUSAL_LM";          ///< adapter_config.json's task_type
  std::optional<std::string> lora_config;            ///< an adapter_config.json giving the whole config
  std::optional<std::string> lora_adapter;           ///< a PEFT adapter folder to go on training
  bool lora_save_merged = false;                     ///< also write the merged model to <output_dir>/merged
  bool load_in_4bit = false;                         ///< QLoRA: the base's linear layers in bitsandbytes' 4-bit format
  bool load_in_8bit = false;                         ///< (TRL's flag; refused: LLM.int8 is not implemented)
  std::string bnb_4bit_quant_type = "nf4";           ///< nf4 or fp4
  bool use_bnb_nested_quant = false;                 ///< double quantization of the 4-bit absmaxes
  std::string bnb_4bit_compute_dtype = "float32";    ///< dtype the 4-bit layers compute in
  GivenFlags given;                                  ///< the settings given (parse_args records them), not a flag

  static constexpr loom::FieldHelp field_help[] = {
      {"use_peft", "train a LoRA adapter; the base model stays frozen (TRL's flag)"},
      {"lora_r", "LoRA rank r"},
      {"lora_alpha", "LoRA alpha: the update is scaled by alpha / r"},
      {"lora_dropout", "dropout on the adapter's input while training"},
      {"lora_target_modules", "comma-separated module names (matched as PEFT does), or all-linear; default: PEFT's for the model type"},
      {"lora_target_regex", "instead of names: a regex that matches whole module names"},
      {"lora_modules_to_save", "comma-separated modules trained whole and saved with the adapter (a classifier head)"},
      {"use_rslora", "rank-stabilized LoRA: scale by alpha / sqrt(r)"},
      {"lora_task_type", "task_type written to adapter_config.json (CAUSAL_LM, SEQ_CLS, ...)"},
      {"lora_config", "an adapter_config.json (PEFT's) giving the whole LoRA config instead of the --lora_* flags"},
      {"lora_adapter", "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) to go on training"},
      {"lora_save_merged", "after training, also write the merged model (a plain HF folder) to <output_dir>/merged"},
      {"load_in_4bit", "QLoRA: the base's linear layers in bitsandbytes' 4-bit format (blocks of 64, an absmax each), "
                       "frozen under the adapter (TRL's flag; needs --use_peft)"},
      {"load_in_8bit", "TRL's 8-bit base (LLM.int8); not implemented, refused: use --load_in_4bit"},
      {"bnb_4bit_quant_type", "with --load_in_4bit: nf4 (NormalFloat) or fp4"},
      {"use_bnb_nested_quant", "with --load_in_4bit: quantize the absmaxes again in 8 bits (double quantization)"},
      {"bnb_4bit_compute_dtype", "with --load_in_4bit: the dtype the 4-bit layers compute in: float32, bfloat16 or float16"},
  };
  static constexpr std::string_view help_heading = "LoRA (PEFT)";
};

/// The 4-bit options the flags give (--bnb_4bit_quant_type, --use_bnb_nested_quant,
/// --bnb_4bit_compute_dtype); none without --load_in_4bit. Out-of-range values, and the
/// options without --load_in_4bit, are loom::Errors naming the flags.
[[nodiscard]] LOOM_INLINE std::optional<Bnb4Config> bnb4_config_from_args(const LoraArguments& args);

/// PEFT's default target modules for an HF model_type (none for a type it has no entry for).
[[nodiscard]] LOOM_INLINE std::vector<std::string> default_target_modules(std::string_view model_type);

/// The LoraConfig the flags describe (none without --use_peft, --lora_config or
/// --lora_adapter); `model_type` picks the default targets. Conflicting or out-of-range flags
/// are loom::Errors naming them.
[[nodiscard]] LOOM_INLINE std::optional<LoraConfig> lora_config_from_args(const LoraArguments& args,
                                                                        std::string_view model_type);

/// Puts the adapter the flags ask for on `model` (apply_lora, or load_adapter for
/// --lora_adapter), after making the base 4-bit with --load_in_4bit (quantize_base_4bit);
/// returns its config, or none when the flags ask for no adapter.
/// `base_model_name_or_path`, when given, is recorded in the adapter's config (PEFT writes it
/// to adapter_config.json: the folder the adapter goes onto).
LOOM_INLINE std::optional<LoraConfig> prepare_lora(torch::nn::Module& model, const LoraArguments& args,
                                                   std::string_view model_type,
                                                   std::optional<std::string> base_model_name_or_path = {});

}  // namespace loom::peft

#if defined(LOOM_HEADER_ONLY)
#include <loom/peft/impl/lora_arguments.ipp>
#endif
