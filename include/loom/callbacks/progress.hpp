#pragma once
// ProgressCallback: on a terminal, a one-line progress bar on stderr (HF's tqdm bar) with
// the log lines printed above it; elsewhere, or with --disable_tqdm, the log lines alone
// (HF's PrinterCallback). The main process prints; with --disable_tqdm, as HF's
// PrinterCallback, the main process of each node.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <chrono>
#include <cstdint>

namespace loom {

/// Progress bar plus log printer for the main process (of each node, with --disable_tqdm).
class ProgressCallback {
 public:
  void on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&);
  void on_step_end(const TrainingArguments&, TrainerState& state, TrainerControl&);
  void on_log(const TrainingArguments&, TrainerState& state, TrainerControl&, const Metrics& logs);
  void on_train_end(const TrainingArguments&, TrainerState& state, TrainerControl&);

 private:
  using Clock = std::chrono::steady_clock;
  void draw(const TrainerState& state);

  bool enabled_ = false;
  bool bar_ = false;
  Clock::time_point start_{}, last_draw_{};
  int64_t drawn_ = 0;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/callbacks/impl/progress.ipp>
#endif
