#pragma once
// Definitions of config/validate.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/json.hpp>
#include <loom/config/launcher_configs.hpp>
#include <loom/config/nearest.hpp>
#include <loom/config/optim_args.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/text.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/policy/catalog.hpp>
#include <loom/config/validate.hpp>

#include <boost/pfr.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom {

namespace detail {

LOOM_INLINE std::string flag(std::string_view name) { return "--" + std::string(name); }

LOOM_INLINE std::string num(double value) { return scalar_to_text(value); }

LOOM_INLINE void check_choice(std::string_view name, const std::string& value,
                              std::span<const std::string_view> choices) {
  for (std::string_view choice : choices)
    if (choice == value) return;
  std::string list;
  for (std::string_view choice : choices) {
    if (!list.empty()) list += '|';
    list += choice;
  }
  std::string message =
      "loom: " + flag(name) + " must be one of " + list + ", got '" + value + "'";
  const std::string suggestion = nearest_name(value, choices);
  if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
  throw Error(message);
}

LOOM_INLINE void check_positive(std::string_view name, double value) {
  if (!(value > 0)) throw Error("loom: " + flag(name) + " must be positive, got " + num(value));
}

LOOM_INLINE void check_non_negative(std::string_view name, double value) {
  if (!(value >= 0)) throw Error("loom: " + flag(name) + " must be >= 0, got " + num(value));
}

LOOM_INLINE void check_whole_above_one(std::string_view name, double value) {
  if (value > 1 && value != std::floor(value))
    throw Error("loom: " + flag(name) + " must be a whole number when above 1 (below 1 it is a fraction of "
                "the training steps), got " + num(value));
}

LOOM_INLINE std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view item = text.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) items.emplace_back(item);
    start = end + 1;
  }
  return items;
}

LOOM_INLINE std::vector<std::string> label_names_of(const TrainingArguments& args) {
  if (!args.label_names) return {"labels"};
  return split_list(*args.label_names);
}

LOOM_INLINE std::vector<std::string> wrap_classes_of(const TrainingArguments& args) {
  if (!args.fsdp_transformer_layer_cls_to_wrap) return {};
  return split_list(*args.fsdp_transformer_layer_cls_to_wrap);
}

LOOM_INLINE bool list_has(std::string_view list, std::string_view item) {
  for (const auto& i : split_list(list))
    if (i == item) return true;
  return false;
}

// Each item of the comma-separated `list` is one of `choices`; none is given twice.
LOOM_INLINE void check_list(std::string_view name, std::string_view list, std::span<const std::string_view> choices) {
  const auto items = split_list(list);
  for (std::size_t i = 0; i < items.size(); ++i) {
    check_choice(name, items[i], choices);
    for (std::size_t j = 0; j < i; ++j)
      if (items[j] == items[i]) throw Error("loom: " + flag(name) + " names '" + items[i] + "' twice");
  }
}

// Each precision policy selected by a flag names a bool field of TrainingArguments.
static_assert(
    [] {
      constexpr auto names = setting_names<TrainingArguments>();
      bool ok = true;
      for_each_member<PrecisionCatalog>([&]<class Tag>() {
        if constexpr (Tag::facts.has_flag) ok = ok && std::ranges::find(names, Tag::facts.name) != names.end();
      });
      return ok;
    }(),
    "loom: a precision policy's flag (PrecisionFacts::name with has_flag) must be a bool field of TrainingArguments");

// HF 5's names for gradient checkpointing win over the old ones when given.
LOOM_INLINE void move_activation_checkpointing(TrainingArguments& args) {
  if (args.activation_checkpointing) args.gradient_checkpointing = *args.activation_checkpointing;
  if (args.activation_checkpointing_kwargs) args.gradient_checkpointing_kwargs = args.activation_checkpointing_kwargs;
}

LOOM_INLINE bool* bool_field(TrainingArguments& args, std::string_view name) {
  bool* found = nullptr;
  constexpr auto names = setting_names<TrainingArguments>();
  for_each_setting(args, [&]<class F>(F& field, std::size_t index) {
    if constexpr (std::is_same_v<F, bool>)
      if (names[index] == name) found = &field;
  });
  return found;
}

LOOM_INLINE const bool* bool_field(const TrainingArguments& args, std::string_view name) {
  return bool_field(const_cast<TrainingArguments&>(args), name);
}

LOOM_INLINE std::vector<std::string_view> precision_flags_set(const TrainingArguments& args) {
  std::vector<std::string_view> set;
  for_each_member<PrecisionCatalog>([&]<class Tag>() {
    if constexpr (Tag::facts.has_flag) {
      const bool* flag = bool_field(args, Tag::facts.name);
      if (flag != nullptr && *flag) set.push_back(Tag::facts.name);
    }
  });
  return set;
}

LOOM_INLINE std::string_view precision_flag_chosen(const TrainingArguments& args) {
  const auto set = precision_flags_set(args);
  if (set.size() > 1)
    throw Error("loom: " + flag(set[0]) + " and " + flag(set[1]) + " are both set; choose one");
  return set.empty() ? std::string_view() : set[0];
}

LOOM_INLINE std::string_view precision_member_chosen(const TrainingArguments& args) {
  const std::string_view flag = precision_flag_chosen(args);
  return flag.empty() ? std::tuple_element_t<0, PrecisionCatalog>::facts.name : flag;
}

LOOM_INLINE bool is_multiple_of(double save, double eval) {
  const double ratio = save / eval;
  return std::fabs(ratio - std::round(ratio)) <= 1e-9 * std::max(1.0, std::fabs(ratio)) &&
         std::round(ratio) >= 1;
}

}  // namespace detail

LOOM_INLINE void validate(const TrainingArguments& args) {
  using namespace detail;

  // --- HF's command-line names that loom takes or refuses ----------------------------
  // --deepspeed / --fsdp: the flags they stand for, checked as finalize() will set them
  // (arguments read by apply_launcher_configs already are checked as they stand).
  if ((args.deepspeed || args.fsdp || args.fsdp_config) && !args.given.launcher_configs_applied()) {
    TrainingArguments applied = args;
    apply_launcher_configs(applied);
    validate(applied);
    return;
  }
  if (args.local_rank < -1)
    throw Error("loom: --local_rank must be -1 or a rank, got " + std::to_string(args.local_rank));
  // HF 4's names, which win over today's (HF 4 copied evaluation_strategy into
  // eval_strategy): the same checks on the arguments with them moved.
  if (args.evaluation_strategy || args.group_by_length || args.activation_checkpointing ||
      args.activation_checkpointing_kwargs) {
    TrainingArguments moved = args;
    detail::move_activation_checkpointing(moved);
    moved.activation_checkpointing.reset();
    moved.activation_checkpointing_kwargs.reset();
    if (args.evaluation_strategy) {
      check_choice("evaluation_strategy", *args.evaluation_strategy, kIntervalStrategies);
      moved.eval_strategy = *args.evaluation_strategy;
      moved.evaluation_strategy.reset();
    }
    if (args.group_by_length) {
      moved.train_sampling_strategy = "group_by_length";
      moved.group_by_length = false;
    }
    validate(moved);
    return;
  }

  // Every floating field must be finite (the CLI refuses nan/inf, code and JSON might not).
  constexpr auto names = setting_names<TrainingArguments>();
  for_each_setting(args, [&]<class F>(const F& field, std::size_t index) {
    if constexpr (std::is_same_v<F, double>) {
      if (!std::isfinite(field))
        throw Error("loom: " + flag(names[index]) + " must be a finite number, got " + num(field));
    } else if constexpr (std::is_same_v<F, std::optional<double>>) {
      if (field && !std::isfinite(*field))
        throw Error("loom: " + flag(names[index]) + " must be a finite number, got " + num(*field));
    }
  });

  if (args.fsdp_min_num_params < 0)
    throw Error("loom: --fsdp_min_num_params must be >= 0, got " + std::to_string(args.fsdp_min_num_params));
  if (args.fsdp_min_num_params > 0 && args.fsdp_transformer_layer_cls_to_wrap)
    throw Error("loom: --fsdp_min_num_params and --fsdp_transformer_layer_cls_to_wrap are mutually exclusive (HF's "
                "rule): wrap by size or by class");
  if (args.output_dir.empty()) throw Error("loom: --output_dir must not be empty");
  if (args.torch_empty_cache_steps && *args.torch_empty_cache_steps <= 0)
    throw Error("loom: --torch_empty_cache_steps must be a positive number of steps, got " +
                std::to_string(*args.torch_empty_cache_steps));
  if (!args.dataloader_in_order)
    throw Error("loom: --dataloader_in_order false (batches as soon as a worker has them) is not honoured: loom's "
                "workers hand batches over in sampler order, so that a run and its resume read the same batches");
  if (!args.eval_do_concat_batches)
    throw Error("loom: --eval_do_concat_batches false (a list of per-batch predictions) is not honoured: "
                "compute_metrics gets the batches concatenated; --batch_eval_metrics hands them over one batch at a "
                "time");

  // --- names ---------------------------------------------------------------------------
  check_choice("eval_strategy", args.eval_strategy, kIntervalStrategies);
  check_choice("logging_strategy", args.logging_strategy, kIntervalStrategies);
  check_choice("save_strategy", args.save_strategy, kSaveStrategies);
  check_choice("optim", args.optim, kOptimizers);
  (void)parse_optim_args(args.optim, args.optim_args.value_or(""));
  check_choice("sharding", args.sharding, kShardings);
  check_choice("sharding_param_dtype", args.sharding_param_dtype, kShardingDtypes);
  if (args.sharding_reduce_dtype) check_choice("sharding_reduce_dtype", *args.sharding_reduce_dtype, kShardingDtypes);
  if (args.train_sampling_strategy == "batch_rebalance")
    throw Error("loom: --train_sampling_strategy batch_rebalance is not supported; use random, sequential or "
                "group_by_length");
  check_choice("train_sampling_strategy", args.train_sampling_strategy, kSamplingStrategies);
  check_choice("include_num_input_tokens_seen",
               parse_bool(args.include_num_input_tokens_seen) ? std::string("no") : args.include_num_input_tokens_seen,
               kTokenCounts);
  check_list("include_for_metrics", args.include_for_metrics, kMetricsInputs);
  if (args.label_names) {
    const auto names = split_list(*args.label_names);
    for (std::size_t i = 0; i < names.size(); ++i)
      for (std::size_t j = 0; j < i; ++j)
        if (names[i] == names[j]) throw Error("loom: --label_names names '" + names[i] + "' twice");
  }
  for (const auto& item : split_list(args.report_to))
    if (std::ranges::find(kReportTo, item) == kReportTo.end())
      throw Error("loom: --report_to " + item + " is not built in; loom reports to tensorboard and jsonl (all: both, "
                  "none: neither)");
  check_list("report_to", args.report_to, kReportTo);
  if (split_list(args.report_to).size() > 1 && (list_has(args.report_to, "none") || list_has(args.report_to, "all")))
    throw Error("loom: --report_to " + args.report_to + ": none and all stand alone");
  check_choice("log_level", args.log_level, kLogLevels);
  check_choice("log_level_replica", args.log_level_replica, kLogLevels);
  if (args.resume_from_checkpoint && args.resume_from_checkpoint->empty())
    throw Error("loom: --resume_from_checkpoint must name a checkpoint folder, latest or true");
  check_choice("lr_scheduler_type", args.lr_scheduler_type, kLrSchedulerTypes);
  {
    // A syntax error gets the example below; valid JSON is then read strictly (a key given
    // twice is an error naming it).
    nlohmann::json kwargs;
    if (nlohmann::json::accept(args.lr_scheduler_kwargs))
      kwargs = json::parse(args.lr_scheduler_kwargs, "--lr_scheduler_kwargs");
    if (!kwargs.is_object())
      throw Error("loom: --lr_scheduler_kwargs must be a JSON object such as '{\"num_cycles\": 2}', got '" +
                  args.lr_scheduler_kwargs + "'");
  }

  if (args.gradient_checkpointing_kwargs) {
    const auto& text = *args.gradient_checkpointing_kwargs;
    const auto kwargs = nlohmann::json::accept(text) ? json::parse(text, "--gradient_checkpointing_kwargs") : nlohmann::json();
    if (!kwargs.is_object())
      throw Error("loom: --gradient_checkpointing_kwargs must be a JSON object such as '{\"use_reentrant\": false}', got '" +
                  text + "'");
    for (const auto& [key, value] : kwargs.items()) {
      if (key != "use_reentrant")
        throw Error("loom: --gradient_checkpointing_kwargs: '" + key + "' is not supported (loom takes use_reentrant only)");
      if (!value.is_boolean())
        throw Error("loom: --gradient_checkpointing_kwargs: use_reentrant must be true or false, got " + value.dump());
    }
  }

  // --- precision -----------------------------------------------------------------------
  if (const auto set = precision_flags_set(args); set.size() > 1)
    throw Error("loom: " + flag(set[0]) + " and " + flag(set[1]) + " cannot both be set; pick one");
  if (args.bf16_full_eval && args.fp16_full_eval)
    throw Error("loom: --bf16_full_eval and --fp16_full_eval cannot both be set; pick one");
  check_choice("loss_scale_rule", args.loss_scale_rule, kLossScaleRules);
  check_choice("fsdp_backward_prefetch", args.fsdp_backward_prefetch, kBackwardPrefetch);
  if (!(args.initial_loss_scale > 0 && std::isfinite(args.initial_loss_scale)))
    throw Error("loom: --initial_loss_scale must be a positive number, got " + num(args.initial_loss_scale));
  if (args.loss_scale_window && *args.loss_scale_window < 1)
    throw Error("loom: --loss_scale_window must be at least 1, got " + std::to_string(*args.loss_scale_window));
  if (args.loss_scale_hysteresis && *args.loss_scale_hysteresis < 1)
    throw Error("loom: --loss_scale_hysteresis must be at least 1, got " + std::to_string(*args.loss_scale_hysteresis));
  if (!(args.min_loss_scale > 0 && args.min_loss_scale <= args.initial_loss_scale))
    throw Error("loom: --min_loss_scale must be positive and at most --initial_loss_scale (" +
                num(args.initial_loss_scale) + "), got " + num(args.min_loss_scale));
  if (args.loss_scale_rule != kLossScaleRules[1])
    for (const char* name : {"loss_scale_hysteresis", "consecutive_hysteresis"})
      if (args.given.contains(name))
        throw Error("loom: " + flag(name) + " belongs to DeepSpeed's loss scale rule; add --loss_scale_rule deepspeed");
  if (!args.fp16)
    for (const char* name : {"loss_scale_rule", "initial_loss_scale", "loss_scale_window", "loss_scale_hysteresis",
                             "consecutive_hysteresis", "min_loss_scale"})
      if (args.given.contains(name)) throw Error("loom: " + flag(name) + " sets --fp16's loss scale; add --fp16");

  // --- batches -------------------------------------------------------------------------
  check_positive("per_device_train_batch_size", static_cast<double>(args.per_device_train_batch_size));
  check_positive("per_device_eval_batch_size", static_cast<double>(args.per_device_eval_batch_size));
  check_positive("gradient_accumulation_steps", static_cast<double>(args.gradient_accumulation_steps));
  if (args.eval_accumulation_steps)
    check_positive("eval_accumulation_steps", static_cast<double>(*args.eval_accumulation_steps));
  check_non_negative("dataloader_num_workers", static_cast<double>(args.dataloader_num_workers));
  // --- generation during evaluation (Seq2SeqTrainingArguments' flags) -------------------
  if (args.generation_max_length) check_positive("generation_max_length", static_cast<double>(*args.generation_max_length));
  if (args.generation_num_beams) {
    check_positive("generation_num_beams", static_cast<double>(*args.generation_num_beams));
    if (*args.generation_num_beams > 1)
      throw Error("loom: --generation_num_beams " + std::to_string(*args.generation_num_beams) +
                  ": beam search is not implemented; generation is greedy (1 beam)");
  }
  if ((args.generation_max_length || args.generation_num_beams) && !args.predict_with_generate)
    throw Error("loom: --generation_max_length / --generation_num_beams apply to --predict_with_generate, which is "
                "not set");
  if (args.dataloader_prefetch_factor) {
    // HF's rule: a prefetch depth means nothing when the loop reads its own batches.
    if (args.dataloader_num_workers == 0)
      throw Error("loom: --dataloader_prefetch_factor needs --dataloader_num_workers > 0 (batches are read in the "
                  "loop without workers)");
    check_positive("dataloader_prefetch_factor", static_cast<double>(*args.dataloader_prefetch_factor));
  }

  // --- optimizer -----------------------------------------------------------------------
  check_non_negative("learning_rate", args.learning_rate);
  check_non_negative("weight_decay", args.weight_decay);
  for (auto [name, beta] : {std::pair<std::string_view, double>{"adam_beta1", args.adam_beta1},
                            std::pair<std::string_view, double>{"adam_beta2", args.adam_beta2}})
    if (!(beta >= 0 && beta < 1)) throw Error("loom: " + flag(name) + " must be in [0, 1), got " + num(beta));
  check_positive("adam_epsilon", args.adam_epsilon);
  check_non_negative("max_grad_norm", args.max_grad_norm);
  if (!(args.label_smoothing_factor >= 0 && args.label_smoothing_factor <= 1))
    throw Error("loom: --label_smoothing_factor must be in [0, 1], got " + num(args.label_smoothing_factor));
  if (args.chunked_lm_loss.value_or(false) && args.label_smoothing_factor > 0)
    throw Error("loom: --chunked_lm_loss true cannot go with --label_smoothing_factor " +
                num(args.label_smoothing_factor) +
                ": label smoothing reads every position's logits, which the chunked loss never holds; drop one");
  if (args.neftune_noise_alpha && !(*args.neftune_noise_alpha > 0 && std::isfinite(*args.neftune_noise_alpha)))
    throw Error("loom: --neftune_noise_alpha must be a positive number (HF's papers use 5 to 15), got " +
                num(*args.neftune_noise_alpha));

  // --- length and schedule -------------------------------------------------------------
  if (args.max_steps <= 0 && !(args.num_train_epochs > 0))
    throw Error("loom: --num_train_epochs must be positive when --max_steps is not set (> 0), got " +
                num(args.num_train_epochs));
  if (!(args.warmup_ratio >= 0 && args.warmup_ratio <= 1))
    throw Error("loom: --warmup_ratio must be in [0, 1], got " + num(args.warmup_ratio));
  check_non_negative("warmup_steps", args.warmup_steps);
  if (args.warmup_ratio > 0 && args.warmup_steps > 0)
    throw Error("loom: --warmup_ratio and --warmup_steps cannot both be set; use one (warmup_steps below 1 "
                "is a fraction too)");
  if (schedule_steps_on_metric(args.lr_scheduler_type) && args.eval_strategy == "no")
    throw Error("loom: --lr_scheduler_type " + args.lr_scheduler_type + " needs evaluation; set --eval_strategy "
                "steps or epoch");

  // --- logging, evaluation and saving intervals ----------------------------------------
  if (args.run_name && (args.run_name->empty() || *args.run_name == "." || *args.run_name == ".." ||
                        args.run_name->find_first_of("/\\") != std::string::npos))
    throw Error("loom: --run_name names the run's TensorBoard folder, so it must be one folder name (no '/', not "
                "empty, '.' or '..'), got \"" + *args.run_name + "\"");
  if (args.logging_strategy == "steps") {
    check_positive("logging_steps", args.logging_steps);
    check_whole_above_one("logging_steps", args.logging_steps);
  }
  if (args.eval_steps) check_positive("eval_steps", *args.eval_steps);
  // What the evaluation interval will be once finalize() has run.
  const std::optional<double> eval_steps =
      args.eval_steps ? args.eval_steps
                      : (args.logging_steps > 0 ? std::optional<double>(args.logging_steps) : std::nullopt);
  if (args.eval_strategy == "steps") {
    if (!eval_steps)
      throw Error("loom: --eval_strategy steps needs a positive --eval_steps (or a positive --logging_steps "
                  "to default to)");
    check_whole_above_one("eval_steps", *eval_steps);
  }
  if (args.save_strategy == "steps") {
    check_positive("save_steps", args.save_steps);
    check_whole_above_one("save_steps", args.save_steps);
  }
  if (args.save_total_limit) check_positive("save_total_limit", static_cast<double>(*args.save_total_limit));
  check_non_negative("eval_delay", static_cast<double>(args.eval_delay));

  // --- best model ----------------------------------------------------------------------
  if (args.save_strategy == "best") {
    if (!args.metric_for_best_model)
      throw Error("loom: --save_strategy best needs --metric_for_best_model");
    if (args.eval_strategy == "no")
      throw Error("loom: --save_strategy best needs evaluation; set --eval_strategy steps or epoch");
  }
  if (args.load_best_model_at_end && args.save_strategy != "best") {
    if (args.eval_strategy != args.save_strategy)
      throw Error("loom: --load_best_model_at_end requires the save and eval strategy to match (or "
                  "--save_strategy best), got --eval_strategy " + args.eval_strategy + " and --save_strategy " +
                  args.save_strategy);
    if (args.eval_strategy == "steps") {
      const double eval = *eval_steps;
      const double save = args.save_steps;
      if ((eval < 1) != (save < 1))
        throw Error("loom: --load_best_model_at_end requires --save_steps to be a multiple of --eval_steps, "
                    "which cannot be guaranteed when mixing a fraction and a step count (--save_steps " +
                    num(save) + ", --eval_steps " + num(eval) + ")");
      if (!is_multiple_of(save, eval))
        throw Error("loom: --load_best_model_at_end requires --save_steps to be a multiple of --eval_steps, "
                    "got --save_steps " + num(save) + " and --eval_steps " + num(eval));
    }
  }

  // --- reproducibility and distributed -------------------------------------------------
  check_non_negative("seed", static_cast<double>(args.seed));
  if (args.data_seed) check_non_negative("data_seed", static_cast<double>(*args.data_seed));
  check_positive("ddp_timeout", static_cast<double>(args.ddp_timeout));
  if (args.ddp_bucket_cap_mb) check_positive("ddp_bucket_cap_mb", static_cast<double>(*args.ddp_bucket_cap_mb));
  // The offloaded shard is stepped where it lies, on the host: by the offloaded optimizer.
  if (args.offload_param && !args.offload_optimizer)
    throw Error("loom: --offload_param keeps the parameter shards in host memory, where only an offloaded optimizer "
                "can step them; add --offload_optimizer");
  if (args.max_memory) (void)detail::parse_byte_size(*args.max_memory, "--max_memory");
}

LOOM_INLINE void finalize(TrainingArguments& args) {
  apply_launcher_configs(args);  // --deepspeed / --fsdp onto the flags they stand for
  // HF 5's --activation_checkpointing(_kwargs) set the old names when given; then the old
  // names are mirrored into the new (TrainingArguments.__post_init__).
  detail::move_activation_checkpointing(args);
  args.activation_checkpointing = args.gradient_checkpointing;
  args.activation_checkpointing_kwargs = args.gradient_checkpointing_kwargs;
  // HF 4's names move to today's.
  if (args.evaluation_strategy) {
    args.eval_strategy = *args.evaluation_strategy;
    args.evaluation_strategy.reset();
  }
  if (args.group_by_length) args.train_sampling_strategy = "group_by_length";
  args.group_by_length = args.train_sampling_strategy == "group_by_length";
  // HF: a bool include_num_input_tokens_seen means all / no.
  if (const auto on = detail::parse_bool(args.include_num_input_tokens_seen))
    args.include_num_input_tokens_seen = *on ? "all" : "no";
  // --resume_from_checkpoint true: the last checkpoint in output_dir (HF's True); false: none.
  if (args.resume_from_checkpoint) {
    const std::string word = detail::ascii_lower(*args.resume_from_checkpoint);
    if (word == "true") args.resume_from_checkpoint = "latest";
    else if (word == "false") args.resume_from_checkpoint.reset();
  }
  // HF: evaluating during training implies do_eval.
  if (args.eval_strategy != "no") args.do_eval = true;
  // HF: eval_strategy "steps" without eval_steps evaluates every logging_steps. (HF also
  // treats eval_steps == 0 as unset; loom leaves 0 for validate() to reject.)
  if (args.eval_strategy == "steps" && !args.eval_steps && args.logging_steps > 0)
    args.eval_steps = args.logging_steps;
  // HF: picking the best checkpoint, or reducing on plateau, watches the loss by default.
  if ((args.load_best_model_at_end || schedule_steps_on_metric(args.lr_scheduler_type)) &&
      !args.metric_for_best_model)
    args.metric_for_best_model = "loss";
  // HF: a metric named *loss is minimized, anything else maximized.
  if (args.metric_for_best_model && !args.greater_is_better)
    args.greater_is_better = !std::string_view(*args.metric_for_best_model).ends_with("loss");
}

}  // namespace loom
