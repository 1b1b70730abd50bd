#pragma once
// Checkpoint folders in HF's layout, output_dir/checkpoint-<global_step>/, written
// crash-safely and rotated with HF's save_total_limit rules.
//
// Writing protocol (POSIX only: fsync and rename(2)):
//   1. begin_checkpoint() creates output_dir/.tmp-checkpoint-<step>-<pid>; the caller
//      writes every file into it.
//   2. commit_checkpoint() fsyncs the files and folders, then renames the temporary folder
//      to checkpoint-<step>. A folder already there (re-saving a step) is first renamed to
//      output_dir/.old-checkpoint-<step>-<pid>, and deleted only after the new one is in
//      place. At every instant one complete copy exists under one of these names.
//   3. After a crash, remove_stale_temporaries() deletes the .tmp- folders and renames an
//      .old- folder back when its checkpoint-<step> is missing (the crash fell between the
//      two renames). sorted_checkpoints() and latest_checkpoint() never list the dotted
//      folders, whether or not the cleanup ran.
//   4. rotate_checkpoints() renames a checkpoint it drops to .deleting-checkpoint-<step>-<pid>
//      before deleting it, so a crash mid-delete leaves a dotted folder the next cleanup
//      removes, never a half-deleted checkpoint-<step>.
//
// Crash points: with the environment variable LOOM_FAULT_POINT=<point>[:<n>][@<rank>], the
// process kills itself (SIGKILL) the n-th time (default 1) it reaches <point>, on that rank
// only (RANK, default every rank). The points, in the order a save passes them, are listed
// in kFaultPoints; tests/dist runs a save killed at each one and resumes (docs/semantics.md).

#include <loom/config/inline.hpp>
#include <loom/core/error.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::checkpoint {

/// File name of the model weights inside a checkpoint folder (HF's SAFE_WEIGHTS_NAME).
inline constexpr std::string_view kModelFile = "model.safetensors";
/// Instead, for weights larger than one file: the shards' index (HF's SAFE_WEIGHTS_INDEX_NAME),
/// beside model-0000i-of-0000n.safetensors.
inline constexpr std::string_view kModelIndexFile = "model.safetensors.index.json";
/// The largest weight file before a model's weights are split (save_pretrained's default "50GB").
inline constexpr int64_t kMaxShardSize = 50'000'000'000;
/// Instead, when the model trains a LoRA adapter: the adapter's weights (PEFT's
/// ADAPTER_SAFE_WEIGHTS_NAME; peft/lora.hpp writes it, beside adapter_config.json).
inline constexpr std::string_view kAdapterFile = "adapter_model.safetensors";
/// File name of the trainer state inside a checkpoint folder (HF's TRAINER_STATE_NAME).
inline constexpr std::string_view kTrainerStateFile = "trainer_state.json";
/// Prefix of a checkpoint folder name (HF's PREFIX_CHECKPOINT_DIR).
inline constexpr std::string_view kCheckpointPrefix = "checkpoint";

/// The crash points of a save, in order (see the header comment).
inline constexpr std::string_view kFaultPoints[] = {
    "begin",              // the temporary folder exists, empty
    "tensor_file_tmp",    // a safetensors file is written under its .tmp name, not renamed yet
    "weights_written",    // model.safetensors is in the temporary folder
    "optimizer_written",  // this rank's optimizer state is written (a shard when sharded)
    "state_written",      // every JSON part, RNG state, trainer_state.json and args are written
    "before_commit",      // every rank has written (after the barrier); nothing renamed yet
    "fsynced",            // commit: the files are fsynced, the folder not renamed
    "old_moved",          // commit (re-saving a step): the old folder renamed to .old-
    "renamed",            // commit: checkpoint-<step> is in place, the parent not fsynced
    "committed",          // the save is complete, before rotation
    "rotating",           // rotation: the first dropped checkpoint renamed, not yet deleted
};

namespace detail {

/// Kills the process here when LOOM_FAULT_POINT names `point` (test-only crash injection).
LOOM_INLINE void fault_point(std::string_view point);

// Step of a folder named exactly "checkpoint-<digits>", or nullopt.
LOOM_INLINE std::optional<int64_t> step_of(std::string_view name);

// fsync one file or folder; throws loom::Error on failure.
LOOM_INLINE void fsync_path(const std::filesystem::path& p, bool directory);

// fsync every file under `root`, then every folder (deepest first), then `root` itself.
LOOM_INLINE void fsync_tree(const std::filesystem::path& root);

// Renames `from` to `to`; throws loom::Error on failure.
LOOM_INLINE void rename_or_fail(const std::filesystem::path& from, const std::filesystem::path& to);

// This process's pid, as text.
LOOM_INLINE std::string pid_string();

// Same folder, compared as the file system sees it (relative vs absolute, "a/./b").
LOOM_INLINE bool same_path(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace detail

/// output_dir/checkpoint-<step>, HF's folder for the checkpoint of global step `step`.
LOOM_INLINE std::filesystem::path checkpoint_dir(const std::filesystem::path& output_dir, int64_t step);

/// Folders named checkpoint-<int> in output_dir, in numeric step order (none if it does not exist).
LOOM_INLINE std::vector<std::filesystem::path> sorted_checkpoints(const std::filesystem::path& output_dir);

/// The checkpoint folder of the highest step that is complete (holds trainer_state.json).
LOOM_INLINE std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& output_dir);

/// The temporary folder of a checkpoint in progress: output_dir/.tmp-checkpoint-<step>-<tag>.
LOOM_INLINE std::filesystem::path temporary_checkpoint_dir(const std::filesystem::path& output_dir, int64_t step,
                                                           const std::string& tag);

/// Creates (empty) and returns the temporary folder output_dir/.tmp-checkpoint-<step>-<tag>;
/// the tag is this process's pid unless given (the ranks of a job share the tag "ranks").
LOOM_INLINE std::filesystem::path begin_checkpoint(const std::filesystem::path& output_dir, int64_t step,
                                                   const std::string& tag = detail::pid_string());

/// Flushes `tmp` to disk and renames it to `final_dir`, replacing an existing folder crash-safely.
LOOM_INLINE void commit_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir);

/// Cleans up after a crash: deletes .tmp-checkpoint-* folders and restores or deletes .old-checkpoint-*
/// folders (restored when their checkpoint-<step> is missing). Returns the deleted folders.
LOOM_INLINE std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& output_dir);

/// HF's _rotate_checkpoints: deletes all but the newest `save_total_limit` checkpoints, keeping
/// `best_checkpoint`; a limit <= 0 deletes nothing. Returns the deleted folders, oldest first.
LOOM_INLINE std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& output_dir,
                                                                  int64_t save_total_limit,
                                                                  std::optional<std::filesystem::path> best_checkpoint);

/// Throws loom::Error unless `dir` is a folder holding trainer_state.json and model.safetensors
/// (or adapter_model.safetensors: a checkpoint of a model training a LoRA adapter).
LOOM_INLINE void validate_checkpoint(const std::filesystem::path& dir);

/// File name of the lock a run holds in its output folder (OutputDirLock).
inline constexpr std::string_view kLockFile = ".loom.lock";
/// Prefix of the marks claim_output_dir leaves in an output folder for a moment.
inline constexpr std::string_view kNodeMarkPrefix = ".loom.node-";

/// HF's save_on_each_node, safe on storage that turns out to be shared: which process writes
/// the shared files of `output_dir` when each node's local main process may. Every process of
/// the job calls it; the candidates (`candidate`: each node's local main) clear stale marks,
/// then create the folder and leave a mark named after their `rank` in it; `barrier` (every
/// process waits for all) separates the phases, and the candidate of lowest rank among the
/// marks it sees claims the folder; after a third barrier it removes the folder's marks (and
/// the folder, when the claim made it and nothing else is there). Nodes with folders of their own therefore write each their own, and nodes
/// sharing one folder leave it to one writer instead of racing on its renames. Returns whether
/// this process writes `output_dir`.
LOOM_INLINE bool claim_output_dir(const std::filesystem::path& output_dir, int rank, bool candidate,
                                  const std::function<void()>& barrier);

/// One run per output folder: while it lives, this process holds an exclusive lock (flock) on
/// output_dir/.loom.lock, which holds its pid, so a second process training into the same
/// folder stops at start-up with a loom::Error naming the first, instead of both overwriting
/// the folder's files. Objects of one process share the lock (a Trainer resumed beside
/// another, hyperparameter trials). The kernel releases it when the process ends, however it
/// ends; the last object removes the file, and the folder too when it created it and nothing
/// was written there (a run stopped at start-up leaves nothing behind). Creates the folder.
class OutputDirLock {
 public:
  LOOM_INLINE explicit OutputDirLock(const std::filesystem::path& output_dir);
  LOOM_INLINE ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  std::string key_;  // the folder, canonical
};

}  // namespace loom::checkpoint

#if defined(LOOM_HEADER_ONLY)
#include <loom/checkpoint/impl/folders.ipp>
#endif
