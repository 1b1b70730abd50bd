// BERT (loom::models::BertForSequenceClassification, Hugging Face's architecture and file
// format) fine-tuned to tell which part of the King James Bible a verse comes from: the
// seven book groups of examples/text_data/kjv.py (law, history, poetry, prophets,
// gospels_acts, epistles, revelation). Evaluated on the held-out verses with accuracy, which
// it reports against the majority-class baseline (eval_majority_accuracy: the share of the
// held-out set's most frequent group). HF's run_glue.py, in C++.
//
// The data, once (~15 s): kjv_text decodes Debian's bible-kjv-text, kjv.py tokenizes it:
//   make kjv-data                        # builds kjv_text, then runs the command below
//   .venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --out data/kjv
//
// Then:
//   build/examples/bert_classify                                  # the defaults below (~3 min on 2 cores)
//   build/examples/bert_classify --model_name_or_path my-bert     # start from an HF folder (7 labels,
//                                                                 # single-label or unset problem_type)
//   build/examples/bert_classify --num_hidden_layers 1 --max_steps 100 --bf16
//   build/examples/bert_classify --group_by_length                # batches of similar lengths: less padding
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/bert_classify --sharding zero2
//   build/examples/bert_classify --do_train --predict "Jesus wept."  # train, then classify a sentence
//   build/examples/bert_classify --model_name_or_path output/bert_classify --predict "The LORD is my shepherd"
//                                                                 # prediction only (no --do_train / --do_eval)
//   build/examples/bert_classify --help                           # every flag
//
// Your own data, any of HF's three problem types (examples/text_data/prepare.py --classify: JSON
// Lines of {"text", "label"}; the label's form says the task, meta.json records it):
//   .venv/bin/python examples/text_data/prepare.py --classify reviews.jsonl --out data/reviews
//   build/examples/bert_classify --data_dir data/reviews     # single-label: accuracy, macro F1
//   # multi_label_classification (labels: lists of class names): BCE-with-logits; sigmoid > 0.5
//   #   predictions, eval_exact_match (subset accuracy), eval_f1_micro, eval_f1_macro
//   # regression (labels: numbers): MSE; eval_mse, eval_rmse, eval_mae (and eval_pearson for one target)
// The model's problem_type is the data's (a --model_name_or_path folder's must agree, or be
// unset). Each run also reports a baseline that ignores the text: the majority class (accuracy),
// the training labels' mean (mse) or each label's majority value (exact match).
//
// Each example is [CLS] verse [SEP] (kjv.py's classify_{train,val} ragged files),
// truncated to --max_seq_length ids; batches are padded to their longest example by the
// dataset's DataCollatorWithPadding (HF's), with attention_mask 0 on the padding. Without
// --model_name_or_path the model is BERT with HF's initialization, sized by the flags below,
// meta.json's vocabulary and padding id, and the seven group names as id2label. Each encoder
// layer is a FullShard unit. --predict encodes its sentence with the data folder's
// tokenizer.json as kjv.py / prepare.py encoded the examples ([CLS] text [SEP], truncated to
// --max_seq_length) and prints the model's labels: the most likely classes with their
// probabilities (single-label), the labels whose sigmoid exceeds 0.5 (multi-label), or the
// predicted values (regression).

#include <loom/loom.hpp>
#include <loom/data/token_file.hpp>
#include <loom/data/tokenizer.hpp>
#include <loom/metrics/classification.hpp>
#include <loom/metrics/regression.hpp>
#include <loom/models/bert.hpp>

#include "../common/bert_example.hpp"
#include "../common/hf_example.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <string>
#include <vector>

/// Flags of this example, beside every TrainingArguments flag.
struct ExampleArguments {
  std::string data_dir = "data/kjv";   ///< folder with kjv.py's meta.json and classify_* files
  int64_t max_seq_length = 128;        ///< ids per example after truncation ([CLS] and [SEP] included)
  int64_t num_hidden_layers = 2;       ///< random init: encoder layers
  int64_t hidden_size = 128;           ///< random init: width
  int64_t num_attention_heads = 4;     ///< random init: heads per layer
  int64_t intermediate_size = 512;     ///< random init: feed-forward width
  double dropout = 0.1;                ///< random init: hidden_dropout_prob and attention_probs_dropout_prob
  std::string predict;                 ///< a sentence to classify after training and evaluation ("": none)

  static constexpr loom::FieldHelp field_help[] = {
      {"data_dir", "folder with kjv.py's meta.json and classify_{train,val} files"},
      {"max_seq_length", "ids per example after truncation ([CLS] and [SEP] included)"},
      {"num_hidden_layers", "encoder layers (random init, without --model_name_or_path)"},
      {"hidden_size", "width (random init)"},
      {"num_attention_heads", "attention heads per layer (random init)"},
      {"intermediate_size", "feed-forward width (random init)"},
      {"dropout", "hidden_dropout_prob and attention_probs_dropout_prob (random init)"},
      {"predict", "a sentence to classify after training and evaluation, printed with the model's labels; given "
                  "alone (no --do_train / --do_eval), the run only predicts (--model_name_or_path: a saved folder)"},
  };
  static constexpr std::string_view help_heading = "example";
};

using loom::models::BertForSequenceClassification;

using loom::data::LabelKind;

/// HF-style metrics of `kind` for logits and labels: single-label accuracy and macro F1;
/// multi-label (sigmoid > 0.5) exact match (subset accuracy) and micro / macro F1; regression
/// MSE, RMSE, MAE (and Pearson's r for one target).
static loom::Metrics problem_metrics(LabelKind kind, const torch::Tensor& logits, const torch::Tensor& labels) {
  namespace m = loom::metrics;
  m::ClassificationOptions options;
  options.zero_division = 0.0;  // a class never predicted scores 0, silently (sklearn's zero_division=0)
  if (kind == LabelKind::class_id) {
    options.average = "macro";
    return {{"accuracy", m::accuracy(logits, labels)}, {"f1_macro", m::f1(logits, labels, options)}};
  }
  if (kind == LabelKind::multi_hot) {
    options.multi_label = true;
    const auto predicted = m::multi_label_predictions(logits);
    loom::Metrics out{{"exact_match", m::accuracy(predicted, labels, options)}};
    for (const char* average : {"micro", "macro"}) {
      options.average = average;
      out.set(std::string("f1_") + average, m::f1(predicted, labels, options));
    }
    return out;
  }
  loom::Metrics out{{"mse", m::mean_squared_error(logits, labels)},
                    {"rmse", m::root_mean_squared_error(logits, labels)},
                    {"mae", m::mean_absolute_error(logits, labels)}};
  if (labels.dim() == 1 && labels.size(0) > 1) out.set("pearson", m::pearson(logits, labels));
  return out;
}

// The sharding and precision policies are the ones --sharding and --bf16 / --fp16 name when
// the run starts (sharding::FromArgs, precision::FromArgs). The model's forward(batch) returns
// {loss, logits} (HF's loss for the config's problem_type), so the Trainer's default
// compute_loss is the model's loss.
/// The trainer: the data's problem type's metrics in evaluation.
struct BertTrainer : loom::Trainer<BertTrainer, BertForSequenceClassification, loom::sharding::FromArgs,
                                   loom::precision::FromArgs> {
  using Trainer::Trainer;

  LabelKind kind = LabelKind::class_id;  ///< the data's labels (meta.json's problem_type)

  /// problem_metrics of the held-out examples.
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return problem_metrics(kind, p.predictions, p.label_ids); }
};

/// A baseline that ignores the text, as the metric it is compared with: the majority class's
/// accuracy (single-label), each label's training majority as exact match (multi-label), the
/// training mean's mse (regression). Returns {metric name, value}.
static std::pair<std::string, double> text_blind_baseline(LabelKind kind, const loom::data::TokenSequenceDataset& train,
                                               const loom::data::TokenSequenceDataset& eval) {
  const auto all = [](const loom::data::TokenSequenceDataset& d) {
    std::vector<torch::Tensor> labels;
    for (int64_t i = 0; i < d.size(); ++i) labels.push_back(d.get(i).labels);
    return torch::stack(labels);
  };
  // prepare.py --val_fraction 0 or 1 writes one split empty.
  loom::check(eval.size() > 0, "the held-out split has no examples (prepare.py --val_fraction 0 holds out none); "
              "bert_classify evaluates on it: prepare the data with a --val_fraction above 0");
  loom::check(kind == LabelKind::class_id || train.size() > 0,
              "the training split has no examples (prepare.py --val_fraction 1 holds out all of them); the baseline "
              "of multi-label and regression data is the training labels' majority or mean");
  const auto eval_labels = all(eval);
  if (kind == LabelKind::class_id) {
    const auto majority = std::get<0>(at::mode(eval_labels));  // the held-out set's most frequent class
    return {"majority_accuracy", loom::metrics::accuracy(majority.expand_as(eval_labels), eval_labels)};
  }
  const auto train_labels = all(train);
  if (kind == LabelKind::multi_hot) {
    const auto majority = train_labels.mean(0).gt(0.5).to(torch::kFloat);
    loom::metrics::ClassificationOptions options;
    options.multi_label = true;
    return {"majority_exact_match", loom::metrics::accuracy(majority.expand_as(eval_labels), eval_labels, options)};
  }
  return {"mean_baseline_mse", loom::metrics::mean_squared_error(train_labels.mean(0).expand_as(eval_labels), eval_labels)};
}

/// The ids of `text` as prepare.py encodes a classification example: [CLS] text [SEP] when the
/// data has both ids (truncating the text to fit `max_length`), else the tokenizer's own
/// special tokens around it.
static std::vector<int64_t> encode_example(const loom::data::Tokenizer& tokenizer, const loom::data::TokenFileMeta& meta,
                                           const std::string& text, int64_t max_length) {
  loom::data::EncodeOptions options;
  options.truncation = true;
  options.max_length = max_length;
  if (!meta.cls_token_id || !meta.sep_token_id) return tokenizer.encode(text, options);
  options.add_special_tokens = false;
  options.max_length = max_length - 2;
  std::vector<int64_t> ids{*meta.cls_token_id};
  for (const auto id : tokenizer.encode(text, options)) ids.push_back(id);
  ids.push_back(*meta.sep_token_id);
  return ids;
}

/// Prints the model's labels for `text` (see the comment at the top).
static void print_prediction(BertForSequenceClassification& model, const loom::data::TokenFileMeta& meta,
                             const std::string& text, int64_t max_length) {
  const auto tokenizer = loom::data::Tokenizer::from_file(meta.tokenizer_file);
  const auto ids = encode_example(tokenizer, meta, text, max_length);
  const auto device = model->parameters().front().device();
  const auto input_ids = torch::tensor(ids, torch::kLong).unsqueeze(0).to(device);
  torch::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    const bool training = model->is_training();
    model->eval();
    logits = model->logits(input_ids, torch::ones_like(input_ids)).to(torch::kFloat).cpu()[0];
    model->train(training);
  }
  const auto& names = model->config().id2label;
  const auto name = [&](int64_t i) { return names.contains(i) ? names.at(i) : fmt::format("LABEL_{}", i); };
  fmt::print("bert_classify: sentence {:?} ({} ids)\n", text, ids.size());
  if (meta.label_kind == LabelKind::regression) {
    for (int64_t i = 0; i < logits.size(0); ++i)
      fmt::print("bert_classify: predicted {} = {:.6f}\n", name(i), logits[i].item<double>());
    return;
  }
  const bool multi = meta.label_kind == LabelKind::multi_hot;
  const auto probs = multi ? logits.sigmoid() : logits.softmax(0);
  const auto order = probs.argsort(0, /*descending=*/true);
  std::vector<std::string> chosen, listed;
  for (int64_t k = 0; k < order.size(0); ++k) {
    const auto i = order[k].item<int64_t>();
    const auto p = probs[i].item<double>();
    if (multi ? p > 0.5 : k == 0) chosen.push_back(name(i));
    if (k < 3) listed.push_back(fmt::format("{} {:.6f}", name(i), p));
  }
  fmt::print("bert_classify: predicted {} ({}: {})\n", chosen.empty() ? std::string("no label") : fmt::format("{}", fmt::join(chosen, ", ")),
             multi ? "sigmoid, > 0.5 chosen" : "softmax, most likely first", fmt::join(listed, ", "));
}

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults; any flag on the command line overrides them. Sized for about
    // three minutes on 2 CPU cores: three epochs of the 27,992 training verses in batches of
    // 32 (one epoch took 66 s and reached eval_accuracy 0.653 against the baseline 0.228).
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/bert_classify";
    defaults.learning_rate = 5e-4;
    defaults.weight_decay = 0.01;
    defaults.lr_scheduler_type = "linear";
    defaults.warmup_steps = 50;
    defaults.per_device_train_batch_size = 32;
    defaults.per_device_eval_batch_size = 128;
    defaults.num_train_epochs = 3;
    defaults.logging_steps = 200;
    defaults.eval_strategy = "epoch";
    defaults.save_strategy = "no";
    auto [example, args] = loom::parse_args(argc, argv, ExampleArguments{}, defaults);
    bert_example::check_size_flags(example, 2, "[CLS], [SEP]");
    // A sentence to classify without --do_train / --do_eval only predicts.
    const bool predict_only = hf_example::runs_alone(!example.predict.empty(), args);
    hf_example::apply_script_rules(args, "bert_classify", /*train_by_default=*/!predict_only);
    const bool main_process = hf_example::is_main_process();

    // The model's configuration before any data: a folder's config.json, else the flags.
    const auto meta = hf_example::read_token_folder(example.data_dir);
    const auto num_labels = static_cast<int64_t>(meta.label_names.size());
    const std::string problem(loom::data::problem_type_name(meta.label_kind));
    loom::check(num_labels > (meta.label_kind == LabelKind::class_id ? 1 : 0),
                "{}/meta.json names {} classification labels; single-label classification needs at least 2 "
                "(kjv.py writes 7)", example.data_dir, num_labels);
    loom::models::BertConfig config;
    if (args.model_name_or_path) {
      config = loom::models::read_hf_config<loom::models::BertConfig>(*args.model_name_or_path);
      loom::models::complete_labels(config);
      loom::check(config.num_labels == num_labels, "--model_name_or_path {} has {} labels, the data {}",
                  *args.model_name_or_path, config.num_labels, num_labels);
      loom::check(config.vocab_size >= meta.vocab_size,
                  "--model_name_or_path {} has vocab_size {}, but the token files of {} use {} ids",
                  *args.model_name_or_path, config.vocab_size, example.data_dir, meta.vocab_size);
      // The loss follows the data's labels: an unset problem_type becomes the data's (as HF's
      // run_classification.py sets it), a different one is refused.
      loom::check(!config.problem_type || *config.problem_type == problem,
                  "--model_name_or_path {} has problem_type {}, but the labels of {} are {} (meta.json's "
                  "classification.problem_type)", *args.model_name_or_path, *config.problem_type, example.data_dir,
                  problem);
      config.problem_type = problem;
      loom::check(example.max_seq_length <= config.max_position_embeddings,
                  "--max_seq_length {} exceeds --model_name_or_path {}'s max_position_embeddings {}",
                  example.max_seq_length, *args.model_name_or_path, config.max_position_embeddings);
    } else {
      config = bert_example::random_config(example, meta);
      for (int64_t i = 0; i < num_labels; ++i) config.id2label[i] = meta.label_names[static_cast<size_t>(i)];
      config.problem_type = problem;
      loom::models::complete_labels(config);
    }

    loom::set_seed(args.seed);
    auto options = meta.sequence_options(example.max_seq_length);
    options.num_labels = config.num_labels;  // every label checked against the model's count at open
    const loom::data::TokenSequenceDataset train_set(meta.classification_files("train"), options);
    const loom::data::TokenSequenceDataset eval_set(meta.classification_files("val"), options);
    const auto blind = text_blind_baseline(meta.label_kind, train_set, eval_set);
    const std::string& baseline_name = blind.first;
    const double baseline = blind.second;
    const std::string compared = meta.label_kind == LabelKind::class_id ? "accuracy"
                                 : meta.label_kind == LabelKind::multi_hot ? "exact_match" : "mse";
    const std::string origin = args.model_name_or_path ? *args.model_name_or_path : std::string("random init");
    // From a folder: its weights in a model of the config read above, whose problem_type is now the data's.
    BertForSequenceClassification model(config);
    if (args.model_name_or_path) {
      model->load_weights(*args.model_name_or_path);
      args.model_name_or_path.reset();  // loaded here, not again by the Trainer
    }
    if (main_process) {
      fmt::print("bert_classify: {} training and {} held-out examples from {}, {} labels ({}), {} {:.4f}\n",
                 train_set.size(), eval_set.size(), example.data_dir, num_labels, problem, baseline_name, baseline);
      const auto& c = model->config();
      fmt::print("bert_classify: BertForSequenceClassification ({}) with {} layers, {} heads, width {}: "
                 "{:.2f} M parameters\n", origin, c.num_hidden_layers, c.num_attention_heads, c.hidden_size,
                 static_cast<double>(hf_example::count_parameters(*model)) / 1e6);
    }

    // As HF's run_glue: train, save the model, report, evaluate, report.
    std::optional<double> score;  // the metric the baseline is compared with
    if (!predict_only) {
      if (loom::sharding_chosen(args).shards_parameters)
        loom::check(example.predict.empty(), "--predict is not supported under --sharding full_shard (the parameters "
                    "are sharded across the ranks): predict from the saved model in one process, without --do_train");
      BertTrainer trainer(args, model, train_set, eval_set);
      trainer.kind = meta.label_kind;
      trainer.set_tokenizer_files(hf_example::tokenizer_files(meta));  // saved beside the weights
      if (args.do_train) {
        auto result = trainer.train();
        trainer.save_model();  // model.safetensors, config.json, the tokenizer: a folder transformers opens
        trainer.log_metrics("train", result.metrics);
      }
      if (args.do_eval) {
        auto metrics = trainer.evaluate();
        metrics.set("eval_" + baseline_name, baseline);
        trainer.log_metrics("eval", metrics);
        trainer.save_metrics("eval", metrics);
        score = metrics.get("eval_" + compared);
      }
    }
    if (main_process) {
      if (score && meta.label_kind == LabelKind::class_id) {
        fmt::print("bert_classify: eval_accuracy {:.4f} against the majority baseline {:.4f} ({:+.4f})\n", *score,
                   baseline, *score - baseline);
      } else if (score) {
        fmt::print("bert_classify: eval_{} {:.4f} against the baseline eval_{} {:.4f} ({:+.4f})\n", compared, *score,
                   baseline_name, baseline, *score - baseline);
      }
      if (!example.predict.empty()) print_prediction(model, meta, example.predict, example.max_seq_length);
      if (!predict_only) fmt::print("outputs in {}\n", args.output_dir);
    }
    return 0;
  });
}
