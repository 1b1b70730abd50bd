#pragma once
#include <loom/trainer/preemption.hpp>

#include <loom/distributed/comm.hpp>

#include <c10/core/impl/VirtualGuardImpl.h>

#include <atomic>

namespace loom {

namespace detail {
// The signal received (0: none). Written only by the handler (and raise_flag).
inline std::atomic<int> g_preemption_signal{0};
constexpr int kPreemptionSignals[3] = {SIGTERM, SIGUSR1, SIGINT};

inline void on_preemption_signal(int sig) {
  int expected = 0;
  if (!g_preemption_signal.compare_exchange_strong(expected, sig) && sig == SIGINT) {
    // A second Ctrl-C: stop now, as the default action does.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}
}  // namespace detail

LOOM_INLINE std::string Preempted::signal_name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGINT: return "SIGINT";
    default: return "signal " + std::to_string(signal);
  }
}

LOOM_INLINE PreemptionWatch::PreemptionWatch(dist::Comm* comm, torch::Device device)
    : comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr), device_(device) {
  detail::g_preemption_signal.store(0);
  for (int i = 0; i < 3; ++i) {
    struct sigaction now {};
    if (sigaction(detail::kPreemptionSignals[i], nullptr, &old_[i]) != 0) continue;
    if (old_[i].sa_handler == SIG_IGN) continue;  // e.g. SIGINT under nohup: stays ignored
    now.sa_handler = detail::on_preemption_signal;
    sigemptyset(&now.sa_mask);
    now.sa_flags = SA_RESTART;
    installed_[i] = sigaction(detail::kPreemptionSignals[i], &now, nullptr) == 0;
  }
}

LOOM_INLINE PreemptionWatch::~PreemptionWatch() {
  try {
    if (in_flight_) in_flight_->wait();
  } catch (...) {  // a lost rank: the loop has already reported it
  }
  for (int i = 0; i < 3; ++i)
    if (installed_[i]) sigaction(detail::kPreemptionSignals[i], &old_[i], nullptr);
}

LOOM_INLINE int PreemptionWatch::signal() const { return detail::g_preemption_signal.load(); }

LOOM_INLINE void PreemptionWatch::raise_flag(int signal) { detail::on_preemption_signal(signal); }

LOOM_INLINE torch::Tensor PreemptionWatch::local_flag() const {
  return torch::full({1}, signal() != 0 ? 1.0f : 0.0f, torch::TensorOptions().dtype(torch::kFloat).device(device_));
}

LOOM_INLINE bool PreemptionWatch::should_stop() {
  if (agreed_signal_ != 0) return true;
  if (comm_ == nullptr) return (agreed_signal_ = signal()) != 0;
  // 1. The sum launched two steps ago, copied to the host last step: long finished.
  if (copy_pending_) {
    if (copied_) copied_->synchronize();
    copy_pending_ = false;
    if (sum_host_.item<float>() > 0) {
      agreed_signal_ = signal() != 0 ? signal() : SIGTERM;  // another rank's signal
      return true;
    }
  }
  // 2. The sum launched last step: ordered after it (no host wait on CUDA), copied to pinned memory.
  if (in_flight_) {
    in_flight_->wait();
    in_flight_.reset();
    if (!sum_host_.defined())
      sum_host_ = torch::empty({1}, torch::TensorOptions().dtype(torch::kFloat).pinned_memory(device_.is_cuda()));
    sum_host_.copy_(sum_, /*non_blocking=*/device_.is_cuda());
    if (device_.is_cuda()) {
      copied_.emplace(device_.type());
      copied_->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
    }
    copy_pending_ = true;
  }
  // 3. This step's flags.
  sum_ = local_flag();
  in_flight_ = std::make_unique<dist::Work>(comm_->all_reduce({sum_}, "the preemption-flag all-reduce"));
  return false;
}

LOOM_INLINE bool PreemptionWatch::got_signal_at_end() {
  if (agreed_signal_ != 0) return true;
  if (comm_ == nullptr) return (agreed_signal_ = signal()) != 0;
  if (in_flight_) {
    in_flight_->wait();
    in_flight_.reset();
  }
  auto flag = local_flag();
  comm_->all_reduce({flag}, "the preemption-flag all-reduce").wait();
  if (flag.cpu().item<float>() > 0) agreed_signal_ = signal() != 0 ? signal() : SIGTERM;
  return agreed_signal_ != 0;
}

}  // namespace loom
