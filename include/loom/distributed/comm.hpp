#pragma once
// Comm: the job's process group, and the only place in loom that names c10d (this header
// and its definitions in impl/comm.ipp, which hold the store and process-group headers).
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

#include <loom/config/inline.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/env.hpp>

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

// c10d::Work is held by value in Work (copied, moved and destroyed in callers), so it is
// complete here; the store and process-group headers are needed by impl/comm.ipp only.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifndef USE_C10D_GLOO
#error "loom: distributed/ needs ProcessGroupGloo; build with USE_C10D_GLOO and Gloo's headers (libgloo-dev)"
#endif

// Held through pointers only (c10::intrusive_ptr accepts an incomplete target); complete in
// impl/comm.ipp, where Comm's constructor and destructor are.
namespace c10d {
class Store;
class Backend;
}  // namespace c10d
namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace loom::dist {

class Comm;

/// A collective in flight; wait() returns when its result is usable (on CUDA: ordered on the
/// current stream), or throws loom::Error naming the lost ranks.
class Work {
 public:
  Work() = default;
  Work(c10::intrusive_ptr<c10d::Work> work, Comm* comm, const char* what) : comm_(comm), what_(what) {
    works_.push_back(std::move(work));
  }
  /// Waits for every collective this Work holds.
  void wait();
  [[nodiscard]] bool pending() const { return !works_.empty(); }
  /// Takes `other`'s collectives: one Work for a collective made of several.
  void join(Work&& other) {
    if (comm_ == nullptr) {
      comm_ = other.comm_;
      what_ = other.what_;
    }
    for (auto& w : other.works_) works_.push_back(std::move(w));
    other.works_.clear();
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
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
  Comm(const World& world, torch::Device device, std::chrono::milliseconds timeout);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  [[nodiscard]] int rank() const { return world_.rank; }
  [[nodiscard]] int size() const { return world_.size; }
  [[nodiscard]] const World& world() const { return world_; }
  [[nodiscard]] const torch::Device& device() const { return device_; }
  [[nodiscard]] const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_ = {}; }

  /// In-place SUM over ranks of `tensor`. One tensor a call: ProcessGroupNCCL refuses several
  /// (it reads a list as one tensor per device of this process, a mode it no longer supports).
  Work all_reduce(at::Tensor tensor, const char* what = "all_reduce");
  /// `out` (numel n) = SUM over ranks of in[rank*n : (rank+1)*n].
  Work reduce_scatter(at::Tensor out, at::Tensor in, const char* what = "reduce_scatter");
  /// `out` = concatenation over ranks of `in`.
  Work all_gather(at::Tensor out, at::Tensor in, const char* what = "all_gather");
  /// `tensor` of rank `root` copied to every rank.
  Work broadcast(at::Tensor tensor, int root = 0, const char* what = "broadcast");
  /// Returns when every rank has called it.
  void barrier(const char* what = "barrier");

  /// Turns the failure of collective `what` into a loom::Error naming the lost ranks.
  [[noreturn]] void fail_collective(const char* what, const std::string& cause);

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
  [[nodiscard]] double ring_factor(int passes) const;
  static double bytes(const at::Tensor& t);
  static std::string first_line(const std::string& s);

  c10::intrusive_ptr<c10d::Store> make_store();
  std::shared_ptr<::gloo::transport::Device> gloo_device() const;

  World world_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> pg_;
  CommCounters counters_;
};

}  // namespace loom::dist

#if defined(LOOM_HEADER_ONLY)
#include <loom/distributed/impl/comm.ipp>
#endif
