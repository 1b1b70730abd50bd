#pragma once
// Checkpointer: the one owner of the checkpoint format. Every file of a checkpoint folder is
// named, written and read back here; the components hand over their state and get it back.
//
//   checkpoint-N/model.safetensors        weights (named parameters and buffers), gathered
//   checkpoint-N/adapter_model.safetensors + adapter_config.json
//                                         instead, when the model trains a LoRA adapter
//                                         (peft/lora.hpp): the adapter alone, PEFT's files;
//                                         the frozen base is never written
//   checkpoint-N/optimizer.safetensors    the optimizer's state tensors ("<kind>.<param>": moments,
//                                         buffers, step counts), by parameter name
//   checkpoint-N/optimizer.pt             instead, for a wrapped torch::optim::Optimizer: torch's
//                                         own serialization of it
//   checkpoint-N/optimizer-R-of-W.safetensors / .json
//                                         instead, when the optimizer is sharded: rank R's
//                                         pieces, and each piece's flat range in its parameter
//   checkpoint-N/optimizer.json           optimizer scalars
//   checkpoint-N/optimizer_K.*            the same files for the Accelerator's further optimizers
//                                         (add_optimizer, K = 1, 2, ...): optimizer_K.safetensors
//                                         (or .pt, or optimizer_K-R-of-W.safetensors / .json),
//                                         optimizer_K.json, and its scheduler's scheduler_K.json
//                                         (HF Accelerate's optimizer_1.bin / scheduler_1.bin)
//   checkpoint-N/<part>.json              each JsonPart: scheduler.json (torch's LambdaLR
//                                         field names), scaler.json (fp16; HF forgets it),
//                                         loop_state.json (the loop's loss totals)
//   checkpoint-N/rng_state.safetensors    CPU (and CUDA) generator states
//   checkpoint-N/trainer_state.json       HF's TrainerState, callback states included
//   checkpoint-N/training_args.json       the arguments
//   checkpoint-N/config.json, tokenizer files
//                                         the model's config (HF's format) and the program's
//                                         files (set_model_files), so transformers opens it
//
// Everything is written to a temporary folder that is renamed into place at the end
// (checkpoint/folders.hpp); in a distributed run rank 0 writes the gathered model and the
// shared files, every rank its optimizer shard, and rank 0 renames the folder once all ranks
// are done. With save_on_each_node on several nodes whose storage is not shared, the local
// main process of each node does rank 0's part in its own output_dir, whose checkpoints then
// hold the node's own ranks' shards. A sharded optimizer state loads at any world size and
// under any policy; a rank that resumes at the world size of the save under the same
// partition reads its own shard alone.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/env.hpp>
#include <loom/accelerate/optimizer_step.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

/// A part of a checkpoint that a component owns: one JSON file it fills and reads back.
struct JsonPart {
  std::string file;                                  ///< file name inside the checkpoint folder
  std::function<nlohmann::json()> save;              ///< called on every rank (may be a collective)
  std::function<void(const nlohmann::json&)> load;   ///< restores what save returned
};

/// A JsonPart over an object with state_dict() / load_state_dict(json).
template <class T>
JsonPart json_part(std::string file, T& object) {
  return {std::move(file), [&object] { return nlohmann::json(object.state_dict()); },
          [&object](const nlohmann::json& j) { object.load_state_dict(j); }};
}

class Checkpointer {
 public:
  /// Saves and loads `model` (through `engine`, which gathers sharded parameters). `saves`:
  /// this process writes the shared files (Startup::saves, HF's should_save).
  Checkpointer(const TrainingArguments& args, const dist::World& world, dist::Engine& engine, torch::nn::Module& model,
               bool saves)
      : args_(&args), world_(world), engine_(&engine), model_(&model), saves_(saves) {}

  /// Writes output_dir/checkpoint-<state.global_step> and rotates old ones (every rank calls it).
  /// `optimizers`: the first writes optimizer.*, optimizer k (k >= 1) optimizer_k.*.
  LOOM_INLINE void save(const TrainerState& state, const std::vector<OptimizerStep*>& optimizers,
                        const std::vector<JsonPart>& parts);
  /// The folder --resume_from_checkpoint names ("latest": the newest complete one in output_dir).
  /// Every rank calls it (a collective with save_on_each_node on several nodes, where each
  /// node reads its own folder and the ranks check that they resume from the same step).
  LOOM_INLINE std::optional<std::filesystem::path> resume_dir();
  /// Restores a checkpoint: weights, this rank's optimizer state (resharded), the parts, the
  /// RNG states, and the progress fields of `state` (the plan stays this run's, as HF does).
  LOOM_INLINE void load(const std::filesystem::path& dir, TrainerState& state,
                        const std::vector<OptimizerStep*>& optimizers, const std::vector<JsonPart>& parts);
  /// Loads the weights of `dir`/model.safetensors into the model (strict names and shapes), or
  /// its adapter_model.safetensors into the adapter the model carries.
  LOOM_INLINE void load_weights(const std::filesystem::path& dir);
  /// Loads --model_name_or_path's weights (a folder holding model.safetensors).
  LOOM_INLINE void load_pretrained(const std::string& name_or_path);
  /// Writes the (gathered) weights to `dir`/model.safetensors on rank 0 (the adapter's files
  /// for a model training a LoRA adapter).
  LOOM_INLINE void save_weights(const std::filesystem::path& dir);
  /// Trainer::save_model: `dir`/model.safetensors (gathered), training_args.json and, when
  /// `config` is not null, config.json; for a model training a LoRA adapter, the adapter
  /// files instead of both. Every rank calls it, rank 0 writes.
  LOOM_INLINE void save_model(const std::filesystem::path& dir, const nlohmann::json& config);
  /// The model with its LoRA adapter merged, as a plain folder: `dir`/model.safetensors (or
  /// shards, as save_model) and config.json (when `config` is not null); the model keeps its
  /// adapter. A 4-bit base is dequantized and saved in float32 with the update added (PEFT's
  /// merge dequantizes it). Streamed as save_model: under FullShard one unit is gathered,
  /// merged and written at a time. Every rank calls it.
  LOOM_INLINE void save_merged_model(const std::filesystem::path& dir, const nlohmann::json& config);
  /// What every checkpoint-N holds beside the weights: `config` as config.json (not when the
  /// model trains an adapter; not written when null) and a copy of each of `files` (the
  /// tokenizer's), as HF's Trainer saves the model's config and its processing_class.
  void set_model_files(nlohmann::json config, std::vector<std::filesystem::path> files) {
    config_ = std::move(config);
    files_ = std::move(files);
  }

 private:
  LOOM_INLINE void barrier(const char* what);
  /// save_weights' full-model write and save_merged_model's: the weights streamed into `dir` as
  /// the engine gathers them; with `merged`, each adapted or 4-bit layer's weight merged
  /// (AdaptableLinear::merged_weight) when its group is gathered, and no adapter tensor.
  LOOM_INLINE void stream_weights(const std::filesystem::path& dir, bool merged);
  /// resume_dir's folder, found by this process alone.
  LOOM_INLINE std::optional<std::filesystem::path> find_resume_dir();
  /// save_on_each_node on several nodes: every rank resumes from the same step (`dir`, found
  /// in its node's own folder; none: no resume; `failed`: finding it threw), else a
  /// loom::Error naming each rank's.
  LOOM_INLINE void agree_on_resume(const std::optional<std::filesystem::path>& dir, bool failed);
  /// Every parameter's full shape, by name (the optimizer shards record and check them).
  [[nodiscard]] LOOM_INLINE std::map<std::string, std::vector<int64_t>> parameter_shapes() const;
  /// Whether the shard metadata `meta_file` records exactly the pieces `optimizer` steps on
  /// this rank (the save's world size and partition): then that shard alone restores it.
  LOOM_INLINE static bool shard_holds_pieces(const std::filesystem::path& meta_file, OptimizerStep& optimizer);
  LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> optimizer_state_for_this_rank(
      const std::filesystem::path& dir, OptimizerStep& optimizer, const std::string& stem);
  /// Writes one optimizer's files, named from `stem` ("optimizer", "optimizer_1", ...), into `tmp`.
  LOOM_INLINE void save_optimizer(const std::filesystem::path& tmp, OptimizerStep& optimizer, const std::string& stem);
  /// Restores one optimizer from the files of `dir` named from `stem`.
  LOOM_INLINE void load_optimizer(const std::filesystem::path& dir, OptimizerStep& optimizer, const std::string& stem);

  /// Rank 0: config.json (unless null or an adapter is trained) and the program's files into `dir`.
  LOOM_INLINE void write_model_files(const std::filesystem::path& dir, const nlohmann::json& config, bool adapter_too);

  const TrainingArguments* args_;
  nlohmann::json config_;
  std::vector<std::filesystem::path> files_;
  dist::World world_;
  dist::Engine* engine_;
  torch::nn::Module* model_;
  bool saves_;  // writes the shared files (rank 0; each node's local main with save_on_each_node)
};

/// HF's example scripts' rule for an existing output folder, when training (do_train) without
/// --overwrite_output_dir: the last complete checkpoint-N in output_dir, to resume from when
/// --resume_from_checkpoint is not given (the caller sets it); none when output_dir does not
/// exist or holds nothing. A non-empty output_dir without a checkpoint is a loom::Error (use
/// --overwrite_output_dir to train in it from scratch). With --overwrite_output_dir, or
/// without --do_train, always none.
LOOM_INLINE std::optional<std::filesystem::path> detect_last_checkpoint(const TrainingArguments& args);

/// The file stem of optimizer `k`'s checkpoint files: "optimizer" for the first (k = 0),
/// "optimizer_<k>" for the further ones (HF Accelerate's numbering).
inline std::string optimizer_file_stem(std::size_t k) {
  return k == 0 ? std::string("optimizer") : "optimizer_" + std::to_string(k);
}
/// The file of scheduler `k` (the one optimizer `k` follows): scheduler.json, scheduler_<k>.json.
inline std::string scheduler_file(std::size_t k) {
  return k == 0 ? std::string("scheduler.json") : "scheduler_" + std::to_string(k) + ".json";
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/accelerate/impl/checkpointer.ipp>
#endif
