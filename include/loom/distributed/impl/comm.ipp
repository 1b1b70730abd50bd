#pragma once
// Definitions of distributed/comm.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/distributed/env.hpp>

#include <torch/types.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#if defined(LOOM_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace loom::dist {

LOOM_INLINE void Work::wait() {
  if (works_.empty()) return;
  auto works = std::move(works_);
  works_.clear();
  try {
    for (auto& w : works) w->wait();
  } catch (const std::exception& e) {
    comm_->fail_collective(what_, e.what());
  }
}

LOOM_INLINE Comm::Comm(const World& world, torch::Device device, std::chrono::milliseconds timeout)
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

// Here, where c10d::Store and c10d::Backend are complete.
LOOM_INLINE Comm::~Comm() = default;

LOOM_INLINE Work Comm::all_reduce(at::Tensor tensor, const char* what) {
  counters_.all_reduce += ring_factor(2) * bytes(tensor);
  std::vector<at::Tensor> tensors{std::move(tensor)};
  return guarded(what, [&] { return pg_->allreduce(tensors); });
}

LOOM_INLINE Work Comm::reduce_scatter(at::Tensor out, at::Tensor in, const char* what) {
  counters_.reduce_scatter += ring_factor(1) * bytes(in);
  return guarded(what, [&] { return pg_->_reduce_scatter_base(out, in); });
}

LOOM_INLINE Work Comm::all_gather(at::Tensor out, at::Tensor in, const char* what) {
  counters_.all_gather += ring_factor(1) * bytes(out);
  if (device_.is_cuda() || world_.size == 1 || !out.is_contiguous())
    return guarded(what, [&] { return pg_->_allgather_base(out, in); });
  // Gloo gathers into a flat buffer of its own and then copies it into `out` (c10d's
  // newLikeFlat): a second copy of everything gathered, a FullShard unit's size on every rank.
  // One broadcast per rank, each in place in its chunk of `out`, moves the same bytes without it.
  const int64_t n = in.numel();
  auto flat = out.view({-1});
  auto own = flat.narrow(0, static_cast<int64_t>(world_.rank) * n, n);
  if (own.data_ptr() != in.data_ptr()) own.copy_(in.reshape({-1}));
  Work all;
  for (int r = 0; r < world_.size; ++r) {
    std::vector<at::Tensor> chunk{flat.narrow(0, static_cast<int64_t>(r) * n, n)};
    c10d::BroadcastOptions o;
    o.rootRank = r;
    all.join(guarded(what, [&] { return pg_->broadcast(chunk, o); }));
  }
  return all;
}

LOOM_INLINE Work Comm::broadcast(at::Tensor tensor, int root, const char* what) {
  counters_.broadcast += bytes(tensor);
  std::vector<at::Tensor> tensors{std::move(tensor)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  return guarded(what, [&] { return pg_->broadcast(tensors, o); });
}

LOOM_INLINE void Comm::barrier(const char* what) {
  // A one-element all-reduce on the group's own device (NCCL's barrier needs a device
  // guess), left out of the counters: it moves no model data.
  std::vector<at::Tensor> t{torch::zeros({1}, torch::TensorOptions().device(device_))};
  guarded(what, [&] { return pg_->allreduce(t); }).wait();
  // Under NCCL, wait() orders the current stream after the collective but returns at once on
  // the host; reading the result blocks the host until every rank has arrived, which is what
  // callers rely on (a checkpoint in place before any rank reads it).
  if (t[0].is_cuda()) (void)t[0].to(torch::kCPU);
}

LOOM_INLINE void Comm::fail_collective(const char* what, const std::string& cause) {
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

LOOM_INLINE double Comm::ring_factor(int passes) const {
  return world_.size > 1 ? passes * static_cast<double>(world_.size - 1) / world_.size : 0.0;
}

LOOM_INLINE double Comm::bytes(const at::Tensor& t) { return static_cast<double>(t.numel() * t.element_size()); }

LOOM_INLINE std::string Comm::first_line(const std::string& s) {
  const auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

LOOM_INLINE c10::intrusive_ptr<c10d::Store> Comm::make_store() {
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
  // The job's keys under their own prefix, so a store shared with torchrun stays tidy, and one
  // prefix per Comm of this process: ProcessGroupNCCL keys its unique id by a per-instance
  // counter from 0, so a second group under the same prefix could read the first one's id.
  // Every rank creates its Comms in the same order, so the n-th Comm agrees across ranks.
  static std::atomic<int> generation{0};
  const int n = generation.fetch_add(1);
  return c10::make_intrusive<c10d::PrefixStore>(n == 0 ? std::string("loom") : "loom/" + std::to_string(n), store);
}

LOOM_INLINE std::shared_ptr<::gloo::transport::Device> Comm::gloo_device() const {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  const std::string& a = world_.master_addr;
  if (!world_.launched || a == "127.0.0.1" || a == "localhost" || a == "::1")
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace loom::dist
