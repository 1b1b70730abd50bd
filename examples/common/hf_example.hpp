#pragma once
// What the examples that follow Hugging Face's example scripts share (fashion_mnist, gpt2,
// bert_classify): HF's rules for --do_train / --do_eval / --do_predict and an existing output
// folder, the folder of token files that examples/text_data/prepare.py writes, a model read
// from an HF folder or freshly initialized, and save_model() as an HF folder (config.json
// beside the weights) that transformers' from_pretrained opens.

#include <loom/config/paths.hpp>
#include <loom/data/token_file.hpp>
#include <loom/loom.hpp>
#include <loom/models/hf_folder.hpp>

#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace hf_example {

/// True on the process that prints (rank 0 under torchrun, the only one otherwise).
inline bool is_main_process() { return loom::dist::world_from_env().is_main(); }

/// HF's example-script flow, on parsed arguments: checks them (before any data is read),
/// makes a run given none of --do_train / --do_eval / --do_predict train and evaluate,
/// finalizes them, and, when one of those flags was given, resumes from the last
/// checkpoint-N of output_dir (HF's detect rule: an output folder with other files only is
/// an error; --overwrite_output_dir trains from scratch). `program` names the example in
/// what it prints. Without `train_by_default` (a run that only generates) none of the three
/// is set.
inline void apply_script_rules(loom::TrainingArguments& args, std::string_view program, bool train_by_default = true) {
  loom::apply_launcher_configs(args);  // --deepspeed / --fsdp read once: the Trainer and the selector reuse them
  loom::validate(args);
  const bool hf_mode = args.do_train || args.do_eval || args.do_predict;
  if (!hf_mode && train_by_default) args.do_train = args.do_eval = true;
  loom::finalize(args);
  if (!hf_mode) return;
  if (auto last = loom::detect_last_checkpoint(args)) {
    args.resume_from_checkpoint = last->string();
    if (is_main_process())
      fmt::print("{}: checkpoint detected, resuming training at {}; --overwrite_output_dir trains from scratch\n",
                 program, last->string());
  }
}

/// True when a run was given `action` (a prompt, a sentence to predict) and none of --do_train /
/// --do_eval / --do_predict: it does that alone (apply_script_rules' train_by_default false).
inline bool runs_alone(bool action, const loom::TrainingArguments& args) {
  return action && !args.do_train && !args.do_eval && !args.do_predict;
}

/// meta.json of a folder prepared by examples/text_data/prepare.py; a missing file is a
/// loom::Error that says how to make one.
inline loom::data::TokenFileMeta read_token_folder(const std::filesystem::path& data_dir) {
  const auto meta = data_dir / "meta.json";
  loom::check(loom::path_exists(data_dir, loom::PathKind::folder, "--data_dir") &&
                  loom::path_exists(meta, loom::PathKind::file, "--data_dir"),
              "--data_dir {}: no meta.json there; prepare the KJV token files with `make kjv-data` (writes data/kjv) "
              "or `.venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --out {}`",
              data_dir.string(), data_dir.string());
  return loom::data::read_token_meta(meta);
}

/// The model of the HF folder `args.model_name_or_path` (Model::from_pretrained: model.safetensors
/// or shards, names and shapes checked), or one drawn from torch's generator with `random_config`.
/// The folder is then cleared from `args`: the Trainer would read its model.safetensors again,
/// with a stricter reader that knows no shards. With `deferred` the model is built under
/// loom::DeferredInit: no parameter holds memory until the Trainer materializes it (under
/// FullShard, only this rank's slices, read from the folder's files or initialized).
template <class Model, class Config>
Model pretrained_or_random(loom::TrainingArguments& args, const Config& random_config, bool deferred = false) {
  std::optional<loom::DeferredInit> scope;
  if (deferred) scope.emplace();
  if (!args.model_name_or_path) return Model(random_config);
  auto model = Model::from_pretrained(*args.model_name_or_path);
  args.model_name_or_path.reset();
  return model;
}

/// Parameters of `module` (each tensor once).
inline int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

/// The tokenizer files of a token folder that exist (tokenizer.json, tokenizer_config.json):
/// what trainer.set_tokenizer_files copies beside the weights of save_model and of every
/// checkpoint, as HF's run_clm saves its tokenizer, so AutoTokenizer opens those folders.
inline std::vector<std::filesystem::path> tokenizer_files(const loom::data::TokenFileMeta& data) {
  std::vector<std::filesystem::path> out;
  for (const auto& file : {data.tokenizer_file, data.folder / "tokenizer_config.json"})
    if (loom::path_exists(file, loom::PathKind::file)) out.push_back(file);
  return out;
}

}  // namespace hf_example
