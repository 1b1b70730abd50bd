#pragma once
// Definitions of peft/lora_arguments.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/core/error.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace loom::peft {

namespace detail {
// "a, b,c" -> {"a", "b", "c"}; an empty item is an error naming `flag`.
inline std::vector<std::string> split_names(const std::string& text, std::string_view flag) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    check(!item.empty(), "--{} \"{}\" holds an empty module name", flag, text);
    out.push_back(item);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}
}  // namespace detail

LOOM_INLINE std::vector<std::string> default_target_modules(std::string_view model_type) {
  // PEFT's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING, for the families loom has.
  static const std::map<std::string, std::vector<std::string>, std::less<>> defaults{
      {"llama", {"q_proj", "v_proj"}}, {"qwen2", {"q_proj", "v_proj"}}, {"qwen3", {"q_proj", "v_proj"}},
      {"mistral", {"q_proj", "v_proj"}}, {"gemma", {"q_proj", "v_proj"}}, {"gemma2", {"q_proj", "v_proj"}},
      {"gemma3_text", {"q_proj", "v_proj"}}, {"mixtral", {"q_proj", "v_proj"}}, {"gpt2", {"c_attn"}},
      {"bert", {"query", "value"}}};
  const auto it = defaults.find(model_type);
  return it == defaults.end() ? std::vector<std::string>{} : it->second;
}

LOOM_INLINE std::optional<LoraConfig> lora_config_from_args(const LoraArguments& args, std::string_view model_type) {
  const LoraArguments defaults;
  const bool flags_given = args.lora_r != defaults.lora_r || args.lora_alpha != defaults.lora_alpha ||
                           args.lora_dropout != defaults.lora_dropout || args.lora_target_modules ||
                           args.lora_target_regex || args.lora_modules_to_save || args.use_rslora ||
                           args.lora_task_type != defaults.lora_task_type;
  check(!(args.lora_config && args.lora_adapter),
        "--lora_config and --lora_adapter both give the LoRA config; give one (an adapter folder holds its own)");
  if (args.lora_config || args.lora_adapter) {
    const std::string which = args.lora_config ? "--lora_config" : "--lora_adapter";
    check(!flags_given, "{} gives the whole LoRA config; leave out the --lora_* flags (or drop {})", which, which);
    std::filesystem::path file;
    if (args.lora_config) {
      check_path(*args.lora_config, PathKind::file, "--lora_config");
      file = *args.lora_config;
    } else {
      check_path(*args.lora_adapter, PathKind::folder, "--lora_adapter");
      file = std::filesystem::path(*args.lora_adapter) / adapter_config_file;
      check_path(file, PathKind::file, "--lora_adapter (a PEFT adapter folder holds adapter_config.json)");
    }
    const auto j = json::read_file(file);
    auto config = lora_config_from_json(j, file.string());
    // A new adapter (--lora_config) starts as PEFT's default does: A random, B zero.
    if (args.lora_config && j.is_object() && j.contains("init_lora_weights")) {
      const auto& init = j["init_lora_weights"];
      check(init.is_null() || init == true,
            "{}: init_lora_weights is {}; loom makes a new adapter as PEFT's default does (true: lora_A "
            "Kaiming-uniform, lora_B zero), so the adapter starts as a no-op; drop the field or set it to true",
            file.string(), init.dump());
    }
    return config;
  }
  if (!args.use_peft) {
    check(!flags_given, "--lora_* flags are given without --use_peft; add --use_peft to train a LoRA adapter");
    check(!args.lora_save_merged, "--lora_save_merged merges a LoRA adapter, and without --use_peft (or --lora_config, "
          "--lora_adapter) there is none; add --use_peft, or drop --lora_save_merged");
    return std::nullopt;
  }
  check(!(args.lora_target_modules && args.lora_target_regex),
        "--lora_target_modules and --lora_target_regex both choose the targets; give one");
  LoraConfig c;
  c.r = args.lora_r;
  c.lora_alpha = args.lora_alpha;
  c.lora_dropout = args.lora_dropout;
  c.use_rslora = args.use_rslora;
  c.task_type = args.lora_task_type;
  if (args.lora_target_regex) c.target_regex = *args.lora_target_regex;
  else if (args.lora_target_modules) c.target_modules = detail::split_names(*args.lora_target_modules, "lora_target_modules");
  else c.target_modules = default_target_modules(model_type);
  check(!c.target_modules.empty() || c.target_regex,
        "--use_peft: PEFT has no default target modules for model type \"{}\"; give --lora_target_modules "
        "(names of the model's linear modules, as PEFT then asks for, or all-linear)",
        model_type);
  if (args.lora_modules_to_save)
    c.modules_to_save = detail::split_names(*args.lora_modules_to_save, "lora_modules_to_save");
  try {
    validate(c, "--use_peft");
  } catch (const Error& e) {  // name the flags, not the config's fields
    std::string what = e.what();
    for (const auto& [field, flag] : std::vector<std::pair<std::string, std::string>>{
             {"LoRA's r", "--lora_r"}, {"lora_alpha", "--lora_alpha"}, {"lora_dropout", "--lora_dropout"}})
      if (const auto at = what.find(field); at != std::string::npos) what.replace(at, field.size(), flag);
    throw Error(what);
  }
  return c;
}

LOOM_INLINE std::optional<Bnb4Config> bnb4_config_from_args(const LoraArguments& args) {
  const LoraArguments defaults;
  check(!args.load_in_8bit, "--load_in_8bit: loom has no 8-bit (LLM.int8) base; --load_in_4bit gives QLoRA's 4-bit one");
  if (!args.load_in_4bit) {
    for (const auto& [flag, given] : {std::pair{"bnb_4bit_quant_type", args.bnb_4bit_quant_type != defaults.bnb_4bit_quant_type},
                                      std::pair{"use_bnb_nested_quant", args.use_bnb_nested_quant},
                                      std::pair{"bnb_4bit_compute_dtype", args.bnb_4bit_compute_dtype != defaults.bnb_4bit_compute_dtype}})
      check(!given, "--{} sets up a 4-bit base, and without --load_in_4bit there is none; add --load_in_4bit or drop it", flag);
    return std::nullopt;
  }
  Bnb4Config c;
  c.quant_type = bnb4_type_from_name(args.bnb_4bit_quant_type, "--bnb_4bit_quant_type");
  c.use_double_quant = args.use_bnb_nested_quant;
  const auto& d = args.bnb_4bit_compute_dtype;
  if (d == "float32") c.compute_dtype = torch::kFloat;
  else if (d == "bfloat16") c.compute_dtype = torch::kBFloat16;
  else if (d == "float16") c.compute_dtype = torch::kHalf;
  else fail("--bnb_4bit_compute_dtype \"{}\" is not one the 4-bit layers compute in: float32, bfloat16 or float16", d);
  return c;
}

LOOM_INLINE std::optional<LoraConfig> prepare_lora(torch::nn::Module& model, const LoraArguments& args,
                                                   std::string_view model_type,
                                                   std::optional<std::string> base_model_name_or_path) {
  auto config = lora_config_from_args(args, model_type);
  const auto bnb4 = bnb4_config_from_args(args);
  check(!bnb4 || config.has_value(),
        "--load_in_4bit: a 4-bit base is frozen, so training it needs an adapter (QLoRA); add --use_peft, or drop "
        "--load_in_4bit to fine-tune the whole model");
  if (!config) return std::nullopt;
  if (base_model_name_or_path) config->base_model_name_or_path = std::move(base_model_name_or_path);
  if (bnb4) check(quantize_base_4bit(model, *bnb4) > 0, "--load_in_4bit: the model has no linear layer to make 4-bit");
  if (args.lora_adapter) {
    load_adapter(model, *args.lora_adapter);
    return adapter_config(model);
  }
  apply_lora(model, *config);
  return adapter_config(model);
}

}  // namespace loom::peft
