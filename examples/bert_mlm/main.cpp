// BERT pretrained (or pretraining continued) with the masked-language-model objective
// (loom::models::BertForMaskedLM, Hugging Face's architecture and file format) on the verses
// of the King James Bible: HF's run_mlm.py, in C++. Each batch is masked as transformers'
// DataCollatorForLanguageModeling masks it (15 % of the tokens selected, of those 80 %
// [MASK], 10 % a random token, 10 % unchanged; [CLS], [SEP], [MASK], padding and end of text
// never), by loom::data::MaskedLMDataset, which keys each batch's mask on its place in the run:
// a resumed run masks what the uninterrupted one masked. Evaluated on the held-out verses
// (masked the same way every evaluation) with the loss, perplexity = exp(eval_loss) and the
// accuracy of the predicted masked tokens, as run_mlm.py reports them.
//
// The data (make kjv-data writes data/kjv; the classification files hold [CLS] verse [SEP]):
//   build/examples/bert_mlm                                   # random init, the defaults below
//   build/examples/bert_mlm --model_name_or_path my-bert-mlm  # continue from an HF folder
//                                                             # (BertForMaskedLM or BertForPreTraining)
//   build/examples/bert_mlm --mlm_probability 0.3 --max_steps 200 --bf16
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/bert_mlm --sharding zero2
//   build/examples/bert_mlm --help                            # every flag
//
// The output folder is an HF BertForMaskedLM folder (config.json, model.safetensors, the
// tokenizer): transformers' pipeline("fill-mask") opens it.

#include <loom/loom.hpp>
#include <loom/data/mlm.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/bert.hpp>

#include "../common/bert_example.hpp"
#include "../common/hf_example.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

/// Flags of this example, beside every TrainingArguments flag.
struct ExampleArguments {
  std::string data_dir = "data/kjv";   ///< folder with kjv.py's meta.json and classify_* files
  int64_t max_seq_length = 128;        ///< ids per example after truncation ([CLS] and [SEP] included)
  double mlm_probability = 0.15;       ///< share of the tokens selected for prediction (HF's)
  double mask_replace_prob = 0.8;      ///< share of the selected tokens replaced by [MASK]
  double random_replace_prob = 0.1;    ///< share of the selected tokens replaced by a random token
  int64_t num_hidden_layers = 2;       ///< random init: encoder layers
  int64_t hidden_size = 128;           ///< random init: width
  int64_t num_attention_heads = 4;     ///< random init: heads per layer
  int64_t intermediate_size = 512;     ///< random init: feed-forward width
  double dropout = 0.1;                ///< random init: hidden_dropout_prob and attention_probs_dropout_prob

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with kjv.py's meta.json and classify_{train,val} files"},
      {"max_seq_length", "ids per example after truncation ([CLS] and [SEP] included)"},
      {"mlm_probability", "share of the tokens selected for prediction"},
      {"mask_replace_prob", "share of the selected tokens replaced by [MASK]"},
      {"random_replace_prob", "share of the selected tokens replaced by a random token"},
      {"num_hidden_layers", "encoder layers (random init, without --model_name_or_path)"},
      {"hidden_size", "width (random init)"},
      {"num_attention_heads", "attention heads per layer (random init)"},
      {"intermediate_size", "feed-forward width (random init)"},
      {"dropout", "hidden_dropout_prob and attention_probs_dropout_prob (random init)"},
  };
  static constexpr std::string_view help_heading = "example";
};

using loom::models::BertForMaskedLM;

/// The trainer: the masked tokens' accuracy in evaluation, from each batch's predicted ids
/// (preprocess_logits_for_metrics keeps them instead of the [batch, seq, vocab] logits, as HF's
/// run_mlm.py does). Sharding and precision: those --sharding and --bf16 / --fp16 name when the
/// run starts.
struct MlmTrainer
    : loom::Trainer<MlmTrainer, BertForMaskedLM, loom::sharding::FromArgs, loom::precision::FromArgs> {
  using Trainer::Trainer;

  /// The predicted token ids.
  torch::Tensor preprocess_logits_for_metrics(const torch::Tensor& logits, const torch::Tensor& /*labels*/) {
    return logits.argmax(-1);
  }

  /// The share of masked tokens predicted right (labels -100 are not counted).
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    return {{"accuracy", loom::metrics::accuracy(p.predictions, p.label_ids)}};
  }
};

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults; any flag on the command line overrides them.
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/bert_mlm";
    defaults.learning_rate = 5e-4;
    defaults.weight_decay = 0.01;
    defaults.lr_scheduler_type = "linear";
    defaults.warmup_steps = 100;
    defaults.per_device_train_batch_size = 32;
    defaults.per_device_eval_batch_size = 64;
    defaults.num_train_epochs = 1;
    defaults.logging_steps = 100;
    defaults.eval_strategy = "epoch";
    defaults.save_strategy = "no";
    auto [example, args] = loom::parse_args(argc, argv, ExampleArguments{}, defaults);
    bert_example::check_size_flags(example, 3, "[CLS], a token, [SEP]");
    hf_example::apply_script_rules(args, "bert_mlm");
    const bool main_process = hf_example::is_main_process();

    const auto meta = hf_example::read_token_folder(example.data_dir);
    loom::check(meta.mask_token_id.has_value(),
                "{}/meta.json names no mask_token_id; masked-LM data needs a tokenizer with a [MASK] token "
                "(examples/text_data/prepare.py writes its id)", example.data_dir);
    loom::models::BertConfig config;
    if (args.model_name_or_path) {
      config = loom::models::read_hf_config<loom::models::BertConfig>(*args.model_name_or_path);
      loom::check(config.vocab_size >= meta.vocab_size,
                  "--model_name_or_path {} has vocab_size {}, but the token files of {} use {} ids",
                  *args.model_name_or_path, config.vocab_size, example.data_dir, meta.vocab_size);
      loom::check(example.max_seq_length <= config.max_position_embeddings,
                  "--max_seq_length {} exceeds --model_name_or_path {}'s max_position_embeddings {}",
                  example.max_seq_length, *args.model_name_or_path, config.max_position_embeddings);
    } else {
      config = bert_example::random_config(example, meta);
    }

    // The masking rule: every special token of the data's tokenizer stays as it is.
    loom::data::MaskedLMOptions masking{.mlm_probability = example.mlm_probability,
                                        .mask_replace_prob = example.mask_replace_prob,
                                        .random_replace_prob = example.random_replace_prob,
                                        .mask_token_id = *meta.mask_token_id,
                                        .vocab_size = meta.vocab_size,
                                        .special_token_ids = {},
                                        .seed = static_cast<uint64_t>(args.data_seed.value_or(args.seed))};
    for (const auto& id : {meta.eos_token_id, meta.pad_token_id, meta.cls_token_id, meta.sep_token_id,
                           meta.mask_token_id})
      if (id) masking.special_token_ids.push_back(*id);

    loom::set_seed(args.seed);
    const auto options = meta.sequence_options(example.max_seq_length);
    const loom::data::MaskedLMDataset train_set(loom::data::TokenSequenceDataset(meta.classification_files("train"),
                                                                                 options),
                                                masking);
    const loom::data::MaskedLMDataset eval_set(loom::data::TokenSequenceDataset(meta.classification_files("val"),
                                                                                options),
                                               masking);
    const std::string origin = args.model_name_or_path ? *args.model_name_or_path : std::string("random init");
    auto model = hf_example::pretrained_or_random<BertForMaskedLM>(args, config);
    if (main_process) {
      fmt::print("bert_mlm: {} training and {} held-out verses from {}, mlm_probability {}\n", train_set.size(),
                 eval_set.size(), example.data_dir, masking.mlm_probability);
      const auto& c = model->config();
      fmt::print("bert_mlm: BertForMaskedLM ({}) with {} layers, {} heads, width {}: {:.2f} M parameters\n", origin,
                 c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                 static_cast<double>(hf_example::count_parameters(*model)) / 1e6);
    }

    // As HF's run_mlm: train, save the model, report, evaluate with perplexity, report.
    double perplexity = -1;
    {
      MlmTrainer trainer(args, model, train_set, eval_set);
      trainer.set_tokenizer_files(hf_example::tokenizer_files(meta));  // saved beside the weights
      if (args.do_train) {
        auto result = trainer.train();
        trainer.save_model();  // a BertForMaskedLM folder transformers opens
        trainer.log_metrics("train", result.metrics);
      }
      if (args.do_eval) {
        auto metrics = trainer.evaluate();
        const double loss = metrics.get("eval_loss").value_or(NAN);
        perplexity = std::isfinite(loss) && loss < 700 ? std::exp(loss) : INFINITY;  // run_mlm.py's rule
        metrics.set("perplexity", perplexity);
        trainer.log_metrics("eval", metrics);
        trainer.save_metrics("eval", metrics);
      }
    }
    if (main_process) {
      if (perplexity >= 0) fmt::print("bert_mlm: perplexity {:.2f} on the held-out verses\n", perplexity);
      fmt::print("outputs in {}\n", args.output_dir);
    }
    return 0;
  });
}
