#pragma once
// Comm: the job's process group, and the only place in loom that names c10d.
//
// Rendezvous follows torchrun: a TCPStore at MASTER_ADDR:MASTER_PORT (hosted by rank 0, or
// by torchrun's agent under the prefix /worker/attempt_<n> when
// TORCHELASTIC_USE_AGENT_STORE=True); a world of one with no launcher uses an in-process
// HashStore. CPU tensors travel through ProcessGroupGloo (its device is created explicitly
// for the loopback address, GLOO_SOCKET_IFNAME, or this host), CUDA tensors through
// ProcessGroupNCCL. Every collective is a SUM (Gloo has no AVG; callers scale).
//
// A collective that fails (a peer died: its socket closed; or ddp_timeout elapsed) becomes a
// loom::Error naming the lost ranks. Survivors find them through the store: each one that
// sees a failure writes loom/fault/<rank>, waits a few seconds for the others, and reports
// the ranks that never wrote; if the store itself is gone, the rank hosting it is lost.

#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>

#include <torch/torch.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(LOOM_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#ifndef USE_C10D_GLOO
#error "loom: distributed/ needs ProcessGroupGloo; build with USE_C10D_GLOO and Gloo's headers (libgloo-dev)"
#endif

namespace loom::dist {

class Comm;

/// A collective in flight; wait() returns when its result is usable (on CUDA: ordered on the
/// current stream), or throws loom::Error naming the lost ranks.
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, Comm* comm, const char* what)
      : work_(std::move(work)), comm_(comm), what_(what) {}
  inline void wait();
  [[nodiscard]] bool pending() const { return static_cast<bool>(work_); }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  Comm* comm_ = nullptr;
  const char* what_ = "";
};

/// Bytes sent by this rank, by collective kind, as the ring algorithms count them
/// (all-reduce 2(N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N).
struct CommCounters {
  double all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  [[nodiscard]] double total() const { return all_reduce + reduce_scatter + all_gather + broadcast; }
};

/// The process group of the job.
class Comm {
 public:
  /// Joins the world on `device`'s backend (Gloo for CPU, NCCL for CUDA); collectives time out
  /// after `timeout`.
  Comm(const World& world, torch::Device device, std::chrono::milliseconds timeout)
      : world_(world), device_(device), timeout_(timeout) {
    try {
      store_ = make_store();
      if (device.is_cuda()) {
#if defined(LOOM_HAVE_NCCL)
        auto opts = c10d::ProcessGroupNCCL::Options::create();
        opts->timeout = timeout;
        pg_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, world.rank, world.size, opts);
#else
        fail("this build of loom has no NCCL (torch without CUDA, or nccl.h not found at configure time); "
             "train on the CPU with --use_cpu");
#endif
      } else {
        auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
        opts->devices.push_back(gloo_device());
        pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, world.rank, world.size, opts);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail("rank {} could not join the process group of {} at {}:{} within {} s: {}", world.rank, world.size,
           world.master_addr, world.master_port, timeout.count() / 1000, first_line(e.what()));
    }
  }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  [[nodiscard]] int rank() const { return world_.rank; }
  [[nodiscard]] int size() const { return world_.size; }
  [[nodiscard]] const World& world() const { return world_; }
  [[nodiscard]] const torch::Device& device() const { return device_; }
  [[nodiscard]] const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  /// In-place SUM over ranks of each tensor.
  Work all_reduce(std::vector<at::Tensor> tensors, const char* what = "all_reduce") {
    for (const auto& t : tensors) counters_.all_reduce += ring_factor(2) * bytes(t);
    return guarded(what, [&] { return pg_->allreduce(tensors); });
  }
  /// `out` (numel n) = SUM over ranks of in[rank*n : (rank+1)*n].
  Work reduce_scatter(at::Tensor out, at::Tensor in, const char* what = "reduce_scatter") {
    counters_.reduce_scatter += ring_factor(1) * bytes(in);
    return guarded(what, [&] { return pg_->_reduce_scatter_base(out, in); });
  }
  /// `out` = concatenation over ranks of `in`.
  Work all_gather(at::Tensor out, at::Tensor in, const char* what = "all_gather") {
    counters_.all_gather += ring_factor(1) * bytes(out);
    return guarded(what, [&] { return pg_->_allgather_base(out, in); });
  }
  /// `tensors` of rank `root` copied to every rank.
  Work broadcast(std::vector<at::Tensor> tensors, int root = 0, const char* what = "broadcast") {
    for (const auto& t : tensors) counters_.broadcast += bytes(t);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return guarded(what, [&] { return pg_->broadcast(tensors, o); });
  }
  /// Returns when every rank has called it.
  void barrier(const char* what = "barrier") {
    // A one-element all-reduce on the group's own device (NCCL's barrier needs a device
    // guess), left out of the counters: it moves no model data.
    std::vector<at::Tensor> t{torch::zeros({1}, torch::TensorOptions().device(device_))};
    guarded(what, [&] { return pg_->allreduce(t); }).wait();
  }

  /// Turns the failure of collective `what` into a loom::Error naming the lost ranks.
  [[noreturn]] void fail_collective(const char* what, const std::string& cause) {
    std::vector<int> lost;
    bool store_lost = false;
    try {
      const auto key = [](int r) { return "fault/" + std::to_string(r); };
      store_->set(key(world_.rank), std::vector<uint8_t>{1});
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      for (;;) {
        lost.clear();
        for (int r = 0; r < world_.size; ++r)
          if (r != world_.rank && !store_->check({key(r)})) lost.push_back(r);
        if (lost.empty() || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    } catch (const std::exception&) {
      store_lost = true;
    }
    std::string names;
    if (store_lost) {
      names = world_.agent_store ? "the torchrun agent's store" : "rank 0 (it hosts the rendezvous store)";
    } else {
      for (int r : lost) names += (names.empty() ? "rank " : ", rank ") + std::to_string(r);
      if (names.empty()) names = "no rank (every rank reported the failure)";
    }
    fail("rank {} lost {} during {} (it exited or did not answer within ddp_timeout {} s): {}", world_.rank, names,
         what, timeout_.count() / 1000, first_line(cause));
  }

 private:
  template <class F>
  Work guarded(const char* what, F&& launch) {
    try {
      return Work(launch(), this, what);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_collective(what, e.what());
    }
  }
  [[nodiscard]] double ring_factor(int passes) const {
    return world_.size > 1 ? passes * static_cast<double>(world_.size - 1) / world_.size : 0.0;
  }
  static double bytes(const at::Tensor& t) { return static_cast<double>(t.numel() * t.element_size()); }
  static std::string first_line(const std::string& s) {
    const auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  c10::intrusive_ptr<c10d::Store> make_store() {
    if (!world_.launched) return c10::make_intrusive<c10d::HashStore>();
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(world_.master_port);
    o.isServer = !world_.agent_store && world_.rank == 0;
    o.numWorkers = world_.agent_store ? std::nullopt : std::optional<std::size_t>(world_.size);
    o.waitWorkers = false;
    o.timeout = timeout_;
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(world_.master_addr, o);
    if (world_.agent_store)
      store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(world_.restart_count), store);
    // The job's keys under their own prefix, so a store shared with torchrun stays tidy.
    return c10::make_intrusive<c10d::PrefixStore>("loom", store);
  }

  std::shared_ptr<::gloo::transport::Device> gloo_device() const {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    const std::string& a = world_.master_addr;
    if (!world_.launched || a == "127.0.0.1" || a == "localhost" || a == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  World world_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  CommCounters counters_;
};

inline void Work::wait() {
  if (!work_) return;
  auto w = std::move(work_);
  try {
    w->wait();
  } catch (const std::exception& e) {
    comm_->fail_collective(what_, e.what());
  }
}

}  // namespace loom::dist
