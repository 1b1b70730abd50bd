#pragma once
// LoraArguments: the command-line face of LoRA, TRL's ModelConfig flags (--use_peft,
// --lora_r, --lora_alpha, --lora_dropout, --lora_target_modules, --lora_modules_to_save,
// --use_rslora, --lora_task_type) with TRL's defaults, plus --lora_config (an
// adapter_config.json that gives the whole config) and --lora_adapter (a PEFT adapter folder
// to go on training). A program parses them beside TrainingArguments and hands the model to
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
  };
  static constexpr std::string_view help_heading = "LoRA (PEFT)";
};

/// PEFT's default target modules for an HF model_type (none for a type it has no entry for).
[[nodiscard]] LOOM_INLINE std::vector<std::string> default_target_modules(std::string_view model_type);

/// The LoraConfig the flags describe (none without --use_peft, --lora_config or
/// --lora_adapter); `model_type` picks the default targets. Conflicting or out-of-range flags
/// are loom::Errors naming them.
[[nodiscard]] LOOM_INLINE std::optional<LoraConfig> lora_config_from_args(const LoraArguments& args,
                                                                        std::string_view model_type);

/// Puts the adapter the flags ask for on `model` (apply_lora, or load_adapter for
/// --lora_adapter); returns its config, or none when the flags ask for no adapter.
/// `base_model_name_or_path`, when given, is recorded in the adapter's config (PEFT writes it
/// to adapter_config.json: the folder the adapter goes onto).
LOOM_INLINE std::optional<LoraConfig> prepare_lora(torch::nn::Module& model, const LoraArguments& args,
                                                   std::string_view model_type,
                                                   std::optional<std::string> base_model_name_or_path = {});

}  // namespace loom::peft

#if defined(LOOM_HEADER_ONLY)
#include <loom/peft/impl/lora_arguments.ipp>
#endif
