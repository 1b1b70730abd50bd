#pragma once
// Definitions of callbacks/progress.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/progress.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <unistd.h>

namespace loom {

LOOM_INLINE void ProgressCallback::on_train_begin(const TrainingArguments& args, TrainerState& state,
                                                  TrainerControl&) {
  // HF's ProgressCallback writes on the main process of the job, its PrinterCallback (the one
  // --disable_tqdm chooses) on the main process of each node.
  enabled_ = args.disable_tqdm ? state.is_local_process_zero : state.is_world_process_zero;
  bar_ = enabled_ && !args.disable_tqdm && ::isatty(fileno(stderr));
  start_ = last_draw_ = Clock::now();
  drawn_ = 0;
}

LOOM_INLINE void ProgressCallback::on_step_end(const TrainingArguments&, TrainerState& state, TrainerControl&) {
  if (!bar_) return;
  const auto now = Clock::now();
  if (state.global_step < state.max_steps && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  draw(state);
}

LOOM_INLINE void ProgressCallback::on_log(const TrainingArguments&, TrainerState& state, TrainerControl&,
                                          const Metrics& logs) {
  if (!enabled_) return;
  std::string line = "{";
  for (const auto& [k, v] : logs) {
    if (k == "total_flos") continue;
    if (line.size() > 1) line += ", ";
    line += k == "epoch" ? fmt::format("'{}': {:.2f}", k, v) : fmt::format("'{}': {:.6g}", k, v);
  }
  line += "}";
  if (bar_) std::fputs("\r\033[2K", stderr);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
  if (bar_ && state.global_step > 0) draw(state);
}

LOOM_INLINE void ProgressCallback::on_train_end(const TrainingArguments&, TrainerState& state, TrainerControl&) {
  if (!bar_) return;
  draw(state);
  std::fputs("\n", stderr);
  bar_ = false;
}

LOOM_INLINE void ProgressCallback::draw(const TrainerState& state) {
  const double frac = state.max_steps > 0 ? static_cast<double>(state.global_step) / state.max_steps : 0.0;
  const double secs = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = secs > 0 ? state.global_step / secs : 0.0;
  const double eta = rate > 0 ? (state.max_steps - state.global_step) / rate : 0.0;
  constexpr int width = 30;
  const int full = static_cast<int>(frac * width);
  std::string bar(static_cast<std::size_t>(full), '#');
  bar.resize(width, '.');
  std::fputs(fmt::format("\r{:3.0f}%|{}| {}/{} [{:.0f}s<{:.0f}s, {:.2f} it/s]", frac * 100, bar,
                         state.global_step, state.max_steps, secs, eta, rate)
                 .c_str(),
             stderr);
  std::fflush(stderr);
  ++drawn_;
}

}  // namespace loom
