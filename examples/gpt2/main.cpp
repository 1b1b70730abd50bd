// GPT-2 (loom::models::GPT2LMHeadModel, Hugging Face's architecture and file format) trained
// as a causal language model on the King James Bible's BPE token files, evaluated on the
// held-out verses (eval_loss and eval_perplexity = exp(eval_loss)), saved as an HF folder that
// transformers.GPT2LMHeadModel.from_pretrained and AutoTokenizer open. HF's run_clm.py, in C++.
//
// The data, once (~15 s): kjv_text decodes Debian's bible-kjv-text, kjv.py tokenizes it:
//   make kjv-data                        # builds kjv_text, then runs the command below
//   .venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --out data/kjv
// Your own text works the same way: examples/text_data/prepare.py --text FILE... --out DIR, then
// --data_dir DIR.
//
// Then:
//   build/examples/gpt2                                    # the defaults below (bf16, ~2 min on 2 cores)
//   build/examples/gpt2 --model_name_or_path my-gpt2       # start from an HF folder instead of random weights
//   build/examples/gpt2 --n_layer 2 --n_embd 64 --max_steps 100 --bf16 false
//   build/examples/gpt2 --do_train --do_eval               # HF's script rules: resumes from output_dir's last checkpoint
//   build/examples/gpt2 --resume_from_checkpoint latest    # or a checkpoint-N folder
//   build/examples/gpt2 --do_train --prompt "And God said"  # train, then print the prompt's completion
//   build/examples/gpt2 --model_name_or_path output/gpt2 --prompt "And God said" --do_sample --top_k 20
//                                                          # generation only, sampled
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/gpt2 --sharding full_shard
//   build/examples/gpt2 --help                             # every flag
//
// The training windows are HF's group_texts: train.bin cut into non-overlapping blocks of
// --block_size tokens, labels equal to the inputs (the model shifts them). The loss is the
// mean over the predicted tokens, and num_items counts them as HF's shifted causal-LM loss
// does (labels[:, 1:] != -100), so gradient accumulation and data parallelism normalize by
// tokens. Without --model_name_or_path the model is GPT-2 with HF's initialization, sized by
// --n_layer / --n_head / --n_embd, --block_size positions and meta.json's vocabulary. Each
// transformer block is a FullShard unit (gathered only around its own forward and backward
// under --sharding full_shard).

#include <loom/loom.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/gpt2.hpp>

#include "../common/generate_text.hpp"
#include "../common/hf_example.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

/// Flags of this example, beside every TrainingArguments flag.
struct ExampleArguments {
  std::string data_dir = "data/kjv";  ///< folder with prepare.py's meta.json, train.bin, val.bin
  int64_t block_size = 128;           ///< tokens per training window (at most the model's n_positions)
  int64_t n_layer = 4;                ///< random init: transformer blocks
  int64_t n_head = 4;                 ///< random init: attention heads per block
  int64_t n_embd = 128;               ///< random init: model width
  double dropout = 0.0;               ///< random init: resid_pdrop, embd_pdrop and attn_pdrop

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with prepare.py's meta.json, train.bin and val.bin"},
      {"block_size", "tokens per training window (at most the model's n_positions)"},
      {"n_layer", "transformer blocks (random init, without --model_name_or_path)"},
      {"n_head", "attention heads per block (random init)"},
      {"n_embd", "model width (random init)"},
      {"dropout", "resid_pdrop, embd_pdrop and attn_pdrop (random init)"},
  };
  static constexpr std::string_view help_heading = "example";
};

using loom::data::CausalLMBatch;
using loom::models::GPT2LMHeadModel;

// The sharding and precision policies are the ones --sharding and --bf16 / --fp16 name when
// the run starts (sharding::FromArgs, precision::FromArgs). The model's forward(batch) returns
// {loss, logits}, so the Trainer's default compute_loss is the model's loss.
/// The trainer: every hook is the default (num_items counts a CausalLMBatch's predicted
/// tokens, HF's normalization).
struct GPT2Trainer
    : loom::Trainer<GPT2Trainer, GPT2LMHeadModel, loom::sharding::FromArgs, loom::precision::FromArgs> {
  using Trainer::Trainer;
};

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults; any flag on the command line overrides them. Sized for about
    // two minutes on 2 idle CPU cores (7.6k tokens/s): one epoch of the KJV (929k tokens with
    // kjv.py's 8192-token vocabulary) in 454 updates of 2 x 8 windows of 128 tokens.
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/gpt2";
    defaults.bf16 = true;
    defaults.learning_rate = 2e-3;
    defaults.weight_decay = 0.1;
    defaults.adam_beta2 = 0.99;
    defaults.lr_scheduler_type = "cosine";
    defaults.warmup_steps = 30;
    defaults.per_device_train_batch_size = 8;
    defaults.per_device_eval_batch_size = 32;
    defaults.gradient_accumulation_steps = 2;
    defaults.num_train_epochs = 1;
    defaults.logging_steps = 50;
    defaults.eval_strategy = "steps";
    defaults.eval_steps = 150;
    defaults.save_strategy = "steps";
    defaults.save_steps = 150;
    defaults.save_total_limit = 2;
    defaults.prediction_loss_only = true;  // evaluation keeps the loss, not [batch, block, vocab] logits
    auto [example, gen, args] = loom::parse_args(argc, argv, ExampleArguments{}, hf_example::GenerateArguments{}, defaults);
    loom::check(example.block_size > 0, "--block_size must be positive, got {}", example.block_size);
    loom::check(example.n_layer > 0, "--n_layer must be positive, got {}", example.n_layer);
    loom::check(example.n_head > 0, "--n_head must be positive, got {}", example.n_head);
    loom::check(example.n_embd > 0 && example.n_embd % example.n_head == 0,
                "--n_embd must be a positive multiple of --n_head {}, got {}", example.n_head, example.n_embd);
    loom::check(example.dropout >= 0 && example.dropout < 1, "--dropout must lie in [0, 1), got {}", example.dropout);
    const bool generate_only = hf_example::generate_only(gen, args);  // a prompt alone only generates
    hf_example::apply_script_rules(args, "gpt2", /*train_by_default=*/!generate_only);
    const bool main_process = hf_example::is_main_process();

    // The model's configuration before any data: a folder's config.json, else the flags.
    const auto meta = hf_example::read_token_folder(example.data_dir);
    loom::models::GPT2Config config;
    if (args.model_name_or_path) {
      config = loom::models::read_hf_config<loom::models::GPT2Config>(*args.model_name_or_path);
      loom::check(config.vocab_size >= meta.vocab_size,
                  "--model_name_or_path {} has vocab_size {}, but the token files of {} use {} ids",
                  *args.model_name_or_path, config.vocab_size, example.data_dir, meta.vocab_size);
      loom::check(generate_only || example.block_size <= config.n_positions,
                  "--block_size {} exceeds --model_name_or_path {}'s n_positions {}", example.block_size,
                  *args.model_name_or_path, config.n_positions);
    } else {
      config.vocab_size = meta.vocab_size;
      config.n_positions = example.block_size;
      config.n_layer = example.n_layer;
      config.n_head = example.n_head;
      config.n_embd = example.n_embd;
      config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = example.dropout;
      config.bos_token_id = config.eos_token_id = meta.eos_token_id;
    }

    loom::set_seed(args.seed);
    const loom::data::TokenFileDataset train_set(meta.lm_file("train"), meta.lm_options(example.block_size));
    const loom::data::TokenFileDataset eval_set(meta.lm_file("val"), meta.lm_options(example.block_size));
    const std::string origin = args.model_name_or_path ? *args.model_name_or_path : std::string("random init");
    auto model = hf_example::pretrained_or_random<GPT2LMHeadModel>(args, config);
    if (main_process) {
      fmt::print("gpt2: {} training and {} held-out windows of {} tokens from {} (vocabulary {})\n", train_set.size(),
                 eval_set.size(), example.block_size, example.data_dir, meta.vocab_size);
      const auto& c = model->config();
      fmt::print("gpt2: GPT2LMHeadModel ({}) with {} layers, {} heads, width {}: {:.2f} M parameters\n", origin,
                 c.n_layer, c.n_head, c.n_embd, static_cast<double>(hf_example::count_parameters(*model)) / 1e6);
    }

    // As HF's run_clm: train, save the model, report, evaluate (perplexity), report.
    if (!generate_only) {
      hf_example::check_generation_policy(gen, args);
      hf_example::check_generation_tokenizer(gen, args, meta.tokenizer_file, model->config().vocab_size);
      GPT2Trainer trainer(args, model, train_set, eval_set);
      trainer.set_tokenizer_files(hf_example::tokenizer_files(meta));  // saved beside the weights
      if (args.do_train) {
        auto result = trainer.train();
        trainer.save_model();  // model.safetensors, config.json, the tokenizer: a folder transformers opens
        trainer.log_metrics("train", result.metrics);
        if (main_process)
          if (auto sps = result.metrics.get("train_samples_per_second"))
            fmt::print("gpt2: training throughput {:.0f} tokens/s\n", *sps * static_cast<double>(example.block_size));
      }
      if (args.do_eval) {
        auto metrics = trainer.evaluate();
        if (auto loss = metrics.get("eval_loss")) metrics.set("eval_perplexity", std::exp(*loss));
        trainer.log_metrics("eval", metrics);
        trainer.save_metrics("eval", metrics);
      }
    }
    if (gen.wanted() && main_process)
      hf_example::generate_outputs(model, meta.tokenizer_file, gen, args, "gpt2", [](std::string p) { return p; });
    if (main_process && !generate_only) fmt::print("outputs in {}\n", args.output_dir);
    return 0;
  });
}
