#pragma once
// JsonlLogger: every log() entry as one JSON object per line in <output_dir>/log.jsonl,
// with the same keys and values as the trainer_state.json log_history entry (the logs
// plus "step", and "run_name" when --run_name is given). Lines are flushed one by one, so a crashed run keeps what it logged.
// Only the world main process writes.

#include <loom/callbacks/log_file.hpp>
#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <string>

namespace loom {

/// Appends each log entry (logs + "step") as one JSON line to <output_dir>/<file_name>.
/// path(), is_open(), close() and on_train_end come from LogFile (the file reopens in
/// append mode on the next log).
class JsonlLogger : public LogFile {
 public:
  /// File name inside output_dir (an absolute path is used as is).
  std::string file_name = "log.jsonl";

  /// Opens the file in append mode (main process only).
  void on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&);
  /// Writes `logs` plus "step" as one line and flushes it (opens the file first if needed).
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&, const Metrics& logs);

 private:
  void open_for(const TrainingArguments& args);
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/jsonl_logger.ipp>
#endif
