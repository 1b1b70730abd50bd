#pragma once
// BucketEngine: gradient buckets for DDP, ZeRO-1 and ZeRO-2.
//
// Trainable parameters are grouped into buckets in reverse registration order (the order
// backward usually produces their gradients): the first bucket holds up to 1 MB, the others
// up to ddp_bucket_cap_mb (25 MB), as torch's DistributedDataParallel. Each bucket is one
// flat float buffer padded to a multiple of the world size; rank r owns the r-th of its N
// equal slices (the ZeRO partition, by flat ranges). Parameters are views into the bucket's
// flat parameter buffer.
//
//   DDP     gradients are views into a flat gradient buffer (no copy); on the last
//           micro-step of an accumulation group, a bucket is all-reduced as soon as its last
//           gradient is accumulated (post-accumulate-grad hooks), buckets strictly in index
//           order on every rank; micro-steps before it communicate nothing.
//   ZeRO-1  as DDP, but the bucket is reduce-scattered: each rank gets the summed gradient
//           of its slice, steps the optimizer on that slice only (optimizer state for 1/N
//           of the parameters), and the updated slices are all-gathered.
//   ZeRO-2  no full gradient buffer is kept: a bucket's gradients are copied into a
//           transient buffer and reduce-scattered into a persistent 1/N gradient shard on
//           every micro-step (a shard cannot hold an unreduced full gradient), then freed.
//
// Before the SUM every gradient is scaled by this rank's share of the group's items, so the
// result equals one process training on the global batch (docs/semantics.md).

#include <loom/distributed/engine_common.hpp>

#include <algorithm>
#include <map>
#include <optional>

namespace loom::dist {

enum class Stage { ddp, zero1, zero2 };

class BucketEngine final : public EngineBase {
 public:
  BucketEngine(Stage stage, std::shared_ptr<Comm> comm, double bucket_cap_mb)
      : EngineBase(std::move(comm)), stage_(stage), cap_bytes_(static_cast<int64_t>(bucket_cap_mb * 1024 * 1024)) {}
  BucketEngine(const BucketEngine&) = delete;
  BucketEngine& operator=(const BucketEngine&) = delete;
  ~BucketEngine() {
    for (auto& b : buckets_)
      for (auto& s : b.slots) detail::clear_grad_ready_hook(s.param);
  }

  /// Broadcasts rank 0's parameters and buffers, builds the buckets and registers the hooks.
  void setup(torch::nn::Module& module) override {
    torch::NoGradGuard no_grad;
    broadcast_module(module);
    const int64_t n = comm_->size();
    std::vector<std::pair<std::string, torch::Tensor>> params;
    for (const auto& item : module.named_parameters(true))
      if (item.value().requires_grad()) params.emplace_back(item.key(), item.value());
    std::reverse(params.begin(), params.end());
    for (const auto& [name, p] : params) {
      check(p.scalar_type() == torch::kFloat, "sharding needs float32 parameters (the master weights); {} is {}",
            name, c10::toString(p.scalar_type()));
      const int64_t limit = buckets_.size() == 1 ? kFirstBucketBytes : cap_bytes_;
      if (buckets_.empty() || buckets_.back().numel * 4 >= limit) buckets_.emplace_back();
      auto& b = buckets_.back();
      b.slots.push_back({p, name, b.numel, p.numel()});
      b.numel += p.numel();
    }
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      auto& b = buckets_[k];
      b.padded = detail::round_up(std::max<int64_t>(b.numel, 1), n);
      b.shard = b.padded / n;
      const auto opts = b.slots.front().param.options().requires_grad(false);
      b.flat_param = torch::zeros({b.padded}, opts);
      if (stage_ != Stage::zero2) b.flat_grad = torch::zeros({b.padded}, opts);
      else b.grad_shard = torch::zeros({b.shard}, opts);
      for (std::size_t i = 0; i < b.slots.size(); ++i) {
        auto& s = b.slots[i];
        auto view = b.flat_param.narrow(0, s.offset, s.numel).view(s.param.sizes());
        view.copy_(s.param.detach());
        s.param.set_data(view);
        if (stage_ != Stage::zero2)
          s.param.mutable_grad() = b.flat_grad.narrow(0, s.offset, s.numel).view(s.param.sizes());
        detail::set_grad_ready_hook(s.param, [this, k] { on_grad_ready(k); });
        index_[s.param.unsafeGetTensorImpl()] = {k, i};
      }
    }
  }

  /// The piece of `param` this rank updates (the whole parameter for DDP), or none.
  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) override {
    const auto [k, i] = locate(param, name);
    auto& b = buckets_[k];
    const auto& s = b.slots[i];
    if (stage_ == Stage::ddp) return Piece{name, param, param.grad(), 0, s.numel, s.numel};
    const auto range = detail::owned_range(s, comm_->rank(), b.shard);
    if (!range) return std::nullopt;
    const auto [a, e] = *range;
    Piece p{name, b.flat_param.narrow(0, a, e - a), {}, a - s.offset, e - s.offset, s.numel};
    p.grad = stage_ == Stage::zero2 ? b.grad_shard.narrow(0, a - comm_->rank() * b.shard, e - a)
                                    : b.flat_grad.narrow(0, a, e - a);
    return p;
  }

  /// Does the optimizer step slices (true) or whole parameters (DDP)?
  [[nodiscard]] bool shards_optimizer() const override { return stage_ != Stage::ddp; }
  /// Are gradients held in shards, so norms and overflow checks need a reduction?
  [[nodiscard]] bool grads_sharded() const override { return stage_ != Stage::ddp; }

  /// Before the backward of a micro-step; `last`: the micro-step that completes the group.
  void begin_micro_step(bool last) override {
    syncing_ = last || stage_ == Stage::zero2;
    next_launch_ = 0;
    for (auto& b : buckets_) {
      b.ready = 0;
      b.launched = false;
    }
  }
  /// After the backward of a micro-step: launches what the hooks did not, waits for everything.
  void after_backward() override {
    if (!syncing_) return;
    while (next_launch_ < buckets_.size()) launch(next_launch_++);
    for (auto& b : buckets_) {
      b.work.wait();
      if (stage_ == Stage::zero1 && b.rs_out.defined())
        b.flat_grad.narrow(0, comm_->rank() * b.shard, b.shard).copy_(b.rs_out);
      else if (stage_ == Stage::zero2 && b.rs_out.defined())
        b.grad_shard.add_(b.rs_out);
      b.rs_out = torch::Tensor();
      b.staging = torch::Tensor();
    }
    syncing_ = false;
  }
  /// After the optimizer step: every rank gets every updated slice (ZeRO).
  void after_step() override {
    if (stage_ == Stage::ddp || comm_->size() == 1) return;
    std::vector<Work> works;
    for (auto& b : buckets_) {
      auto mine = b.flat_param.narrow(0, comm_->rank() * b.shard, b.shard).clone();
      works.push_back(comm_->all_gather(b.flat_param, mine, "the parameter all-gather"));
    }
    for (auto& w : works) w.wait();
  }
  /// Zeroes the gradients the engine holds (their buffers stay allocated).
  void zero_grad() override {
    for (auto& b : buckets_) {
      if (b.flat_grad.defined()) b.flat_grad.zero_();
      if (b.grad_shard.defined()) b.grad_shard.zero_();
    }
  }
  /// Runs `fn` with every parameter complete on this rank (always true here).
  void with_full_params(const std::function<void()>& fn) override {
    fn();
  }
  void begin_forward_only() override {}
  void end_forward_only() override {}

  /// Parameter and gradient bytes this rank keeps (optimizer state is the optimizer's).
  [[nodiscard]] StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& b : buckets_) {
      s.params += static_cast<double>(b.flat_param.nbytes());
      if (b.flat_grad.defined()) s.grads += static_cast<double>(b.flat_grad.nbytes());
      if (b.grad_shard.defined()) s.grads += static_cast<double>(b.grad_shard.nbytes());
    }
    return s;
  }

 private:
  static constexpr int64_t kFirstBucketBytes = 1024 * 1024;
  struct Bucket {
    std::vector<detail::Slot> slots;
    int64_t numel = 0, padded = 0, shard = 0;
    torch::Tensor flat_param, flat_grad, grad_shard, staging, rs_out;
    std::size_t ready = 0;
    bool launched = false;
    Work work;
  };

  void on_grad_ready(std::size_t k) {
    if (!syncing_) return;
    auto& b = buckets_[k];
    if (++b.ready < b.slots.size()) return;
    // Launch in index order only, so every rank issues the same sequence of collectives.
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].slots.size())
      launch(next_launch_++);
  }

  void launch(std::size_t k) {
    auto& b = buckets_[k];
    if (b.launched) return;
    b.launched = true;
    torch::NoGradGuard no_grad;
    torch::Tensor grads = b.flat_grad;
    if (stage_ == Stage::zero2) {
      b.staging = torch::zeros({b.padded}, b.flat_param.options());
      for (auto& s : b.slots) {
        if (s.param.grad().defined()) b.staging.narrow(0, s.offset, s.numel).copy_(s.param.grad().reshape({-1}));
        s.param.mutable_grad() = torch::Tensor();
      }
      grads = b.staging;
    }
    if (comm_->size() == 1) {
      if (stage_ == Stage::zero2) b.rs_out = b.staging;
      return;
    }
    share_.apply(grads);
    if (stage_ == Stage::ddp) {
      b.work = comm_->all_reduce({grads}, "the gradient all-reduce");
    } else {
      b.rs_out = torch::empty({b.shard}, grads.options());
      b.work = comm_->reduce_scatter(b.rs_out, grads, "the gradient reduce-scatter");
    }
  }

  Stage stage_;
  int64_t cap_bytes_;
  std::vector<Bucket> buckets_;
  bool syncing_ = false;
  std::size_t next_launch_ = 0;
};

}  // namespace loom::dist
