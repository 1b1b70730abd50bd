#pragma once
// --report_to: the built-in loggers chosen at run time (HF's report_to, its integrations
// being loom's two files): `jsonl` (JsonlLogger, <output_dir>/log.jsonl), `tensorboard`
// (TensorBoardLogger, <logging_dir>), `all` (both), `none` (neither; the default, as HF 5's).
// Each runs as a run-time callback, after the compiled ones; a logger already compiled into
// the Trainer's Callbacks<...> is not added twice.

#include <loom/callbacks/jsonl_logger.hpp>
#include <loom/callbacks/tensorboard.hpp>
#include <loom/trainer/trainer_callback.hpp>

namespace loom::detail {

/// A built-in logger as a run-time callback: the events it handles, forwarded.
template <class Logger>
class ReportTo final : public TrainerCallback {
 public:
  void on_train_begin(const TrainingArguments& a, TrainerState& s, TrainerControl& c, const CallbackArgs&) override {
    logger_.on_train_begin(a, s, c);
  }
  void on_log(const TrainingArguments& a, TrainerState& s, TrainerControl& c, const CallbackArgs& k) override {
    if (k.logs != nullptr) logger_.on_log(a, s, c, *k.logs);
  }
  void on_train_end(const TrainingArguments& a, TrainerState& s, TrainerControl& c, const CallbackArgs&) override {
    logger_.on_train_end(a, s, c);
  }
  /// The logger (its path, its file name).
  Logger& logger() { return logger_; }

 private:
  Logger logger_;
};

}  // namespace loom::detail
