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

// transformers.TrainingArguments flags loom does not take, and why: a command line copied from
// a Python run gets the reason rather than a near name.
struct ForeignFlag {
  std::vector<std::string_view> names;
  std::string_view why;
};
LOOM_INLINE const std::vector<ForeignFlag>& foreign_flags() {
  static const std::vector<ForeignFlag> flags{
      {{"torch_compile", "torch_compile_backend", "torch_compile_mode"},
       "it compiles a Python model with TorchDynamo, which libtorch does not have; loom::models choose fused kernels "
       "on CUDA themselves (models::Kernels)"},
      {{"use_liger_kernel", "liger_kernel_config"},
       "Liger's kernels are Triton code patched into Python models; loom::models choose fused kernels on CUDA "
       "themselves (models::Kernels)"},
      {{"push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
        "hub_revision"},
       "loom does not upload to the Hugging Face Hub; the folders save_model and the checkpoints write open in "
       "transformers, and `hf upload` uploads them"},
      {{"remove_unused_columns"},
       "it drops the dataset columns a Python model's forward does not take; a loom batch is a C++ struct, and a "
       "field compute_loss does not read is not read"},
      {{"ddp_backend"}, "loom chooses the process group itself: NCCL for CUDA devices, Gloo for the CPU"},
      {{"trackio_space_id", "trackio_bucket_id", "trackio_static_space_id", "project"},
       "Trackio is a Python logger; loom reports to tensorboard and jsonl (--report_to)"},
      {{"debug"}, "its detectors (underflow_overflow, tpu_metrics_debug) are not in loom"},
  };
  return flags;
}

LOOM_INLINE std::optional<std::string_view> foreign_flag_reason(std::string_view name) {
  for (const auto& flag : foreign_flags())
    for (const auto known : flag.names)
      if (name == known) return flag.why;
  return std::nullopt;
}

LOOM_INLINE std::string nearest_field(std::string_view given, const std::vector<FieldInfo>& table) {
  std::vector<std::string_view> names;
  names.reserve(table.size());
  for (const FieldInfo& info : table) names.push_back(info.name);
  return nearest_name(given, names);
}

}  // namespace loom::detail
