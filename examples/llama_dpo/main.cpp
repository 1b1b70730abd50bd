// Preference training of a Llama-architecture model, as TRL's DPOTrainer and RewardTrainer do
// it on top of HF's Trainer (loom/methods/): pairs of a prompt with a chosen and a rejected
// completion, as prepare.py --preference writes them.
//   --task dpo (default): the causal LM learns to prefer each chosen completion, against a
//     frozen reference (TRL's DPOConfig flags: --beta, --loss_type, --precompute_ref_log_probs,
//     ...). With LoRA (the default here, TRL's --use_peft / --lora_* flags) the reference is
//     the base with the adapter off; with --use_peft false, a frozen copy of the model given.
//   --task reward: a sequence classifier with one label (LlamaForSequenceClassification, the
//     body read from --model_name_or_path, the score head new) learns to score each chosen
//     completion above the rejected one (--center_rewards_coefficient). Full fine-tuning by
//     default; the saved folder opens in transformers' AutoModelForSequenceClassification.
// At the end: the adapter (PEFT's folder, onto --model_name_or_path or the random base this run
// saved in <output_dir>/base) or the full model in --output_dir, and the held-out pairs'
// metrics (eval_rewards/accuracies for DPO, eval_accuracy for a reward model).
//
// The data, once (seconds): KJV preference pairs ("Book chapter:verse" -> that verse, chosen,
// or a verse from elsewhere, rejected), tokenized with their completion masks:
//   make dpo-data                                     # writes data/kjv_dpo
//
// Then:
//   build/examples/llama_dpo                          # random 4-layer base, LoRA r=16, DPO (sigmoid)
//   build/examples/llama_dpo --model_name_or_path output/llama_sft/merged   # DPO after SFT (make llama-sft)
//   build/examples/llama_dpo --use_peft false --loss_type ipo               # full fine-tuning, IPO
//   build/examples/llama_dpo --task reward --output_dir output/llama_reward  # a reward model
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/llama_dpo --sharding zero2
//   build/examples/llama_dpo --help                   # every flag
//
// Each decoder layer is a FullShard unit.

#include <loom/loom.hpp>
#include <loom/data/preference.hpp>
#include <loom/data/token_file.hpp>
#include <loom/methods/dpo.hpp>
#include <loom/methods/reward.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora_arguments.hpp>

#include "../common/hf_example.hpp"
#include "../common/llama_example.hpp"
#include "../common/saved_base.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

/// Flags of this example, beside every TrainingArguments, LoraArguments, RandomBaseArguments,
/// DPOArguments and RewardArguments flag.
struct ExampleArguments {
  std::string data_dir = "data/kjv_dpo";  ///< folder with meta.json and the pref_* files (make dpo-data)
  std::string task = "dpo";               ///< dpo, or reward (a reward model)
  int64_t max_length = 256;               ///< each side keeps at most this many tokens

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with meta.json and the pref_* token files (make dpo-data writes data/kjv_dpo)"},
      {"task", "dpo (the causal LM, against a frozen reference), or reward (a reward model, one label)"},
      {"max_length", "each side of a pair keeps at most this many tokens (prompt and completion)"},
  };
  static constexpr std::string_view help_heading = "example";
};

using loom::models::LlamaForCausalLM;
using loom::models::LlamaForSequenceClassification;
using Sharding = loom::sharding::FromArgs;
using Precision = loom::precision::FromArgs;

namespace {

// Train, save, report, evaluate, report (HF's example flow), on either method's trainer.
template <class Trainer>
void run(Trainer& trainer, const loom::TrainingArguments& args, bool merged) {
  if (args.do_train) {
    auto result = trainer.train();
    trainer.save_model();  // the adapter (PEFT's files), or the full model with config.json
    if (merged) trainer.save_merged_model();  // <output_dir>/merged
    trainer.log_metrics("train", result.metrics);
  }
  if (args.do_eval) {
    auto metrics = trainer.evaluate();
    trainer.log_metrics("eval", metrics);
    trainer.save_metrics("eval", metrics);
  }
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults (any flag overrides them): LoRA r=16 on q_proj and v_proj for
    // DPO, bf16, a cosine schedule, evaluation and checkpoints every 100 steps.
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/llama_dpo";
    defaults.bf16 = true;
    defaults.learning_rate = 5e-4;
    defaults.lr_scheduler_type = "cosine";
    defaults.warmup_steps = 10;
    defaults.per_device_train_batch_size = 4;
    defaults.per_device_eval_batch_size = 8;
    defaults.num_train_epochs = 1;
    defaults.max_steps = 200;
    defaults.logging_steps = 20;
    defaults.eval_strategy = "steps";
    defaults.eval_steps = 100;
    defaults.save_strategy = "steps";
    defaults.save_steps = 100;
    defaults.save_total_limit = 2;
    defaults.prediction_loss_only = true;  // the metrics are the methods' own, logged beside the loss
    loom::peft::LoraArguments lora_defaults;
    lora_defaults.use_peft = true;  // PEFT's default targets for the model type: q_proj, v_proj
    auto [example, shape, lora_args, dpo, reward, args] =
        loom::parse_args(argc, argv, ExampleArguments{}, llama_example::RandomBaseArguments{}, lora_defaults,
                         loom::methods::DPOArguments{}, loom::methods::RewardArguments{}, defaults);
    loom::check(example.task == "dpo" || example.task == "reward", "--task must be dpo or reward, got '{}'",
                example.task);
    const bool reward_task = example.task == "reward";
    loom::check(example.max_length > 1 && example.max_length <= loom::models::ConfigLimits::positions,
                "--max_length must be in [2, {}], got {}", loom::models::ConfigLimits::positions, example.max_length);
    // A reward model trains whole by default (the score head is new); --use_peft true asks
    // for LoRA with the head trained beside it (PEFT's SEQ_CLS).
    if (reward_task && !lora_args.given.contains("use_peft")) lora_args.use_peft = false;
    if (reward_task && lora_args.use_peft) lora_args.lora_task_type = "SEQ_CLS";
    hf_example::apply_script_rules(args, "llama_dpo");
    const bool main_process = hf_example::is_main_process();

    const auto meta = hf_example::read_token_folder(example.data_dir);
    loom::check(meta.preference.contains("train"),
                "--data_dir {}: no preference pairs in meta.json; make them with `make dpo-data` or "
                "examples/text_data/prepare.py --preference FILE.jsonl --out {}",
                example.data_dir, example.data_dir);
    auto config = llama_example::base_config(args, shape, meta, example.data_dir, example.max_length);
    if (!config.pad_token_id) config.pad_token_id = meta.pad_token_id;

    loom::data::SftOptions data_options;
    data_options.dtype = meta.dtype;
    data_options.vocab_size = meta.vocab_size;
    data_options.pad_token_id = config.pad_token_id.value_or(0);
    data_options.max_length = example.max_length;
    const loom::data::PreferenceDataset train_set(meta.preference_files("train"), data_options);
    const loom::data::PreferenceDataset eval_set(meta.preference_files("val"), data_options);

    loom::set_seed(args.seed);
    const bool lora = loom::peft::lora_config_from_args(lora_args, config.model_type).has_value();
    const auto saved_base = std::filesystem::path(args.output_dir) / "base";
    const auto base_plan = saved_base::plan(args, lora, saved_base);
    if (base_plan.resumed_base) args.model_name_or_path = base_plan.resumed_base;
    std::optional<std::string> base = args.model_name_or_path;
    const std::string origin = base ? *base : std::string("random init");

    // Builds the model, its adapter and the trainer of one task, then runs it.
    const auto train_with = [&](auto model, auto make_trainer) {
      std::optional<saved_base::Staged> staged;
      if (lora && !base) {
        base = saved_base.string();
        if (main_process && base_plan.save_random_base) staged.emplace(model, saved_base);
      }
      const auto adapter = loom::peft::prepare_lora(*model, lora_args, model->config().model_type, base);
      if (main_process) {
        const int64_t total = hf_example::count_parameters(*model);
        int64_t trainable = 0;
        for (const auto& p : model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
        fmt::print("llama_dpo: {} of {} ({}), {} layers, width {}: {:.2f} M parameters, {} trainable{}; {} training "
                   "pairs, {} held out, from {}\n",
                   example.task, model->architecture_name(), origin, model->config().num_hidden_layers,
                   model->config().hidden_size, static_cast<double>(total) / 1e6, trainable,
                   adapter ? fmt::format(" (LoRA r={} alpha={})", adapter->r, adapter->lora_alpha)
                           : std::string(" (full fine-tuning)"),
                   train_set.size(), eval_set.size(), example.data_dir);
      }
      auto trainer = make_trainer(model);
      trainer->set_tokenizer_files(hf_example::tokenizer_files(meta));
      if (staged) staged->commit();  // <output_dir>/base, before the first checkpoint names it
      run(*trainer, args, adapter && lora_args.lora_save_merged);
    };
    if (reward_task) {
      auto model = args.model_name_or_path
                       ? LlamaForSequenceClassification::from_pretrained(*args.model_name_or_path, torch::kFloat, 1)
                       : LlamaForSequenceClassification([&] {
                           auto c = config;
                           c.num_labels = 1;
                           return c;
                         }());
      args.model_name_or_path.reset();
      train_with(model, [&](LlamaForSequenceClassification m) {
        return std::make_unique<loom::methods::RewardTrainer<LlamaForSequenceClassification, Sharding, Precision>>(
            reward, args, m, train_set, eval_set);
      });
    } else {
      auto model = hf_example::pretrained_or_random<LlamaForCausalLM>(args, config);
      train_with(model, [&](LlamaForCausalLM m) {
        return std::make_unique<loom::methods::DPOTrainer<LlamaForCausalLM, Sharding, Precision>>(dpo, args, m,
                                                                                                  train_set, eval_set);
      });
    }
    if (main_process) fmt::print("outputs in {}\n", args.output_dir);
    return 0;
  });
}
