#pragma once
// Run-time checks and Hugging Face's post-init defaults for TrainingArguments.
// Intended order: parse (or load) -> finalize(args) -> validate(args). validate() also copes
// with arguments that were not finalized (it reads an unset eval_steps as logging_steps).

#include <loom/config/error.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/policy/catalog.hpp>

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

namespace detail {

// Accepted values of the string-valued choices. The optimizers, sharding policies and
// scheduler names are their catalogs' (policy/tags.hpp); --sharding also takes auto.
inline constexpr std::array<std::string_view, 3> kIntervalStrategies = {"no", "steps", "epoch"};
inline constexpr std::array<std::string_view, 4> kSaveStrategies = {"no", "steps", "epoch", "best"};
inline constexpr auto kOptimizers = catalog_names<OptimizerCatalog>;
/// --sharding's default: ddp when torchrun started several processes, else no (trainer/selector.hpp).
inline constexpr std::string_view kAutoSharding = "auto";
template <std::size_t N>
constexpr std::array<std::string_view, N + 1> with_auto(const std::array<std::string_view, N>& names) {
  std::array<std::string_view, N + 1> out{};
  for (std::size_t i = 0; i < N; ++i) out[i] = names[i];
  out[N] = kAutoSharding;
  return out;
}
inline constexpr auto kShardings = with_auto(catalog_names<ShardingCatalog>);
inline constexpr auto kShardingDtypes = catalog_names<ShardingDtypeCatalog>;
inline constexpr std::array<std::string_view, 3> kSamplingStrategies = {"random", "sequential", "group_by_length"};
inline constexpr std::array<std::string_view, 3> kTokenCounts = {"no", "all", "non_padding"};
inline constexpr std::array<std::string_view, 2> kMetricsInputs = {"inputs", "loss"};
inline constexpr std::array<std::string_view, 4> kReportTo = {"none", "all", "tensorboard", "jsonl"};
inline constexpr std::array<std::string_view, 6> kLogLevels = {"debug", "info", "warning", "error", "critical", "passive"};
/// --loss_scale_rule's values: torch.amp's GradScaler, DeepSpeed's DynamicLossScaler.
inline constexpr std::array<std::string_view, 2> kLossScaleRules = {"torch", "deepspeed"};
/// --fsdp_backward_prefetch's values, in dist::BackwardPrefetch's order (FSDP's names, lower case).
inline constexpr std::array<std::string_view, 3> kBackwardPrefetch = {"no_prefetch", "backward_pre", "backward_post"};
inline constexpr auto kLrSchedulerTypes = catalog_names<ScheduleCatalog>;

/// The bool field of `args` called `name` (a precision policy's flag); null when there is none.
LOOM_INLINE bool* bool_field(TrainingArguments& args, std::string_view name);
LOOM_INLINE const bool* bool_field(const TrainingArguments& args, std::string_view name);

/// The names of the precision flags set in `args` (--bf16, --fp16), in the catalog's order.
LOOM_INLINE std::vector<std::string_view> precision_flags_set(const TrainingArguments& args);

/// The one precision flag set in `args` ("" when none is); two set is a loom::Error ("--bf16
/// and --fp16 are both set; choose one"), as the selector and start-up say it.
LOOM_INLINE std::string_view precision_flag_chosen(const TrainingArguments& args);

/// The name of the PrecisionCatalog member `args` choose: the precision flag set, or the
/// catalog's first member (fp32) when none is (the selector, start-up and precision::FromArgs).
LOOM_INLINE std::string_view precision_member_chosen(const TrainingArguments& args);

/// "--<name>".
LOOM_INLINE std::string flag(std::string_view name);

/// `value` as --help shows it (5e-05, 0.9, 3).
LOOM_INLINE std::string num(double value);

/// Fails unless `value` is one of `choices`, listing them and the nearest one.
LOOM_INLINE void check_choice(std::string_view name, const std::string& value,
                              std::span<const std::string_view> choices);

/// Fails unless `value` > 0 (NaN fails too).
LOOM_INLINE void check_positive(std::string_view name, double value);

/// Fails unless `value` >= 0 (NaN fails too).
LOOM_INLINE void check_non_negative(std::string_view name, double value);

/// HF: a *_steps value above 1 counts steps and must be whole; below 1 it is a fraction.
LOOM_INLINE void check_whole_above_one(std::string_view name, double value);

/// The items of a comma-separated list, trimmed of spaces, empty ones dropped.
LOOM_INLINE std::vector<std::string> split_list(std::string_view text);

/// True when the comma-separated `list` holds `item`.
LOOM_INLINE bool list_has(std::string_view list, std::string_view item);

/// --label_names as a list (default: {"labels"}).
LOOM_INLINE std::vector<std::string> label_names_of(const TrainingArguments& args);

/// --fsdp_transformer_layer_cls_to_wrap as a list of block classes (none when unset).
LOOM_INLINE std::vector<std::string> wrap_classes_of(const TrainingArguments& args);

/// Fails unless each item of the comma-separated `list` is one of `choices`, none twice.
LOOM_INLINE void check_list(std::string_view name, std::string_view list, std::span<const std::string_view> choices);

/// True when `save` is a whole multiple of `eval` (both step counts, or both fractions).
LOOM_INLINE bool is_multiple_of(double save, double eval);

}  // namespace detail

/// Throws loom::Error (one line starting "loom: ", naming the flag) for the first invalid setting found.
LOOM_INLINE void validate(const TrainingArguments& args);

/// Applies HF's __post_init__ defaults (eval_steps, metric_for_best_model, greater_is_better, do_eval); idempotent.
LOOM_INLINE void finalize(TrainingArguments& args);

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/validate.ipp>
#endif
