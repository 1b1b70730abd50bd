#pragma once
// JsonlLogger: every log() entry as one JSON object per line in <output_dir>/log.jsonl,
// with the same keys and values as the trainer_state.json log_history entry (the logs
// plus "step"). Lines are flushed one by one, so a crashed run keeps what it logged.
// Only the world main process writes.

#include <loom/config/error.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace loom {

/// Appends each log entry (logs + "step") as one JSON line to <output_dir>/<file_name>.
class JsonlLogger {
 public:
  /// File name inside output_dir (an absolute path is used as is).
  std::string file_name = "log.jsonl";

  /// Opens the file in append mode (main process only).
  void on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&) {
    if (state.is_world_process_zero && !out_.is_open()) open(args);
  }
  /// Writes `logs` plus "step" as one line and flushes it (opens the file first if needed).
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&, const Metrics& logs) {
    if (!state.is_world_process_zero) return;
    if (!out_.is_open()) open(args);
    auto entry = logs.to_json();
    entry["step"] = state.global_step;
    out_ << entry.dump() << '\n';
    out_.flush();
    if (!out_) throw Error("cannot write " + path_.string());
  }
  /// Closes the file.
  void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) { close(); }

  /// The file written to (empty before the first open).
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// True while the file is open.
  [[nodiscard]] bool is_open() const { return out_.is_open(); }
  /// Closes the file now (it reopens in append mode on the next log).
  void close() {
    if (out_.is_open()) out_.close();
  }

 private:
  void open(const TrainingArguments& args) {
    const std::filesystem::path dir(args.output_dir);
    path_ = dir / file_name;
    std::error_code ec;
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
    out_.open(path_, std::ios::out | std::ios::app);
    if (!out_) {
      out_ = std::ofstream();
      throw Error("cannot open " + path_.string() + " for appending" +
                  (ec ? " (" + ec.message() + ")" : std::string()));
    }
  }

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace loom
