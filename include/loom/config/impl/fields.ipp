#pragma once
// Definitions of config/fields.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/fields.hpp>
#include <loom/config/nearest.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace loom::detail {

LOOM_INLINE const FieldInfo* find_field(const std::vector<FieldInfo>& table, std::string_view name) {
  for (const FieldInfo& info : table)
    if (info.name == name) return &info;
  return nullptr;
}

// transformers.TrainingArguments settings loom has no flag for: why, and the values (JSON text,
// HF's default first) that a JSON settings file may give them, because loom already does what
// they say there. A command line copied from a Python run gets the reason rather than a near
// name; tests/config/test_hf_settings.cpp holds this list to the pinned transformers' fields.
LOOM_INLINE const std::vector<ForeignSetting>& foreign_settings() {
  constexpr std::string_view compile =
      "it compiles a Python model with TorchDynamo, which libtorch does not have; loom::models choose fused kernels "
      "on CUDA themselves (models::Kernels)";
  constexpr std::string_view liger =
      "Liger's kernels are Triton code patched into Python models; loom::models choose fused kernels on CUDA "
      "themselves (models::Kernels), and Liger's fused linear cross-entropy is --chunked_lm_loss (on by default "
      "where it saves memory)";
  constexpr std::string_view hub =
      "loom does not upload to the Hugging Face Hub; the folders save_model and the checkpoints write open in "
      "transformers, and `hf upload` uploads them";
  constexpr std::string_view trackio = "Trackio is a Python logger; loom reports to tensorboard and jsonl (--report_to)";
  constexpr std::string_view loader =
      "loom's data-loader workers are threads of the training process (--dataloader_num_workers), not forked or "
      "spawned processes";
  static const std::vector<ForeignSetting> settings{
      {"torch_compile", {"false"}, compile},
      {"torch_compile_backend", {"null"}, compile},
      {"torch_compile_mode", {"null"}, compile},
      {"use_liger_kernel", {"false"}, liger},
      {"liger_kernel_config", {"null"}, liger},
      {"push_to_hub", {"false"}, hub},
      {"hub_model_id", {"null"}, hub},
      {"hub_strategy", {"\"every_save\""}, hub},
      {"hub_token", {"null", "\"<HUB_TOKEN>\""}, hub},  // to_json_string writes the placeholder for any token
      {"hub_private_repo", {"null"}, hub},
      {"hub_always_push", {"false"}, hub},
      {"hub_revision", {"null"}, hub},
      {"remove_unused_columns",
       {"true"},
       "it drops the dataset columns a Python model's forward does not take; a loom batch is a C++ struct, and a "
       "field compute_loss does not read is not read"},
      {"ddp_backend", {"null"}, "loom chooses the process group itself: NCCL for CUDA devices, Gloo for the CPU"},
      {"trackio_space_id", {"null"}, trackio},
      {"trackio_bucket_id", {"null"}, trackio},
      {"trackio_static_space_id", {"null"}, trackio},
      {"project", {"\"huggingface\""}, trackio},
      {"debug", {"[]", "\"\""}, "its detectors (underflow_overflow, tpu_metrics_debug) are not in loom"},
      {"optim_target_modules",
       {"null"},
       "it names the modules of GaLore and APOLLO, optimizers loom does not have (--optim lists loom's)"},
      {"eval_use_gather_object",
       {"false"},
       "it gathers Python objects across ranks; loom's predictions are tensors, gathered as tensors"},
      {"enable_jit_checkpoint",
       {"false", "true"},
       "loom always saves checkpoint-<step> on SIGTERM, SIGUSR1 and Ctrl-C during training, then exits with code "
       "75 (docs/semantics.md)"},
      {"accelerator_config",
       {"null", "{}",
        R"({"split_batches": false, "dispatch_batches": null, "even_batches": true, "use_seedable_sampler": true, )"
        R"("non_blocking": false, "gradient_accumulation_kwargs": null})"},
       "it configures Accelerate's data-loader wrapping, which loom does not use: each rank reads its own share of "
       "every batch from a seeded sampler, as Accelerate's defaults do"},
      {"parallelism_config",
       {"null"},
       "loom's parallelism is data parallel (--sharding ddp, zero1, zero2, full_shard); tensor, context and "
       "pipeline parallelism are not in loom"},
      {"dataloader_multiprocessing_context", {"null"}, loader},
  };
  return settings;
}

LOOM_INLINE const ForeignSetting* foreign_setting(std::string_view name) {
  for (const auto& setting : foreign_settings())
    if (setting.name == name) return &setting;
  return nullptr;
}

LOOM_INLINE std::optional<std::string_view> foreign_flag_reason(std::string_view name) {
  if (const ForeignSetting* setting = foreign_setting(name)) return setting->why;
  return std::nullopt;
}

LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table) {
  std::vector<std::string_view> names;
  names.reserve(table.size());
  for (const FieldInfo& info : table) names.push_back(info.name);
  return nearest_name(given, names);
}

}  // namespace loom::detail
