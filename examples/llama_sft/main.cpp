// LoRA fine-tuning of a Llama-architecture model on instruction data, as TRL's SFTTrainer
// does it on top of HF's Trainer: a frozen base (an HF folder of any family loom/models/llama.hpp
// reads: llama, qwen2, qwen3, mistral, phi3, gemma, gemma2, gemma3_text, mixtral, qwen3_moe; or a
// random Llama sized by the flags), a LoRA adapter (TRL's --use_peft / --lora_* flags, on by
// default here, on PEFT's default targets for the family: q_proj and v_proj; PEFT has none for
// phi3 and qwen3_moe, so there --lora_target_modules names them, e.g. qkv_proj), prompt +
// completion examples whose loss counts the completion tokens only, packed into windows with
// position ids that restart at each example (attention stays within an example), bf16,
// evaluation loss on the held-out completions, checkpoints holding the adapter alone, resume.
// At the end: PEFT's adapter folder in --output_dir (peft.PeftModel.from_pretrained opens it
// onto the base its adapter_config.json names: --model_name_or_path, or the random base this
// run saved in <output_dir>/base) and, with --lora_save_merged, the merged model in
// <output_dir>/merged.
//
// The data, once (a few seconds): KJV instructions ("Book chapter:verse" -> the verse, a verse
// -> the next one) tokenized with their loss masks:
//   make llama-sft-data                  # writes data/kjv_sft
// With a pretrained folder, tokenize with its own tokenizer.json (prepare.py --tokenizer):
//   .venv/bin/python examples/text_data/prepare.py --sft data/kjv_sft/instructions.jsonl \
//       --tokenizer my-qwen3 --out data/kjv_sft_qwen3
//
// Then:
//   build/examples/llama_sft                                  # random 4-layer base, LoRA r=16, bf16
//   build/examples/llama_sft --model_name_or_path my-qwen3 --data_dir data/kjv_sft_qwen3   # any family's folder
//   build/examples/llama_sft --model_name_or_path my-phi3 --lora_target_modules qkv_proj
//   build/examples/llama_sft --use_peft false                 # full fine-tuning instead
//   build/examples/llama_sft --load_in_4bit --use_bnb_nested_quant   # QLoRA: an NF4 base under the adapter
//   build/examples/llama_sft --packing 0                      # one example per row, padded per batch
//   build/examples/llama_sft --do_eval --model_name_or_path output/llama_sft/merged --use_peft false \
//       --predict_with_generate                               # eval_exact_match (text) of generated completions,
//                                                             # each in <output_dir>/eval_generations.jsonl
//   build/examples/llama_sft --do_train --prompt "Genesis 1:1"   # train, then print the prompt's completion
//   build/examples/llama_sft --model_name_or_path output/llama_sft/merged --use_peft false \
//       --prompt "Exodus 20:13"                               # generation only (no --do_train / --do_eval)
//   build/examples/llama_sft --resume_from_checkpoint latest
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/llama_sft --sharding zero2
//   build/examples/llama_sft --help                           # every flag
//
// The loss is the mean over the completion tokens of a batch, and num_items counts them, so
// gradient accumulation and data parallelism normalize by completion tokens across the whole
// global batch. Each decoder layer is a FullShard unit.
//
// --prompt is encoded with the data folder's tokenizer.json (a newline is appended when it ends
// in none, as kjv.py's instruction prompts end), continued greedily (or --do_sample) for up to
// --max_new_tokens, and decoded (examples/common/generate_text.hpp).

#include <loom/loom.hpp>
#include <loom/data/sft.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/generation.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora_arguments.hpp>

#include "../common/generate_text.hpp"
#include "../common/hf_example.hpp"
#include "../common/llama_example.hpp"
#include "../common/saved_base.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

/// Flags of this example, beside every TrainingArguments, LoraArguments and RandomBaseArguments flag.
struct ExampleArguments {
  std::string data_dir = "data/kjv_sft";  ///< folder with meta.json and the sft_* files (make llama-sft-data)
  int64_t packing = 256;                  ///< tokens per packed window; 0: one example per row, padded
  int64_t max_length = 256;               ///< padded rows keep at most this many tokens

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with meta.json and the sft_* token files (make llama-sft-data writes data/kjv_sft)"},
      {"packing", "tokens per packed window (examples never split; attention stays within each); 0: padded rows"},
      {"max_length", "without packing: an example keeps at most this many tokens"},
  };
  static constexpr std::string_view help_heading = "example";
};

using loom::data::CausalLMBatch;
using loom::models::LlamaForCausalLM;

/// The trainer: the loss normalized by completion tokens (the shifted labels that count).
/// Sharding and precision: those --sharding and --bf16 / --fp16 name when the run starts.
struct SFTTrainer
    : loom::Trainer<SFTTrainer, LlamaForCausalLM, loom::sharding::FromArgs, loom::precision::FromArgs> {
  using Trainer::Trainer;

  /// The data folder's tokenizer, which decodes the generated completions, and the ids that end
  /// one (with --predict_with_generate).
  std::shared_ptr<const loom::data::Tokenizer> tokenizer;
  std::vector<int64_t> stop_ids;
  /// The last evaluation's completions and references as text (with --predict_with_generate).
  std::vector<std::pair<std::string, std::string>> generations;

  /// With --predict_with_generate, of the held-out completions generated greedily from each
  /// prompt: exact_match, the share whose decoded text equals the reference's (both stripped,
  /// HF evaluate's exact_match: a model may spell the same text with other tokens), and
  /// token_exact_match, the share generated token for token through the end of text; rougeL
  /// and bleu of the same texts.
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    if (!this->args().predict_with_generate) return {};
    loom::Metrics m;
    if (tokenizer) {
      const auto predictions = p.predictions.to(torch::kCPU).contiguous();
      const auto references = p.label_ids.to(torch::kCPU).contiguous();
      std::vector<std::string> texts, wanted;
      generations.clear();
      for (int64_t r = 0; r < predictions.size(0); ++r) {
        const auto* row = predictions[r].template data_ptr<int64_t>();
        // The batches' widths differ: the evaluation pads their concatenation with -100.
        std::vector<int64_t> ids;
        for (int64_t k = 0; k < predictions.size(1); ++k)
          if (row[k] != loom::data::ignore_index) ids.push_back(row[k]);
        const auto stop = std::find_if(ids.begin(), ids.end(), [&](int64_t t) {
          return std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end();
        });
        if (stop != ids.end()) ids.erase(stop + 1, ids.end());
        const auto* ref = references[r].template data_ptr<int64_t>();
        std::vector<int64_t> reference;
        for (int64_t k = 0; k < references.size(1); ++k)
          if (ref[k] != loom::data::ignore_index) reference.push_back(ref[k]);
        texts.push_back(hf_example::python_strip(tokenizer->decode(ids)));
        wanted.push_back(hf_example::python_strip(tokenizer->decode(reference)));
        generations.emplace_back(texts.back(), wanted.back());
      }
      m.set("exact_match", loom::metrics::exact_match(texts, wanted));
      // As HF evaluate's "rouge" (rouge-score, no stemmer; each pair's F averaged, 0-1) and
      // "sacrebleu" (corpus BLEU, 0-100) report them.
      m.set("rougeL", loom::metrics::rouge_l(texts, wanted));
      m.set("bleu", loom::metrics::corpus_bleu(texts, {wanted}).score);
    }
    m.set("token_exact_match", loom::metrics::sequence_exact_match(p.predictions, p.label_ids));
    return m;
  }
};

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults (any flag overrides them): LoRA r=16 on q_proj and v_proj, bf16,
    // a cosine schedule, evaluation and checkpoints every 100 steps.
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/llama_sft";
    defaults.bf16 = true;
    defaults.learning_rate = 2e-3;
    defaults.lr_scheduler_type = "cosine";
    defaults.warmup_steps = 20;
    defaults.per_device_train_batch_size = 4;
    defaults.per_device_eval_batch_size = 8;
    defaults.num_train_epochs = 1;
    defaults.max_steps = 300;
    defaults.logging_steps = 25;
    defaults.eval_strategy = "steps";
    defaults.eval_steps = 100;
    defaults.save_strategy = "steps";
    defaults.save_steps = 100;
    defaults.save_total_limit = 2;
    defaults.prediction_loss_only = true;  // evaluation keeps the loss, not [batch, seq, vocab] logits
    loom::peft::LoraArguments lora_defaults;
    lora_defaults.use_peft = true;  // PEFT's default targets for the model type (q_proj, v_proj)
    auto [example, shape, gen, lora_args, args] =
        loom::parse_args(argc, argv, ExampleArguments{}, llama_example::RandomBaseArguments{},
                         hf_example::GenerateArguments{}, lora_defaults, defaults);
    loom::check(example.packing >= 0, "--packing must be 0 (padded rows) or a window size, got {}", example.packing);
    loom::check(example.max_length > 1, "--max_length must be at least 2, got {}", example.max_length);
    // The window sizes the random base's position table: named here, not as its config field.
    for (const auto& [flag, value] : {std::pair{"packing", example.packing}, std::pair{"max_length", example.max_length}})
      loom::check(value <= loom::models::ConfigLimits::positions,
                  "--{} {} is longer than {} tokens, the longest sequence loom builds a model for", flag, value,
                  loom::models::ConfigLimits::positions);
    // Generation in evaluation hands compute_metrics the generated completions (not logits).
    if (args.predict_with_generate) args.prediction_loss_only = false;
    const bool generate_only = hf_example::generate_only(gen, args);  // a prompt alone only generates
    hf_example::apply_script_rules(args, "llama_sft", /*train_by_default=*/!generate_only);
    const bool main_process = hf_example::is_main_process();

    // The base's configuration before any data: a folder's config.json, else the flags.
    const auto meta = hf_example::read_token_folder(example.data_dir);
    const auto config = llama_example::base_config(args, shape, meta, example.data_dir,
                                                   std::max(example.packing, example.max_length));

    loom::data::SftOptions data_options;
    data_options.dtype = meta.dtype;
    data_options.vocab_size = meta.vocab_size;
    data_options.pad_token_id = meta.pad_token_id.value_or(0);
    data_options.max_length = example.max_length;
    if (example.packing > 0) data_options.packing = example.packing;
    const loom::data::SftDataset train_set(meta.sft_files("train"), data_options);
    auto eval_options = data_options;
    if (args.predict_with_generate) eval_options.packing.reset();  // one example per row to generate from
    const loom::data::SftDataset eval_set(meta.sft_files("val"), eval_options);

    loom::set_seed(args.seed);
    // An adapter goes onto its base: a random base is saved as <output_dir>/base (an HF folder)
    // and named in adapter_config.json, as a folder given is. A resumed run continues on the
    // base its checkpoint's adapter names; a fresh one never replaces a base earlier
    // checkpoints were trained on (examples/common/saved_base.hpp).
    const bool lora = loom::peft::lora_config_from_args(lora_args, config.model_type).has_value();
    const auto saved_base = std::filesystem::path(args.output_dir) / "base";
    const auto base_plan = saved_base::plan(args, lora, saved_base);
    if (base_plan.resumed_base) args.model_name_or_path = base_plan.resumed_base;
    std::optional<std::string> base = args.model_name_or_path;
    const std::string origin = base ? *base : std::string("random init");
    // Under FullShard the model is built without memory (loom::DeferredInit) and each rank
    // materializes only its slices (a 4-bit base: each layer quantized whole, one at a time,
    // and only this rank's shard of its 4-bit bytes kept); with --load_in_4bit under any policy
    // too, so that each layer is quantized as it is read and the float base is never whole
    // (transformers' from_pretrained with load_in_4bit). Not when this program must write the
    // random base whole first.
    const bool shards = loom::sharding_chosen(args).shards_parameters;
    const bool deferred = (shards || lora_args.load_in_4bit) && !(lora && !base);
    auto model = hf_example::pretrained_or_random<LlamaForCausalLM>(args, config, deferred);
    // The random base is written aside now (the Trainer may shard the model) and put in place
    // once the Trainer has accepted the run; a start that fails leaves output_dir as it was.
    std::optional<saved_base::Staged> staged;
    if (lora && !base) {
      base = saved_base.string();
      if (main_process && base_plan.save_random_base) staged.emplace(model, saved_base);
    }
    const auto adapter = loom::peft::prepare_lora(*model, lora_args, model->config().model_type, base);
    if (main_process) {
      fmt::print("llama_sft: {} training examples ({} {}), {} held out, {} completion tokens to learn from {}\n",
                 train_set.examples(), train_set.size(),
                 train_set.packed() ? fmt::format("windows of {} tokens", example.packing) : std::string("rows"),
                 eval_set.examples(), train_set.completion_tokens(), example.data_dir);
      int64_t trainable = 0, total = 0;
      for (const auto& p : model->parameters()) (p.requires_grad() ? trainable : total) += p.numel();
      const auto four_bit = loom::peft::quantized_base(*model);  // --load_in_4bit: values held in 4 bits
      total += trainable + four_bit.values;
      const auto& c = model->config();
      fmt::print("llama_sft: {} ({}{}) with {} layers, width {}: {:.2f} M parameters, {} trainable ({:.2f}%){}{}\n",
                 model->architecture_name(), origin, !deferred ? "" : shards ? ", built without memory: each rank materializes its shards" : ", built without memory: each layer quantized as it is read", c.num_hidden_layers, c.hidden_size,
                 static_cast<double>(total) / 1e6, trainable, 100.0 * static_cast<double>(trainable) / static_cast<double>(total),
                 adapter ? fmt::format(", LoRA r={} alpha={}", adapter->r, adapter->lora_alpha) : std::string(", full fine-tuning"),
                 four_bit.layers == 0 ? std::string()
                                      : fmt::format(", a {} base of {} layers in {:.2f} MB ({:.3f} bytes a value)",
                                                    lora_args.bnb_4bit_quant_type, four_bit.layers,
                                                    static_cast<double>(four_bit.bytes) / 1e6,
                                                    static_cast<double>(four_bit.bytes) / static_cast<double>(four_bit.values)));
    }

    // As HF's run_clm / TRL's sft script: train, save, report, evaluate, report.
    if (!generate_only) {
      hf_example::check_generation_policy(gen, args);
      hf_example::check_generation_tokenizer(gen, args, meta.tokenizer_file, model->config().vocab_size);
      SFTTrainer trainer(args, model, train_set, eval_set);
      trainer.set_tokenizer_files(hf_example::tokenizer_files(meta));
      if (args.predict_with_generate) {
        trainer.tokenizer = std::make_shared<const loom::data::Tokenizer>(loom::data::Tokenizer::from_file(meta.tokenizer_file));
        trainer.stop_ids = loom::models::detail::token_ids(model->config().eos_token_id);
      }
      if (staged) staged->commit();  // <output_dir>/base, before the first checkpoint names it
      if (args.do_train) {
        auto result = trainer.train();
        trainer.save_model();  // the adapter (PEFT's files), or the full model with config.json
        if (adapter && lora_args.lora_save_merged) trainer.save_merged_model();  // <output_dir>/merged
        trainer.log_metrics("train", result.metrics);
        if (loom::peft::quantized_base(*model).layers > 0)  // each rank's own figure: FullShard keeps a shard
          fmt::print("llama_sft: rank {} holds the 4-bit base in {} bytes\n", trainer.world().rank,
                     static_cast<int64_t>(trainer.model_state_bytes().module_state));
      }
      if (args.do_eval) {
        auto metrics = trainer.evaluate();
        if (auto loss = metrics.get("eval_loss")) metrics.set("eval_perplexity", std::exp(*loss));
        trainer.log_metrics("eval", metrics);
        trainer.save_metrics("eval", metrics);
        if (main_process && !trainer.generations.empty()) {
          // Each held-out row's generated completion beside its reference (HF's predict()
          // returns the predictions; its scripts write them beside the metrics).
          const auto file = std::filesystem::path(args.output_dir) / "eval_generations.jsonl";
          std::ofstream out(file, std::ios::binary | std::ios::trunc);
          for (const auto& [completion, reference] : trainer.generations)
            out << nlohmann::json{{"completion", completion}, {"reference", reference},
                                  {"exact_match", completion == reference}}.dump() << "\n";
          loom::check(static_cast<bool>(out), "writing {} failed", file.string());
          fmt::print("llama_sft: {} generated completions -> {}\n", trainer.generations.size(), file.string());
        }
      }
    }
    if (gen.wanted() && main_process)  // a newline ends each prompt, as kjv.py's instruction prompts end
      hf_example::generate_outputs(model, meta.tokenizer_file, gen, args, "llama_sft", [](std::string p) {
        if (!std::isspace(static_cast<unsigned char>(p.back()))) p += '\n';
        return p;
      });
    if (main_process && !generate_only) fmt::print("outputs in {}\n", args.output_dir);
    return 0;
  });
}
