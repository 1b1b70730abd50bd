// --deepspeed ds_config.json and --fsdp / --fsdp_config (issue 28 point 5): the configs users
// bring from HF's Trainer read onto loom's flags (config/launcher_configs.hpp). DeepSpeed's
// stage picks --sharding; the keys HF fills from TrainingArguments must be "auto" or agree
// with the flags (HF's rule, one error listing every disagreement); every key loom does not
// honour is a loom: line naming it.
#include <loom/config/launcher_configs.hpp>
#include <loom/config/reflect.hpp>
#include <loom/config/validate.hpp>
#include <loom/trainer/selector.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../support.hpp"
#include "parse_support.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

using loom::TrainingArguments;

using config_test::error_of;
const auto finalized = config_test::parsed;

bool starts(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// HF's documented ZeRO-2 and ZeRO-3 configs (the "auto" forms of the DeepSpeed integration page).
const char* kZero2 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "none"}, "allgather_partitions": true,
                        "allgather_bucket_size": "auto", "overlap_comm": true, "reduce_scatter": true,
                        "reduce_bucket_size": "auto", "contiguous_gradients": true},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false
})";

}  // namespace

TEST_CASE("--deepspeed: HF's auto configs choose the ZeRO stage; a file or its text") {
  const auto dir = loom_test::fresh_dir("launcher_configs");
  const auto file = dir / "ds_zero2.json";
  std::ofstream(file) << kZero2;
  for (const std::string& given : {file.string(), std::string(kZero2)}) {
    const auto a = finalized({"--deepspeed", given});
    CHECK(a.sharding == "zero2");
    CHECK(loom::select_policies(a, []<class S, class P>() { return std::string(S::name); }) == "zero2");
  }
  for (auto [stage, name] : {std::pair{1, "zero1"}, {2, "zero2"}, {3, "full_shard"}}) {
    CAPTURE(stage);
    const auto text = "{\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
    CHECK(finalized({"--deepspeed", text}).sharding == name);
    // The selector reads the config before finalize() ran.
    auto raw = std::get<0>(loom::try_parse_args<TrainingArguments>(std::vector<std::string>{"--deepspeed", text}).values);
    CHECK(loom::select_policies(raw, []<class S, class P>() { return std::string(S::name); }) == name);
  }
  // Stage 0 (plain data parallelism) leaves --sharding auto: ddp under torchrun, no in one process.
  CHECK(finalized({"--deepspeed", R"({"zero_optimization": {"stage": 0}})"}).sharding == "auto");
  // Numbers that agree with the flags are taken; the bucket size becomes --ddp_bucket_cap_mb.
  const auto b = finalized({"--deepspeed",
                            R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
                                "train_batch_size": 8, "gradient_clipping": 0.5, "bf16": {"enabled": true},
                                "zero_optimization": {"stage": 2, "reduce_bucket_size": 2621440}})",
                            "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                            "--max_grad_norm", "0.5", "--bf16"});
  CHECK(b.ddp_bucket_cap_mb == 10);
  CHECK(b.bf16);
}

TEST_CASE("--deepspeed and --fsdp: offload and the communication formats") {
  const auto a = finalized({"--deepspeed", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu",
                            "pin_memory": true}, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": "auto"}})",
                            "--bf16"});
  CHECK(a.sharding == "full_shard");
  CHECK(a.offload_optimizer);
  CHECK(a.offload_param);
  CHECK(a.sharding_param_dtype == "bf16");  // stage 3 partitions bf16 parameters under bf16
  const auto b = finalized({"--deepspeed", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
                            "communication_data_type": "bf16"})"});
  CHECK(b.offload_optimizer);
  CHECK_FALSE(b.offload_param);
  CHECK(b.sharding_param_dtype == "fp32");
  CHECK(b.sharding_reduce_dtype == std::optional<std::string>("bf16"));
  CHECK(starts(error_of({"--deepspeed", R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})"}),
               "loom: --deepspeed {"));
  CHECK(error_of({"--deepspeed", R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})",
                  "--offload_optimizer", "false"})
            .find("--offload_optimizer false disagrees with --deepspeed") != std::string::npos);
  // accelerate's FSDP under --bf16: bf16 parameters and reductions; offload moves both.
  const auto f = finalized({"--fsdp", "full_shard offload", "--bf16"});
  CHECK(f.sharding == "full_shard");
  CHECK(f.offload_optimizer);
  CHECK(f.offload_param);
  CHECK(f.sharding_param_dtype == "bf16");
  CHECK(f.sharding_reduce_dtype == std::optional<std::string>("bf16"));
  const auto g = finalized({"--fsdp", "shard_grad_op", "--bf16"});
  CHECK(g.sharding_param_dtype == "fp32");  // zero2 keeps float32 replicas; it reduces in bf16
  CHECK(g.sharding_reduce_dtype == std::optional<std::string>("bf16"));
  // An explicit format wins.
  CHECK(finalized({"--fsdp", "full_shard", "--bf16", "--sharding_param_dtype", "fp32"}).sharding_param_dtype == "fp32");
  CHECK_FALSE(finalized({"--fsdp", "full_shard"}).sharding_reduce_dtype.has_value());
}

TEST_CASE("--deepspeed: transformers' documented ZeRO-2 and ZeRO-3 configs load unchanged, every key honoured") {
  // The two sample configs of transformers' DeepSpeed page, as printed there (the files the
  // torchrun example test also trains with).
  const auto samples = loom_test::source_dir() / "tests/examples/deepspeed";
  const std::string zero2 = (samples / "ds_config_zero2.json").string(), zero3 = (samples / "ds_config_zero3.json").string();
  for (const auto& [config, sharding] : {std::pair{zero2, "zero2"}, std::pair{zero3, "full_shard"}}) {
    CAPTURE(sharding);
    const auto a = finalized({"--deepspeed", config, "--fp16"});
    CHECK(a.sharding == sharding);
    CHECK(a.offload_optimizer);
    CHECK(a.offload_param == (std::string(sharding) == "full_shard"));
    CHECK(a.loss_scale_rule == "deepspeed");  // DeepSpeed's DynamicLossScaler, with the section's numbers
    CHECK(a.loss_scale_window == std::optional<int64_t>(1000));
    CHECK(a.loss_scale_hysteresis == std::optional<int64_t>(2));
    CHECK(a.initial_loss_scale == 65536.0);
    CHECK(a.min_loss_scale == 1.0);
    CHECK(a.lr_scheduler_type == "warmup_lr");  // the scheduler section's, "auto" filled when training starts
    CHECK(a.lr_scheduler_kwargs == "{}");
  }
  // The section's own numbers and schedule parameters are taken.
  const auto b = finalized({"--deepspeed", R"({"fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 4,
                            "loss_scale_window": 50, "min_loss_scale": 8, "consecutive_hysteresis": true},
                            "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_type": "linear",
                            "cos_min_ratio": 0.1, "total_num_steps": "auto", "warmup_num_steps": 20}}})",
                            "--fp16"});
  CHECK(b.initial_loss_scale == 4096.0);
  CHECK(b.loss_scale_hysteresis == std::optional<int64_t>(4));
  CHECK(b.loss_scale_window == std::optional<int64_t>(50));
  CHECK(b.min_loss_scale == 8.0);
  CHECK(b.consecutive_hysteresis);
  CHECK(b.lr_scheduler_type == "warmup_cosine_lr");
  CHECK(nlohmann::json::parse(b.lr_scheduler_kwargs) ==
        nlohmann::json::parse(R"({"warmup_type": "linear", "cos_min_ratio": 0.1, "warmup_num_steps": 20})"));
  // A flag that disagrees with the section is an error, as for the other keys.
  CHECK(error_of({"--deepspeed", R"({"scheduler": {"type": "WarmupLR"}})", "--lr_scheduler_type", "cosine"})
            .find("--lr_scheduler_type cosine disagrees with --deepspeed") != std::string::npos);
  CHECK(error_of({"--deepspeed", R"({"fp16": {"enabled": true, "hysteresis": 3}})", "--fp16",
                  "--loss_scale_hysteresis", "2", "--loss_scale_rule", "deepspeed"})
            .find("--loss_scale_hysteresis 2 disagrees with --deepspeed") != std::string::npos);
  // The loss-scale flags need --fp16, and the hysteresis DeepSpeed's rule.
  CHECK(error_of({"--loss_scale_window", "100"}) == "loom: --loss_scale_window sets --fp16's loss scale; add --fp16");
  CHECK(error_of({"--fp16", "--loss_scale_hysteresis", "3"}) ==
        "loom: --loss_scale_hysteresis belongs to DeepSpeed's loss scale rule; add --loss_scale_rule deepspeed");
}

TEST_CASE("--deepspeed: values that disagree with the flags are listed in one loom: line, as HF lists them") {
  const auto e = error_of({"--deepspeed",
                           R"({"train_micro_batch_size_per_gpu": 16, "gradient_clipping": 0.5,
                               "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95]}},
                               "bf16": {"enabled": true}})"});
  CHECK(starts(e, "loom: --deepspeed {"));
  for (const char* part : {"train_micro_batch_size_per_gpu is 16 but --per_device_train_batch_size is 8",
                           "gradient_clipping is 0.5 but --max_grad_norm is 1", "optimizer.params.lr is 0.0003 but "
                           "--learning_rate is 5e-05", "optimizer.params.betas[1] is 0.95 but --adam_beta2 is 0.999",
                           "bf16.enabled is true but --bf16 is false"}) {
    INFO(part);
    CHECK(e.find(part) != std::string::npos);
  }
  CHECK(e.find("betas[0]") == std::string::npos);  // 0.9 agrees
  // An explicit --sharding that is not the stage's.
  CHECK(error_of({"--sharding", "zero1", "--deepspeed", R"({"zero_optimization": {"stage": 2}})"}) ==
        "loom: --sharding zero1 disagrees with --deepspeed {\"zero_optimization\": {\"stage\": 2}}: "
        "zero_optimization.stage 2 runs --sharding zero2");
}

TEST_CASE("--deepspeed: stage3_prefetch_bucket_size turns FullShard's prefetch on, 0 off") {
  for (const auto& [value, on] : std::vector<std::pair<std::string, bool>>{{"\"auto\"", true}, {"5e7", true}, {"0", false}}) {
    CAPTURE(value);
    const auto a = finalized({"--deepspeed", R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": )" +
                                                 value + "}}"});
    CHECK(a.sharding == "full_shard");
    CHECK(a.fsdp_forward_prefetch == on);
    CHECK(a.fsdp_backward_prefetch == (on ? "backward_pre" : "no_prefetch"));
  }
  CHECK(starts(error_of({"--fsdp_forward_prefetch", "--deepspeed",
                         R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0}})"}),
               "loom: --fsdp_forward_prefetch true disagrees with --deepspeed"));
}

TEST_CASE("--deepspeed: every key loom does not honour is refused by name") {
  const std::vector<std::pair<std::string, std::string>> cases{
      {R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
       "zero_optimization.offload_optimizer.device \"nvme\" is not honoured"},
      {R"({"communication_data_type": "fp16"})", "communication_data_type \"fp16\" is not honoured"},
      {R"({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}})", "zero_optimization.overlap_comm \"yes\" is not honoured"},
      {R"({"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "many"}})",
       "zero_optimization.stage3_max_live_parameters \"many\" is not honoured"},
      {R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage 4 is not honoured"},
      {R"({"zero_optimization": {"stage": 2, "round_robin_gradients": true}})",
       "zero_optimization.round_robin_gradients is not honoured"},
      {R"({"fp16": {"enabled": "auto", "loss_scale": 128}})", "fp16.loss_scale 128 is not honoured"},
      {R"({"fp16": {"enabled": "auto", "hysteresis": 0}})", "fp16.hysteresis 0 is not honoured"},
      {R"({"fp16": {"enabled": "auto", "fp16_master_weights_and_grads": true}})",
       "fp16.fp16_master_weights_and_grads is not honoured"},
      {R"({"scheduler": {"type": "OneCycle"}})", "scheduler.type \"OneCycle\" is not honoured"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "auto"}}})",
       "scheduler.params.warmup_type \"auto\" is not honoured"},
      {R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 5}}})",
       "scheduler.params.last_batch_iteration 5 is not honoured"},
      {R"({"optimizer": {"type": "Lamb"}})", "optimizer.type \"Lamb\" is not honoured"},
      {R"({"activation_checkpointing": {}})", "activation_checkpointing is not honoured"},
  };
  for (const auto& [config, says] : cases) {
    CAPTURE(config);
    const auto e = error_of({"--deepspeed", config});
    CHECK(starts(e, "loom: --deepspeed {"));
    CHECK(e.find(": " + says + " by loom: ") != std::string::npos);
  }
  CHECK(error_of({"--deepspeed", "/nonexistent/ds.json"}) ==
        "loom: --deepspeed /nonexistent/ds.json: no such file (give a JSON file, or the JSON text itself)");
  CHECK(starts(error_of({"--deepspeed", "{\"stage\": "}), "loom: --deepspeed is not valid JSON"));
  CHECK(error_of({"--deepspeed", "{}", "--fsdp", "full_shard"}) == "loom: --deepspeed and --fsdp are both given; choose one");
}

TEST_CASE("--fsdp and --fsdp_config") {
  CHECK(finalized({"--fsdp", "full_shard"}).sharding == "full_shard");
  CHECK(finalized({"--fsdp", "true"}).sharding == "full_shard");
  CHECK(finalized({"--fsdp", "no_shard"}).sharding == "ddp");
  const auto a = finalized({"--fsdp", "full_shard", "--fsdp_config", R"({"fsdp_activation_checkpointing": true, "version": 2})"});
  CHECK(a.gradient_checkpointing);
  CHECK(error_of({"--fsdp", "hybrid_shard"}) ==
        "loom: --fsdp hybrid_shard: hybrid_shard is not honoured by loom: not an FSDP option loom reads (full_shard, "
        "shard_grad_op, no_shard, offload, auto_wrap)");
  // auto_wrap with HF's policy keys: the units by block class, or by size.
  const auto w = finalized({"--fsdp", "full_shard auto_wrap", "--fsdp_config",
                            R"({"fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                "fsdp_transformer_layer_cls_to_wrap": ["LlamaDecoderLayer", "GPT2Block"]})"});
  CHECK(w.fsdp_transformer_layer_cls_to_wrap == std::optional<std::string>("LlamaDecoderLayer,GPT2Block"));
  CHECK(finalized({"--fsdp", "full_shard auto_wrap", "--fsdp_config", R"({"min_num_params": 100000})"})
            .fsdp_min_num_params == 100000);
  CHECK(error_of({"--fsdp", "full_shard", "--fsdp_config", R"({"min_num_params": 10, "transformer_layer_cls_to_wrap": "X"})"}) ==
        "loom: --fsdp_min_num_params and --fsdp_transformer_layer_cls_to_wrap are mutually exclusive (HF's rule): wrap by "
        "size or by class");
  CHECK(starts(error_of({"--fsdp", "full_shard", "--fsdp_config", R"({"auto_wrap_policy": "NO_WRAP"})"}),
               "loom: --fsdp_config {\"auto_wrap_policy\": \"NO_WRAP\"}: auto_wrap_policy \"NO_WRAP\" is not honoured"));
  CHECK(error_of({"--fsdp_min_num_params", "-1"}) == "loom: --fsdp_min_num_params must be >= 0, got -1");
  // accelerate's prefetch keys: HF's defaults are off, and so are loom's flags.
  const auto no_prefetch = finalized({"--fsdp", "full_shard"});
  CHECK_FALSE(no_prefetch.fsdp_forward_prefetch);
  CHECK(no_prefetch.fsdp_backward_prefetch == "no_prefetch");
  const auto prefetch = finalized({"--fsdp", "full_shard", "--fsdp_config",
                                   R"({"fsdp_backward_prefetch": "BACKWARD_POST", "forward_prefetch": "true"})"});
  CHECK(prefetch.fsdp_forward_prefetch);
  CHECK(prefetch.fsdp_backward_prefetch == "backward_post");
  CHECK(starts(error_of({"--fsdp", "full_shard", "--fsdp_config", R"({"backward_prefetch": "BACKWARD_SOON"})"}),
               "loom: --fsdp_config {\"backward_prefetch\": \"BACKWARD_SOON\"}: backward_prefetch \"BACKWARD_SOON\" is "
               "not honoured by loom: it must be BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH"));
  CHECK(starts(error_of({"--fsdp", "full_shard", "--fsdp_backward_prefetch", "backward_pre", "--fsdp_config",
                         R"({"backward_prefetch": "NO_PREFETCH"})"}),
               "loom: --fsdp_backward_prefetch backward_pre disagrees with --fsdp_config"));
  CHECK(error_of({"--fsdp_backward_prefetch", "backward_later"}).starts_with(
      "loom: --fsdp_backward_prefetch must be one of no_prefetch|backward_pre|backward_post, got 'backward_later'"));
  CHECK(error_of({"--fsdp_config", "{}"}) == "loom: --fsdp_config needs --fsdp (e.g. --fsdp \"full_shard\")");
  CHECK(error_of({"--sharding", "zero2", "--fsdp", "full_shard"}) ==
        "loom: --sharding zero2 disagrees with --fsdp full_shard: that strategy runs --sharding full_shard");
}

TEST_CASE("--deepspeed is read once: validate, finalize and the selector reuse the first reading") {
  const auto dir = loom_test::fresh_dir("launcher_configs_once");
  const auto file = dir / "ds_zero1.json";
  std::ofstream(file) << R"({"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": "auto"})";
  auto a = finalized({"--deepspeed", file.string()});
  REQUIRE(a.sharding == "zero1");
  CHECK(a.given.launcher_configs_applied());
  // A second reading would now fail: the file is gone.
  std::filesystem::remove(file);
  CHECK_NOTHROW(loom::validate(a));
  CHECK_NOTHROW(loom::finalize(a));
  CHECK(a.sharding == "zero1");
  CHECK(a.deepspeed == std::optional<std::string>(file.string()));  // still named, as HF keeps it
  CHECK(loom::select_policies(a, []<class S, class P>() { return std::string(S::name); }) == "zero1");
  // Arguments not read yet are read where they are used; the missing file is then refused.
  const auto raw =
      std::get<0>(loom::try_parse_args<TrainingArguments>(std::vector<std::string>{"--deepspeed", file.string()}).values);
  CHECK_FALSE(raw.given.launcher_configs_applied());
  CHECK_THROWS_AS(loom::validate(raw), loom::Error);
}
