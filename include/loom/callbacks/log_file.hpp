#pragma once
// LogFile: the file handling of the logging callbacks, their common base (JsonlLogger,
// TensorBoardLogger). Only the world main process writes; the file is opened on the first
// event that needs it (its folder created), appended to or started afresh, and flushed
// after every write, so a crashed run keeps what it logged. A file that cannot be opened
// or written is a loom::Error naming it. on_train_end closes the file.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/state.hpp>

#include <filesystem>
#include <fstream>
#include <string_view>
#include <utility>

namespace loom {

/// One log file of a callback, written by the world main process only.
class LogFile {
 public:
  /// Closes the file (the next event that logs opens it again).
  void on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&);

  /// The file written to (empty before the first open).
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// True while the file is open.
  [[nodiscard]] bool is_open() const { return out_.is_open(); }
  /// Closes the file now (the next event that logs opens it again).
  void close();

 protected:
  /// What opening does to a file that exists.
  enum class Mode {
    append,  ///< keep it and write after its end
    create,  ///< start it afresh (binary)
  };

  /// True on the world main process, with the file open: `open_file()` (which calls
  /// open()) runs first when it is not. False, and nothing opened, elsewhere.
  template <class OpenFile>
  bool ready(const TrainerState& state, OpenFile&& open_file) {
    if (!state.is_world_process_zero) return false;
    if (!is_open()) std::forward<OpenFile>(open_file)();
    return true;
  }

  /// Opens `path` with `mode`, creating its folder. On failure: loom::Error "cannot open
  /// <kind><path> for appending" (append) or "cannot create <kind><path>" (create), with
  /// the reason the folder could not be created, if it could not.
  void open(std::filesystem::path path, Mode mode, std::string_view kind = "");

  /// Writes `bytes` and flushes them; loom::Error "cannot write <path>" on failure.
  void write(std::string_view bytes);

 private:
  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/log_file.ipp>
#endif
