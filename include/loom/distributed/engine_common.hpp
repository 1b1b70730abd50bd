#pragma once
// Pieces shared by the sharding engines (distributed/bucket_engine.hpp for DDP, ZeRO-1 and
// ZeRO-2; distributed/full_shard.hpp for FullShard): EngineBase (the dist::Engine members
// every engine shares), the per-parameter post-accumulate-grad hook, and storage that can be
// freed and re-allocated under live views (how FullShard frees gathered parameters that
// autograd still refers to). What an engine hands the Trainer is in engine.hpp.

#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/comm.hpp>
#include <loom/distributed/engine.hpp>

#include <torch/torch.h>

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace loom::dist {

namespace detail {

/// The leaf tensors whose gradients backpropagating `root` accumulates (keyed by
/// TensorImpl): the variable of every AccumulateGrad node reachable from root's grad_fn, as
/// torch's DDP finds unused parameters. Empty when root does not require grad.
inline std::unordered_set<const c10::TensorImpl*> graph_leaves(const torch::Tensor& root) {
  std::unordered_set<const c10::TensorImpl*> leaves;
  if (!root.defined() || !root.requires_grad()) return leaves;
  if (root.is_leaf()) {
    leaves.insert(root.unsafeGetTensorImpl());
    return leaves;
  }
  std::vector<torch::autograd::Node*> stack{root.grad_fn().get()};
  std::unordered_set<const torch::autograd::Node*> seen{stack.front()};
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(node)) {
      leaves.insert(acc->variable.unsafeGetTensorImpl());
      continue;
    }
    for (const auto& edge : node->next_edges()) {
      auto* next = edge.function.get();
      if (next != nullptr && seen.insert(next).second) stack.push_back(next);
    }
  }
  return leaves;
}

// Calls `fn` after autograd has accumulated a parameter's gradient.
class PostAccumulateHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  explicit PostAccumulateHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  void operator()(const torch::autograd::Variable&) override { fn_(); }

 private:
  std::function<void()> fn_;
};

inline void set_grad_ready_hook(const torch::Tensor& param, std::function<void()> fn) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, std::make_unique<PostAccumulateHook>(std::move(fn)));
}
inline void clear_grad_ready_hook(const torch::Tensor& param) {
  torch::autograd::impl::set_post_acc_grad_hooks(param, nullptr);
}

// Releases the memory behind `t` and every view of it; the views keep their geometry.
inline void free_storage(const torch::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}
// Gives `t`'s storage (freed by free_storage) `nbytes` of fresh, uninitialized memory.
inline void alloc_storage(const torch::Tensor& t, std::size_t nbytes) {
  auto* s = t.storage().unsafeGetStorageImpl();
  if (s->nbytes() == nbytes) return;
  // The allocator allocates on the thread's current device: make it the tensor's (on rank
  // r > 0 the forward's thread may not have cuda:r current; backward's threads do).
  const c10::DeviceGuard guard(t.device());
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// A parameter's place in a flat buffer: elements [offset, offset + numel).
struct Slot {
  torch::Tensor param;
  std::string name;
  int64_t offset, numel;
};

// The elements [begin, end) of `slot` that rank `rank` owns when every rank owns `shard`
// consecutive elements of the flat buffer (rank r: [r * shard, (r + 1) * shard)); none when
// the slot lies outside them.
inline std::optional<std::pair<int64_t, int64_t>> owned_range(const Slot& slot, int64_t rank, int64_t shard) {
  const int64_t begin = std::max(rank * shard, slot.offset);
  const int64_t end = std::min((rank + 1) * shard, slot.offset + slot.numel);
  if (begin >= end) return std::nullopt;
  return std::pair{begin, end};
}

// The factor each rank's gradient is scaled by before the SUM: its share of the group's
// items (local / global), so the sum over ranks is the gradient of the loss normalized by
// the items of the whole global batch, as one process with the global batch computes it.
// Without across_ranks (HF's average_tokens_across_devices false) it is 1 / world: each rank
// normalized by its own items, the ranks averaged, as DDP's mean; no count is exchanged.
// When the model divides by the global count itself (model_divides), there is no factor and
// the count is kept for it: HF multiplies such a loss by the world and DDP averages, the same
// sum.
class ItemShare {
 public:
  void begin_group(Comm* comm, const GroupItems& items, const torch::Device& device) {
    global_ = torch::Tensor();
    if (comm == nullptr || comm->size() == 1) {
      factor_ = torch::Tensor();
      return;
    }
    if (!items.across_ranks) {
      if (!uniform_.defined() || uniform_.device() != device)
        uniform_ = torch::full({}, 1.0 / static_cast<double>(comm->size()),
                               torch::TensorOptions().device(device).dtype(torch::kFloat));
      factor_ = uniform_;
      return;
    }
    auto opts = torch::TensorOptions().device(device).dtype(torch::kDouble);
    auto local = torch::full({1}, static_cast<double>(items.local), opts);
    auto global = local.clone();
    comm->all_reduce({global}, "the item count all-reduce").wait();
    if (items.model_divides) {
      factor_ = torch::Tensor();
      global_ = global.to(torch::kFloat).reshape({});
      return;
    }
    factor_ = (local / global.clamp_min(1.0)).to(torch::kFloat).reshape({});
  }
  /// local / global items (or 1 / world) on the device; undefined in a world of one or when
  /// the model divides by the global count.
  [[nodiscard]] const torch::Tensor& factor() const { return factor_; }
  /// The global count (float32, on the device) when the model divides by it; else undefined.
  [[nodiscard]] const torch::Tensor& global() const { return global_; }
  void apply(torch::Tensor& t) const {
    if (factor_.defined()) t.mul_(factor_);
  }

 private:
  torch::Tensor factor_;
  torch::Tensor global_;
  torch::Tensor uniform_;  // 1 / world on the device (across_ranks false)
};

}  // namespace detail

/// What every sharding engine shares: the process group, the item share of each
/// accumulation group, SUM for the Trainer's reductions, and the start-up broadcast.
class EngineBase : public Engine {
 public:
  explicit EngineBase(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}

  /// The engine keeps the gradients (flat buffers or shards) and zeroes them.
  [[nodiscard]] bool owns_grads() const override { return true; }

  /// Starts an accumulation group whose micro-batches hold `items.local` items on this rank.
  void begin_group(const GroupItems& items, const torch::Device& device) override {
    share_.begin_group(comm_.get(), items, device);
  }
  /// local / global items of the group, on the device; undefined in a world of one.
  [[nodiscard]] const torch::Tensor& item_factor() const override { return share_.factor(); }
  /// The group's global count when the model divides by it.
  [[nodiscard]] const torch::Tensor& global_items() const override { return share_.global(); }
  /// In-place SUM over ranks.
  void all_reduce(torch::Tensor& t, const char* what) override {
    if (comm_->size() > 1) comm_->all_reduce({t}, what).wait();
  }
  [[nodiscard]] Comm* comm() const override { return comm_.get(); }

 protected:
  // Where each trainable parameter lives: (bucket or unit, slot), by TensorImpl.
  std::pair<std::size_t, std::size_t> locate(const torch::Tensor& param, const std::string& name) const {
    auto it = index_.find(param.unsafeGetTensorImpl());
    check(it != index_.end(), "the optimizer steps {}, which is not a trainable parameter of the model", name);
    return it->second;
  }

  // Every rank starts from rank 0's parameters and buffers. A parameter that holds no memory
  // yet (loom::DeferredInit) is materialized alike on every rank from the model's values.
  void broadcast_module(torch::nn::Module& module) {
    if (comm_->size() == 1) return;
    std::vector<Work> works;
    for (const auto& p : module.parameters(true))
      if (!holds_no_storage(p)) works.push_back(broadcast_one(p.detach()));
    for (const auto& b : module.buffers(true)) works.push_back(broadcast_one(b.detach()));
    for (auto& w : works) w.wait();
  }

  std::shared_ptr<Comm> comm_;
  detail::ItemShare share_;
  std::map<const void*, std::pair<std::size_t, std::size_t>> index_;

 private:
  Work broadcast_one(const torch::Tensor& t) {
    check(t.is_contiguous(), "sharding needs contiguous parameters and buffers");
    return comm_->broadcast({t}, 0, "the initial parameter broadcast");
  }
};

}  // namespace loom::dist
