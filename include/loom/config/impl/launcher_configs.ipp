#pragma once
#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/config/launcher_configs.hpp>
#include <loom/config/validate.hpp>
#include <loom/config/text.hpp>
#include <loom/policy/catalog.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
namespace detail {

/// A config given as a flag: JSON text when it starts with '{', else a file to read.
LOOM_INLINE nlohmann::json launcher_config(const std::string& given, std::string_view flag) {
  const auto first = given.find_first_not_of(" \t\r\n");
  const bool text = first != std::string::npos && given[first] == '{';
  if (!text && !path_exists(given, PathKind::file, fmt::format("--{}", flag)))
    throw Error(fmt::format("loom: --{} {}: no such file (give a JSON file, or the JSON text itself)", flag, given));
  auto j = text ? json::parse(given, fmt::format("--{}", flag)) : json::read_file(given);
  if (!j.is_object()) throw Error(fmt::format("loom: --{} {}: the config is not a JSON object", flag, given));
  return j;
}

/// HF's "auto": the value comes from the flags.
inline bool is_auto(const nlohmann::json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

/// What one config says about the flags: the sharding it picks, and the keys whose values
/// disagree with the flags (listed together, as HF's DeepSpeed integration lists them).
class ConfigReading {
 public:
  ConfigReading(TrainingArguments& args, std::string where) : args_(args), where_(std::move(where)) {}

  /// `value` must be "auto" or equal `flag_value` (HF's fill_match).
  template <class T>
  void match(const nlohmann::json& value, std::string_view key, std::string_view flag, const T& flag_value) {
    if (is_auto(value)) return;
    bool same = false;
    if constexpr (std::is_same_v<T, bool>) same = value.is_boolean() && value.get<bool>() == flag_value;
    else same = value.is_number() && static_cast<double>(value.get<double>()) == static_cast<double>(flag_value);
    if (!same) mismatches_.push_back(fmt::format("{} is {} but --{} is {}", key, value.dump(), flag, flag_value));
  }
  /// A key loom does not honour: one line naming it.
  [[noreturn]] void refuse(std::string_view key, std::string_view why) const {
    throw Error(fmt::format("loom: {}: {} is not honoured by loom: {}", where_, key, why));
  }
  /// Chooses --sharding `name`; an explicit --sharding of another value is an error.
  void choose_sharding(std::string_view name, std::string_view because) {
    if (args_.given.contains("sharding") && args_.sharding != name)
      throw Error(fmt::format("loom: --sharding {} disagrees with {}: {} runs --sharding {}", args_.sharding, where_,
                              because, name));
    args_.sharding = std::string(name);
  }
  /// Sets the flag `flag` (field `field`) to `value`, which the config says; an explicit flag of
  /// another value is an error.
  template <class T, class V>
  void choose(T& field, std::string_view flag, const V& value, std::string_view because) {
    if (args_.given.contains(flag) && !(field == value))
      throw Error(fmt::format("loom: --{} {} disagrees with {}: {} means --{} {}", flag, field, where_, because, flag,
                              value));
    field = T(value);
  }
  /// Throws the list of disagreements, if any.
  void finish() const {
    if (mismatches_.empty()) return;
    std::string all;
    for (const auto& m : mismatches_) all += (all.empty() ? "" : "; ") + m;
    throw Error(fmt::format("loom: {} disagrees with the flags (set these keys to \"auto\" or to the flags' values, "
                            "as HF's Trainer requires): {}",
                            where_, all));
  }
  TrainingArguments& args() { return args_; }
  [[nodiscard]] const std::string& where() const { return where_; }

 private:
  TrainingArguments& args_;
  std::string where_;
  std::vector<std::string> mismatches_;
};

/// The sharding policy of DeepSpeed's zero stage `stage` (the catalog's deepspeed_stage).
LOOM_INLINE std::string_view sharding_of_stage(int64_t stage) {
  std::string_view found;
  for_each_member<ShardingCatalog>([&]<class Tag>() {
    if (Tag::facts.deepspeed_stage == stage) found = Tag::facts.name;
  });
  return found;
}

LOOM_INLINE void read_zero_optimization(ConfigReading& r, const nlohmann::json& zero) {
  if (!zero.is_object()) r.refuse("zero_optimization", "it must be a JSON object");
  int64_t stage = 0;
  if (zero.contains("stage")) {
    const auto& s = zero.at("stage");
    if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > 3)
      r.refuse("zero_optimization.stage " + s.dump(), "the stage must be 0, 1, 2 or 3");
    stage = s.get<int64_t>();
  }
  // Stage 0 is plain data parallelism: --sharding auto already runs DDP under torchrun.
  if (stage > 0) r.choose_sharding(sharding_of_stage(stage), fmt::format("zero_optimization.stage {}", stage));
  // DeepSpeed's stage 3 under bf16 partitions bf16 parameters, so it gathers bf16 (and
  // reduce-scatters bf16 gradients: the reduce format follows).
  if (stage == 3 && r.args().bf16 && !r.args().given.contains("sharding_param_dtype"))
    r.args().sharding_param_dtype = std::string(sharding_dtype::BFloat16::name);
  for (const auto& [key, value] : zero.items()) {
    const std::string name = "zero_optimization." + key;
    if (key == "stage") continue;
    if (key == "offload_optimizer" || key == "offload_param") {
      // --offload_optimizer / --offload_param (the can_implement of the chosen policy refuses
      // what it cannot do: offload_param outside stage 3).
      if (!value.is_object()) r.refuse(name, "it must be a JSON object");
      for (const auto& [k, v] : value.items())
        if (k != "device" && k != "pin_memory") r.refuse(name + "." + k, "loom reads device (and pins host memory on CUDA itself)");
      const auto device = value.contains("device") ? value.at("device") : nlohmann::json("none");
      if (device == "none") continue;
      if (device != "cpu") r.refuse(name + ".device " + device.dump(), "loom offloads to host memory (cpu) only");
      auto& flag = key == "offload_optimizer" ? r.args().offload_optimizer : r.args().offload_param;
      r.choose(flag, key, true, name + ".device \"cpu\"");
      continue;
    }
    // How DeepSpeed moves the same numbers, which loom does one way whatever they say: the
    // gradient collectives overlap backward, in contiguous buckets, ZeRO-2 reduce-scatters,
    // every rank's partition is all-gathered, and a save writes the full weights.
    if (key == "overlap_comm" || key == "contiguous_gradients" || key == "reduce_scatter" ||
        key == "allgather_partitions" || key == "stage3_gather_16bit_weights_on_model_save") {
      if (is_auto(value) || value.is_boolean()) continue;
      r.refuse(name + " " + value.dump(), "it must be true or false");
    }
    if (key == "reduce_bucket_size") {  // elements of fp32 gradients per bucket (stages 0-2)
      if (is_auto(value)) continue;
      if (!value.is_number() || value.get<double>() < 1)
        r.refuse(name + " " + value.dump(), "it must be a positive number of elements");
      if (stage == 3) continue;  // FullShard reduce-scatters each unit's gradients as one bucket
      const auto mb = std::max<int64_t>(1, std::llround(value.get<double>() * 4.0 / (1024.0 * 1024.0)));
      if (r.args().given.contains("ddp_bucket_cap_mb") && r.args().ddp_bucket_cap_mb != mb)
        throw Error(fmt::format("loom: --ddp_bucket_cap_mb {} disagrees with {}: {} is {} MB of fp32 gradients",
                                r.args().ddp_bucket_cap_mb.value_or(25), r.where(), name, mb));
      r.args().ddp_bucket_cap_mb = mb;
      continue;
    }
    // Sizes that tune how DeepSpeed chunks what loom does per bucket or per FullShard unit
    // (docs/distributed.md says what loom does for each): any positive size, or "auto", is
    // accepted and changes nothing in loom.
    // Stage 3 prefetches the parameters coming next while one block computes, up to this
    // many elements (DeepSpeed's default 5e7; HF fills "auto" with 0.9 hidden^2): any
    // positive size is loom's prefetch of the next unit, forward and backward; 0 turns it off.
    if (key == "stage3_prefetch_bucket_size" && (is_auto(value) || (value.is_number() && value.get<double>() >= 0))) {
      const bool on = is_auto(value) || value.get<double>() > 0;
      r.choose(r.args().fsdp_forward_prefetch, "fsdp_forward_prefetch", on, name);
      r.choose(r.args().fsdp_backward_prefetch, "fsdp_backward_prefetch",
               std::string(kBackwardPrefetch[on ? 1 : 0]), name);
      continue;
    }
    if (key == "allgather_bucket_size" || key == "stage3_prefetch_bucket_size" ||
        key == "stage3_param_persistence_threshold" || key == "stage3_max_live_parameters" ||
        key == "stage3_max_reuse_distance" || key == "sub_group_size") {
      if (is_auto(value) || (value.is_number() && value.get<double>() >= 0)) continue;
      r.refuse(name + " " + value.dump(), "it must be a number of elements, or \"auto\"");
    }
    r.refuse(name, "it is not one of the ZeRO settings loom reads (docs/distributed.md lists them)");
  }
}

LOOM_INLINE void read_half_precision(ConfigReading& r, const nlohmann::json& section, std::string_view which) {
  if (!section.is_object()) r.refuse(std::string(which), "it must be a JSON object");
  auto& args = r.args();
  // An fp16 section makes the loss scale DeepSpeed's, its defaults first (window 1000,
  // hysteresis 2; 2^16 and 1 are loom's too), then the section's keys.
  if (which == precision::FP16::name) {
    r.choose(args.loss_scale_rule, "loss_scale_rule", std::string(kLossScaleRules[1]), "its fp16 section");
    if (!args.given.contains("loss_scale_window")) args.loss_scale_window = 1000;
    if (!args.given.contains("loss_scale_hysteresis")) args.loss_scale_hysteresis = 2;
  }
  for (const auto& [key, value] : section.items()) {
    const std::string name = fmt::format("{}.{}", which, key);
    if (key == "enabled") {
      r.match(value, name, which, which == precision::FP16::name ? args.fp16 : args.bf16);
      continue;
    }
    if (which == precision::FP16::name) {
      // DeepSpeed's DynamicLossScaler (--loss_scale_rule deepspeed, chosen below): its keys,
      // with DeepSpeed's defaults where the section leaves one out.
      const auto number = [&](double min) {
        if (!value.is_number() || !(value.get<double>() >= min))
          r.refuse(name + " " + value.dump(), fmt::format("it must be a number of at least {}", min));
        return value.get<double>();
      };
      if (key == "loss_scale") {
        if (number(0) != 0)
          r.refuse(name + " " + value.dump(), "a static loss scale (loss_scale > 0) is a DeepSpeed feature loom "
                                              "lacks: loom's fp16 loss scale is dynamic; set it to 0");
        continue;
      }
      if (key == "initial_scale_power") {
        const double power = number(0);
        if (power != std::floor(power) || power > 64) r.refuse(name + " " + value.dump(), "it must be a whole number up to 64");
        r.choose(args.initial_loss_scale, "initial_loss_scale", std::ldexp(1.0, static_cast<int>(power)), name);
        continue;
      }
      if (key == "loss_scale_window" || key == "hysteresis") {
        const double n = number(1);
        if (n != std::floor(n)) r.refuse(name + " " + value.dump(), "it must be a whole number");
        auto& field = key == "hysteresis" ? args.loss_scale_hysteresis : args.loss_scale_window;
        const std::string_view flag = key == "hysteresis" ? "loss_scale_hysteresis" : "loss_scale_window";
        if (args.given.contains(flag) && field != static_cast<int64_t>(n))
          throw Error(fmt::format("loom: --{} {} disagrees with {}: {} means --{} {}", flag, field.value_or(0),
                                  r.where(), name, flag, static_cast<int64_t>(n)));
        field = static_cast<int64_t>(n);
        continue;
      }
      if (key == "min_loss_scale") {
        r.choose(args.min_loss_scale, "min_loss_scale", number(0), name);
        continue;
      }
      if (key == "auto_cast") {  // DeepSpeed casts the inputs to fp16; loom's autocast casts per op either way
        if (!value.is_boolean()) r.refuse(name + " " + value.dump(), "it must be true or false");
        continue;
      }
      if (key == "consecutive_hysteresis") {
        if (!value.is_boolean()) r.refuse(name + " " + value.dump(), "it must be true or false");
        r.choose(args.consecutive_hysteresis, "consecutive_hysteresis", value.get<bool>(), name);
        continue;
      }
    }
    r.refuse(name, "not a precision setting loom reads");
  }
}

LOOM_INLINE void read_optimizer(ConfigReading& r, const nlohmann::json& section) {
  if (!section.is_object()) r.refuse("optimizer", "it must be a JSON object");
  auto& args = r.args();
  const auto type = section.contains("type") && section.at("type").is_string() ? section.at("type").get<std::string>()
                                                                               : std::string();
  const bool adamw = args.optim == optimizer::AdamWTorchFused::name || args.optim == optimizer::AdamWTorch::name;
  if ((type != "AdamW" && type != "Adam") || !adamw)
    r.refuse("optimizer.type " + nlohmann::json(type).dump(),
             fmt::format("loom reads an AdamW section when --optim is AdamW (now {}); otherwise remove the section and "
                         "choose the optimizer with --optim",
                         args.optim));
  for (const auto& [key, value] : section.items()) {
    if (key == "type") continue;
    if (key != "params" || !value.is_object()) r.refuse("optimizer." + key, "loom reads optimizer.type and .params");
    for (const auto& [p, v] : value.items()) {
      const std::string name = "optimizer.params." + p;
      if (p == "lr") r.match(v, name, "learning_rate", args.learning_rate);
      else if (p == "eps") r.match(v, name, "adam_epsilon", args.adam_epsilon);
      else if (p == "weight_decay") r.match(v, name, "weight_decay", args.weight_decay);
      else if (p == "betas" && v.is_array() && v.size() == 2) {
        r.match(v[0], name + "[0]", "adam_beta1", args.adam_beta1);
        r.match(v[1], name + "[1]", "adam_beta2", args.adam_beta2);
      } else if (p == "betas" && is_auto(v)) {
        continue;
      } else {
        r.refuse(name, "loom's AdamW reads lr, betas, eps and weight_decay");
      }
    }
  }
}

// The scheduler section: DeepSpeed's WarmupLR, WarmupDecayLR or WarmupCosineLR (the catalog
// members with a deepspeed_type) with its params as lr_scheduler_kwargs, "auto" filled as HF
// fills it (warmup_min_lr 0; warmup_max_lr the learning rate; warmup_num_steps and
// total_num_steps the run's, which the schedule checks once they are known).
LOOM_INLINE void read_scheduler(ConfigReading& r, const nlohmann::json& section) {
  if (!section.is_object()) r.refuse("scheduler", "it must be a JSON object");
  auto& args = r.args();
  const auto type = section.contains("type") && section.at("type").is_string() ? section.at("type").get<std::string>()
                                                                               : std::string();
  std::string_view chosen;
  std::string known;
  for_each_member<ScheduleCatalog>([&]<class Tag>() {
    if constexpr (requires { Tag::deepspeed_type; }) {
      known += (known.empty() ? "" : ", ") + std::string(Tag::deepspeed_type);
      if (Tag::deepspeed_type == type) chosen = Tag::name;
    }
  });
  if (chosen.empty())
    r.refuse("scheduler.type " + nlohmann::json(type).dump(),
             fmt::format("loom runs DeepSpeed's {}; its OneCycle and LRRangeTest are schedules loom lacks", known));
  r.choose(args.lr_scheduler_type, "lr_scheduler_type", std::string(chosen), "scheduler.type \"" + type + "\"");
  auto kwargs = nlohmann::json::object();
  for (const auto& [key, value] : section.items()) {
    if (key == "type") continue;
    if (key != "params" || !value.is_object()) r.refuse("scheduler." + key, "loom reads scheduler.type and .params");
    for (const auto& [p, v] : value.items()) {
      const std::string name = "scheduler.params." + p;
      if (p == "warmup_max_lr") {
        r.match(v, name, "learning_rate", args.learning_rate);
      } else if (p == "last_batch_iteration") {
        if (!(v.is_number_integer() && v.get<int64_t>() == -1))
          r.refuse(name + " " + v.dump(), "the schedule starts at -1 and resumes from --resume_from_checkpoint's "
                                          "scheduler state");
      } else if (is_auto(v)) {
        // warmup_min_lr: 0 (HF's fill_only); warmup_num_steps, total_num_steps: the run's,
        // the schedule's defaults. HF fills no other key.
        if (p != "warmup_min_lr" && p != "warmup_num_steps" && p != "total_num_steps")
          r.refuse(name + " \"auto\"", "HF's Trainer fills no value for it; give one");
      } else {
        kwargs[p] = v;  // the schedule checks each key and value when training starts
      }
    }
  }
  if (args.given.contains("lr_scheduler_kwargs") && args.lr_scheduler_kwargs != kwargs.dump() &&
      !kwargs.empty())
    throw Error(fmt::format("loom: --lr_scheduler_kwargs {} disagrees with {}: its scheduler.params give {}",
                            args.lr_scheduler_kwargs, r.where(), kwargs.dump()));
  if (!args.given.contains("lr_scheduler_kwargs")) args.lr_scheduler_kwargs = kwargs.dump();
}

LOOM_INLINE void apply_deepspeed(TrainingArguments& args) {
  const auto ds = launcher_config(*args.deepspeed, "deepspeed");
  ConfigReading r(args, "--deepspeed " + *args.deepspeed);
  const char* world_text = std::getenv("WORLD_SIZE");
  const int64_t world = world_text != nullptr ? std::max<int64_t>(1, std::atoll(world_text)) : 1;
  for (const auto& [key, value] : ds.items()) {
    if (key == "train_micro_batch_size_per_gpu")
      r.match(value, key, "per_device_train_batch_size", args.per_device_train_batch_size);
    else if (key == "gradient_accumulation_steps")
      r.match(value, key, "gradient_accumulation_steps", args.gradient_accumulation_steps);
    else if (key == "train_batch_size")
      r.match(value, key, "per_device_train_batch_size x gradient_accumulation_steps x WORLD_SIZE",
              args.per_device_train_batch_size * args.gradient_accumulation_steps * world);
    else if (key == "gradient_clipping")
      r.match(value, key, "max_grad_norm", args.max_grad_norm);
    else if (key == "zero_optimization")
      read_zero_optimization(r, value);
    else if (key == precision::FP16::name || key == precision::BF16::name)  // DeepSpeed names its sections as loom its flags
      read_half_precision(r, value, key);
    else if (key == "optimizer")
      read_optimizer(r, value);
    else if (key == "communication_data_type") {  // the gradient collectives' format
      std::string_view chosen;
      for_each_member<ShardingDtypeCatalog>([&]<class Tag>() {
        if (value.is_string() && value.get<std::string>() == Tag::name) chosen = Tag::name;
      });
      if (chosen.empty())
        r.refuse(key + " " + value.dump(), fmt::format("loom reduces gradients in {}", joined_names<ShardingDtypeCatalog>(" or ")));
      std::optional<std::string>& reduce = args.sharding_reduce_dtype;
      if (args.given.contains("sharding_reduce_dtype") && reduce != std::string(chosen))
        throw Error(fmt::format("loom: --sharding_reduce_dtype {} disagrees with {}: {} is {}", reduce.value_or(""),
                                r.where(), key, value.dump()));
      reduce = std::string(chosen);
    }
    else if (key == "steps_per_print" || key == "wall_clock_breakdown" || key == "zero_allow_untested_optimizer") {
      // DeepSpeed's own console output and its check of untested optimizers: nothing to
      // train differently (loom logs every --logging_steps).
      continue;
    } else if (key == "scheduler") {
      read_scheduler(r, value);
    } else {
      r.refuse(key, "not a DeepSpeed setting loom reads (docs/distributed.md lists them)");
    }
  }
  r.finish();
}

LOOM_INLINE void apply_fsdp(TrainingArguments& args) {
  ConfigReading r(args, "--fsdp " + *args.fsdp);
  std::string_view chosen;
  // HF: --fsdp true is full_shard; otherwise words separated by spaces (or commas).
  std::string words = *args.fsdp;
  if (parse_bool(words) == std::optional<bool>(true)) words = std::string(sharding::FullShard::facts.fsdp_option);
  for (auto& ch : words)
    if (ch == ' ') ch = ',';
  for (const auto& word : split_list(words)) {
    std::string_view found;
    for_each_member<ShardingCatalog>([&]<class Tag>() {
      if (!Tag::facts.fsdp_option.empty() && Tag::facts.fsdp_option == word) found = Tag::facts.name;
    });
    if (!found.empty()) {
      if (!chosen.empty() && chosen != found) r.refuse(word, "choose one sharding strategy");
      chosen = found;
      continue;
    }
    if (word == "offload") {  // FSDP's CPUOffload(offload_params=True): parameters and the optimizer step on the host
      r.choose(args.offload_optimizer, "offload_optimizer", true, "offload");
      r.choose(args.offload_param, "offload_param", true, "offload");
      continue;
    }
    // auto_wrap: loom's units are the model's FullShardUnit blocks (loom::models' transformer
    // layers, HF's _no_split_modules), chosen by --fsdp_config's policy keys below.
    if (word == "auto_wrap") continue;
    r.refuse(word, "not an FSDP option loom reads (full_shard, shard_grad_op, no_shard, offload, auto_wrap)");
  }
  if (!chosen.empty()) r.choose_sharding(chosen, "that strategy");
  // accelerate's FSDP under --bf16: MixedPrecision(param_dtype, reduce_dtype) both bfloat16.
  // loom gathers parameters only under FullShard; the others reduce in bfloat16.
  if (args.bf16) {
    const std::string bf16(sharding_dtype::BFloat16::name);
    if (sharding::FullShard::facts.name == args.sharding && !args.given.contains("sharding_param_dtype"))
      args.sharding_param_dtype = bf16;
    if (!args.given.contains("sharding_reduce_dtype") && !args.sharding_reduce_dtype) args.sharding_reduce_dtype = bf16;
  }
  if (!args.fsdp_config) return;
  const auto config = launcher_config(*args.fsdp_config, "fsdp_config");
  ConfigReading c(args, "--fsdp_config " + *args.fsdp_config);
  for (const auto& [raw, value] : config.items()) {
    // HF strips the fsdp_ prefix of accelerate's names.
    const std::string key = raw.starts_with("fsdp_") ? raw.substr(5) : raw;
    if (key == "activation_checkpointing") {
      if (!value.is_boolean()) c.refuse(raw, "it must be true or false");
      if (value.get<bool>()) args.gradient_checkpointing = true;
      continue;
    }
    if (key == "version" && value.is_number() && value.get<double>() == 2) continue;  // loom's FullShard is FSDP2-like
    // HF 5 writes --fsdp as true and the strategy as FSDP2's reshard_after_forward: true
    // (full_shard) or false (shard_grad_op, loom's zero2); "offload" as cpu_offload.
    if (key == "reshard_after_forward") {
      if (!value.is_boolean()) c.refuse(raw, "it must be true (full_shard) or false (shard_grad_op)");
      c.choose_sharding(value.get<bool>() ? sharding::FullShard::facts.name : sharding::ZeRO2::facts.name,
                        raw + " " + value.dump());
      continue;
    }
    if (key == "cpu_offload") {
      if (!value.is_boolean()) c.refuse(raw, "it must be true or false");
      if (value.get<bool>()) {
        c.choose(args.offload_optimizer, "offload_optimizer", true, raw);
        c.choose(args.offload_param, "offload_param", true, raw);
      }
      continue;
    }
    // The XLA keys HF fills in: loom has no XLA devices.
    if ((key == "xla" || key == "xla_fsdp_v2" || key == "xla_fsdp_grad_ckpt") && value == false) continue;
    if (key == "transformer_layer_cls_to_wrap") {  // a class name or a list of them
      std::string classes;
      if (value.is_string()) classes = value.get<std::string>();
      else if (value.is_array())
        for (const auto& v : value) {
          if (!v.is_string()) c.refuse(raw, "it must be a class name or a list of class names");
          classes += (classes.empty() ? "" : ",") + v.get<std::string>();
        }
      else c.refuse(raw, "it must be a class name or a list of class names");
      auto& flag = args.fsdp_transformer_layer_cls_to_wrap;
      if (args.given.contains("fsdp_transformer_layer_cls_to_wrap") && flag != classes)
        throw Error(fmt::format("loom: --fsdp_transformer_layer_cls_to_wrap {} disagrees with {}: {} is {}",
                                flag.value_or(""), c.where(), raw, value.dump()));
      flag = classes;
      continue;
    }
    // accelerate's prefetch settings (HF's fsdp_config passes them on; its defaults are off).
    if (key == "forward_prefetch") {
      const auto on = value.is_boolean() ? std::optional<bool>(value.get<bool>())
                                         : value.is_string() ? parse_bool(value.get<std::string>()) : std::nullopt;
      if (!on) c.refuse(raw, "it must be true or false");
      c.choose(args.fsdp_forward_prefetch, "fsdp_forward_prefetch", *on, raw);
      continue;
    }
    if (key == "backward_prefetch") {
      std::string name = value.is_string() ? value.get<std::string>() : std::string();
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char ch) { return std::tolower(ch); });
      if (std::find(kBackwardPrefetch.begin(), kBackwardPrefetch.end(), name) == kBackwardPrefetch.end())
        c.refuse(raw + " " + value.dump(), "it must be BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH");
      c.choose(args.fsdp_backward_prefetch, "fsdp_backward_prefetch", name, raw);
      continue;
    }
    if (key == "min_num_params") {
      if (!value.is_number_integer() || value.get<int64_t>() < 0) c.refuse(raw, "it must be a whole number >= 0");
      c.choose(args.fsdp_min_num_params, "fsdp_min_num_params", value.get<int64_t>(), raw);
      continue;
    }
    if (key == "auto_wrap_policy" && value.is_string()) {  // which of the two keys above decides
      const auto policy = value.get<std::string>();
      if (policy == "TRANSFORMER_BASED_WRAP" || policy == "SIZE_BASED_WRAP") continue;
      c.refuse(raw + " " + value.dump(), "loom wraps by TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP");
    }
    c.refuse(raw, "not an FSDP setting loom reads (docs/distributed.md lists them)");
  }
}

}  // namespace detail

LOOM_INLINE void apply_launcher_configs(TrainingArguments& args) {
  if (args.given.launcher_configs_applied()) return;  // read once (launcher_configs.hpp)
  const bool fsdp = args.fsdp && !args.fsdp->empty() && detail::parse_bool(*args.fsdp) != std::optional<bool>(false);
  if (args.deepspeed && fsdp) throw Error("loom: --deepspeed and --fsdp are both given; choose one");
  if (args.fsdp_config && !fsdp) throw Error("loom: --fsdp_config needs --fsdp (e.g. --fsdp \"full_shard\")");
  if (args.deepspeed) detail::apply_deepspeed(args);
  if (fsdp) detail::apply_fsdp(args);
  args.given.mark_launcher_configs_applied();
}

}  // namespace loom
