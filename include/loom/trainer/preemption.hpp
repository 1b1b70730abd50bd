#pragma once
// Graceful preemption: SIGTERM (what a cluster sends before it takes the machine back),
// SIGUSR1 (Slurm's --signal=USR1@T convention) and SIGINT (Ctrl-C) during train() stop the
// run at an optimizer-step boundary that every rank agrees on; the Trainer then saves a
// checkpoint, fires on_save and on_train_end, and throws loom::Preempted, which run_main
// turns into exit code kExitPreempted. `--resume_from_checkpoint latest` continues as if the
// run had never stopped.
//
// Agreement without a host sync: each optimizer step every rank sums the ranks' flags with
// an asynchronous all-reduce and reads the sum two steps later (waited, then copied to pinned
// memory like the fp16 skip flag), so all ranks stop after the same step, at most two steps
// after the signal. A second SIGINT ends the process at once (the default action).

#include <loom/config/inline.hpp>

#include <c10/core/Event.h>
#include <torch/torch.h>

#include <csignal>
#include <exception>
#include <memory>
#include <optional>
#include <string>

namespace loom {

namespace dist {
class Comm;  // distributed/comm.hpp: only the implementation (impl/preemption.ipp) uses them
class Work;
}  // namespace dist

/// The exit code of a run stopped by a preemption signal after saving (sysexits' EX_TEMPFAIL:
/// "try again" — resume with --resume_from_checkpoint latest).
inline constexpr int kExitPreempted = 75;

/// Thrown by train() once a preemption signal's checkpoint is saved. Not a loom::Error: code
/// that catches loom::Error to report bad input lets it through to run_main.
class Preempted : public std::exception {
 public:
  Preempted(int signal, int64_t global_step, std::string checkpoint)
      : signal_(signal), global_step_(global_step), checkpoint_(std::move(checkpoint)),
        message_("loom: stopped by " + signal_name(signal) + " after step " + std::to_string(global_step) +
                 "; the run is saved in " + checkpoint_ + " (resume with --resume_from_checkpoint latest)") {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }
  [[nodiscard]] int signal() const { return signal_; }
  [[nodiscard]] int64_t global_step() const { return global_step_; }
  [[nodiscard]] const std::string& checkpoint() const { return checkpoint_; }
  /// "SIGTERM", "SIGUSR1", "SIGINT" (or "signal N").
  LOOM_INLINE static std::string signal_name(int signal);

 private:
  int signal_;
  int64_t global_step_;
  std::string checkpoint_, message_;
};

/// Catches the preemption signals for its lifetime (one train() call) and decides, with the
/// other ranks, when to stop. Signals whose disposition is SIG_IGN (nohup) stay ignored.
class PreemptionWatch {
 public:
  /// `comm`: the job's process group (null in one process); flags live on `device`.
  LOOM_INLINE PreemptionWatch(dist::Comm* comm, torch::Device device);
  LOOM_INLINE ~PreemptionWatch();
  PreemptionWatch(const PreemptionWatch&) = delete;
  PreemptionWatch& operator=(const PreemptionWatch&) = delete;

  /// Called by every rank once per optimizer step: true when the ranks agree to stop now.
  LOOM_INLINE bool should_stop();
  /// Called by every rank once when the loop has ended without stopping: true when some rank
  /// got a signal in the last steps (a blocking collective; training is over anyway).
  LOOM_INLINE bool got_signal_at_end();
  /// The signal this process received (0: none).
  [[nodiscard]] LOOM_INLINE int signal() const;
  /// The signal the ranks stopped for (this rank's, else SIGTERM for another rank's), once
  /// should_stop() or got_signal_at_end() returned true.
  [[nodiscard]] int stop_signal() const { return agreed_signal_; }
  /// Marks `signal` as received, as the handler does (tests; a custom loop's own triggers).
  LOOM_INLINE static void raise_flag(int signal);

 private:
  /// This rank's flag (1: got a signal) as a device tensor, for the all-reduce.
  [[nodiscard]] LOOM_INLINE torch::Tensor local_flag() const;

  dist::Comm* comm_;
  torch::Device device_;
  std::unique_ptr<dist::Work> in_flight_;  // the all-reduce launched last step (null: none)
  torch::Tensor sum_, sum_host_;          // its result, and the pinned copy read a step later
  std::optional<c10::Event> copied_;
  bool copy_pending_ = false;
  int agreed_signal_ = 0;
  struct sigaction old_[3];
  bool installed_[3] = {false, false, false};
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/preemption.ipp>
#endif
