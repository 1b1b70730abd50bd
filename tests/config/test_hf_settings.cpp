// transformers.TrainingArguments carried over whole (issue 36): each field of the pinned
// transformers' dataclass is a loom flag or a ForeignSetting with its reason, and a JSON
// settings file in HF's own forms (lists, dicts, nulls, the foreign settings at HF's defaults)
// reads as it says.
#include <loom/config/reflect.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/config/validate.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include "parse_support.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace hf_settings_test {

bool is_flag(std::string_view name) {
  constexpr auto names = loom::detail::setting_names<loom::TrainingArguments>();
  return std::ranges::find(names, name) != names.end();
}

// The settings a JSON file at `path` holding `text` parses to (validated and finalized).
loom::TrainingArguments from_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path) << text;
  auto args = std::get<0>(loom::try_parse_args<loom::TrainingArguments>(std::vector<std::string>{path.string()}).values);
  loom::validate(args);
  loom::finalize(args);
  return args;
}

std::string error_from_file(const std::filesystem::path& path, const std::string& text) {
  return loom_test::error_of([&] { (void)from_file(path, text); });
}

}  // namespace hf_settings_test

using hf_settings_test::error_from_file;
using hf_settings_test::from_file;

TEST_CASE("every field of transformers.TrainingArguments is a loom flag or refused with its reason") {
  const char* py = loom_test::python("the field list of transformers.TrainingArguments");
  if (py == nullptr) return;
  // One line a field: its name and HF's default as to_json_string writes it.
  const std::string out = loom_test::run_capture(
      std::string(py) + " -c \"import dataclasses, json, warnings; warnings.simplefilter('ignore');"
                        " from transformers import TrainingArguments as T;"
                        " d = json.loads(T(output_dir='o').to_json_string());"
                        " [print(f.name, json.dumps(d.get(f.name))) for f in dataclasses.fields(T)]\" 2>/dev/null");
  std::istringstream lines(out);
  std::vector<std::string> hf_fields, neither;
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.find(' ');
    REQUIRE(space != std::string::npos);
    const std::string name = line.substr(0, space);
    const auto hf_default = nlohmann::json::parse(line.substr(space + 1));
    hf_fields.push_back(name);
    if (hf_settings_test::is_flag(name)) continue;
    const loom::detail::ForeignSetting* foreign = loom::detail::foreign_setting(name);
    if (foreign == nullptr) {
      neither.push_back(name);
      continue;
    }
    INFO("field " << name << ", HF's default " << hf_default.dump());
    CHECK_FALSE(foreign->why.empty());
    CHECK(loom::detail::foreign_value_accepted(name, hf_default));  // a file HF wrote with defaults reads
  }
  CHECK(hf_fields.size() >= 114);  // transformers 5.23
  // A transformers upgrade that adds a field fails here, naming it.
  CHECK_MESSAGE(neither.empty(), "neither a flag nor a ForeignSetting: " << doctest::toString(neither.size())
                                                                            << (neither.empty() ? "" : ", first " + neither.front()));
  // And one that drops a field: no reason kept for a field HF no longer has.
  for (const auto& foreign : loom::detail::foreign_settings()) {
    INFO("ForeignSetting " << foreign.name);
    CHECK(std::ranges::find(hf_fields, foreign.name) != hf_fields.end());
  }
}

TEST_CASE("a settings file in HF's forms: lists, dicts and nulls read as loom's flags") {
  const auto dir = loom_test::tmp_dir("config/hf_settings_forms");
  std::filesystem::create_directories(dir);
  const auto args = from_file(dir / "hf.json", R"({
    "report_to": ["tensorboard", "jsonl"], "include_for_metrics": ["inputs", "loss"],
    "label_names": ["start_positions", "end_positions"], "lr_scheduler_type": "cosine",
    "lr_scheduler_kwargs": {"num_cycles": 0.25}, "gradient_checkpointing_kwargs": {"use_reentrant": false},
    "activation_checkpointing": true, "debug": [], "hub_token": "<HUB_TOKEN>", "torch_compile": false,
    "accelerator_config": {"split_batches": false, "dispatch_batches": null, "even_batches": true,
                           "use_seedable_sampler": true, "non_blocking": false, "gradient_accumulation_kwargs": null},
    "torch_empty_cache_steps": 4, "use_cache": false, "ddp_static_graph": true})");
  CHECK(args.report_to == "tensorboard,jsonl");
  CHECK(args.include_for_metrics == "inputs,loss");
  CHECK(args.label_names == "start_positions,end_positions");
  CHECK(args.lr_scheduler_kwargs == R"({"num_cycles":0.25})");
  CHECK(args.gradient_checkpointing_kwargs == R"({"use_reentrant":false})");
  CHECK(args.gradient_checkpointing);  // HF 5's name sets the old one
  CHECK(args.activation_checkpointing == true);
  CHECK(args.torch_empty_cache_steps == 4);
  CHECK(args.given.ignored() == std::vector<std::string>{"accelerator_config", "debug", "hub_token", "torch_compile"});
  CHECK_FALSE(args.given.contains("torch_compile"));  // not a setting of loom's
  CHECK(args.given.contains("report_to"));

  // HF's defaults for the list and dict settings: empty lists, null kwargs.
  const auto defaults = from_file(dir / "defaults.json",
                                  R"({"report_to": [], "include_for_metrics": [], "label_names": null,
                                      "lr_scheduler_kwargs": null, "fsdp": null, "fsdp_config": null})");
  CHECK(defaults.report_to == "none");
  CHECK(defaults.include_for_metrics.empty());
  CHECK_FALSE(defaults.label_names);
  CHECK(defaults.lr_scheduler_kwargs == "{}");
  CHECK_FALSE(defaults.fsdp);
  // HF 5's fsdp=True is full_shard; a list of words reads as HF 4's string.
  CHECK(from_file(dir / "fsdp.json", R"({"fsdp": true})").sharding == "full_shard");
  CHECK(from_file(dir / "fsdp_words.json", R"({"fsdp": ["shard_grad_op", "auto_wrap"]})").sharding == "zero2");
  // HF 5 writes fsdp as true and the strategy, offload and its XLA defaults in fsdp_config.
  const auto fsdp5 = from_file(dir / "fsdp5.json", R"({"fsdp": true, "fsdp_config": {"reshard_after_forward": true,
      "cpu_offload": true, "min_num_params": 0, "xla": false, "xla_fsdp_v2": false, "xla_fsdp_grad_ckpt": false}})");
  CHECK(fsdp5.sharding == "full_shard");
  CHECK(fsdp5.offload_optimizer);
  CHECK(fsdp5.offload_param);
  CHECK(from_file(dir / "fsdp5_grad_op.json", R"({"fsdp": true, "fsdp_config": {"reshard_after_forward": false}})")
            .sharding == "zero2");
  CHECK(error_from_file(dir / "fsdp_xla.json", R"({"fsdp": true, "fsdp_config": {"xla": true}})").find("xla") !=
        std::string::npos);
}

TEST_CASE("a settings file in HF's forms: a foreign setting off HF's default, or a bad list, is refused by name") {
  const auto dir = loom_test::tmp_dir("config/hf_settings_refused");
  std::filesystem::create_directories(dir);
  const std::string compile = error_from_file(dir / "compile.json", R"({"torch_compile": true})");
  CHECK(compile.starts_with("loom: " + (dir / "compile.json").string() +
                            ": JSON key 'torch_compile' is a transformers.TrainingArguments field that loom does not "
                            "take: it compiles a Python model with TorchDynamo"));
  CHECK(compile.ends_with("(given true; read only as false, HF's default)"));
  CHECK(error_from_file(dir / "hub.json", R"({"hub_token": "hf_secret"})")
            .ends_with("(given \"hf_secret\"; read only as null or \"<HUB_TOKEN>\")"));
  CHECK(error_from_file(dir / "accel.json", R"({"accelerator_config": {"split_batches": true}})")
            .find("JSON key 'accelerator_config' is a transformers.TrainingArguments field") != std::string::npos);
  // Both values of enable_jit_checkpoint are what loom does.
  CHECK(from_file(dir / "jit.json", R"({"enable_jit_checkpoint": true})").given.ignored() ==
        std::vector<std::string>{"enable_jit_checkpoint"});
  // A list that is not a list of words is the field's own type error.
  CHECK(error_from_file(dir / "list.json", R"({"report_to": [1]})") ==
        "loom: " + (dir / "list.json").string() + ": JSON key 'report_to' expects a string, got an array");
  // Still unknown: a key neither loom's nor HF's.
  CHECK(error_from_file(dir / "zzz.json", R"({"zzz": 1})") == "loom: " + (dir / "zzz.json").string() +
                                                                  ": unknown JSON key 'zzz'");
}

TEST_CASE("HF 5's flags: activation_checkpointing, torch_empty_cache_steps, and the values loom refuses") {
  using config_test::error_of;
  using config_test::parsed;
  CHECK(parsed({"--activation_checkpointing"}).gradient_checkpointing);
  CHECK_FALSE(parsed({"--activation_checkpointing", "false", "--gradient_checkpointing"}).gradient_checkpointing);
  CHECK(parsed({"--gradient_checkpointing"}).activation_checkpointing == true);  // mirrored, as HF
  CHECK(parsed({"--activation_checkpointing_kwargs", R"({"use_reentrant": true})"}).gradient_checkpointing_kwargs ==
        R"({"use_reentrant": true})");
  CHECK(error_of({"--activation_checkpointing_kwargs", R"({"every_n_layers": 2})"}).starts_with("loom: "));
  CHECK(parsed({"--torch_empty_cache_steps", "10"}).torch_empty_cache_steps == 10);
  CHECK(error_of({"--torch_empty_cache_steps", "0"}) ==
        "loom: --torch_empty_cache_steps must be a positive number of steps, got 0");
  CHECK(error_of({"--dataloader_in_order", "false"}).starts_with(
      "loom: --dataloader_in_order false (batches as soon as a worker has them) is not honoured"));
  CHECK(error_of({"--eval_do_concat_batches", "false"}).starts_with(
      "loom: --eval_do_concat_batches false (a list of per-batch predictions) is not honoured"));
  CHECK(error_of({"--dataloader_persistent_workers", "--ddp_static_graph", "--use_cache"}).empty());
}
