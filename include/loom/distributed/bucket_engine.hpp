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
//
// --sharding_reduce_dtype bf16 (FSDP2's reduce_dtype; torch DDP's bf16_compress_hook): the
// scaled float32 gradients of a bucket are cast to bfloat16 for the collective, and its
// result is cast back into the float32 gradient buffer (DDP, ZeRO-1) or added to the float32
// gradient shard (ZeRO-2): accumulation, unscaling, clipping and the step stay float32.
//
// find_unused_parameters (--ddp_find_unused_parameters, torch DDP's): before each syncing
// backward the loss's autograd graph is walked; a parameter it does not reach is ready at
// once, so its bucket launches as soon as the reached parameters' gradients are in, instead
// of waiting for after_backward. Which parameters received a gradient in the group (their
// hook fired) is summed over the ranks once per group; a parameter no rank used has its
// gradient left undefined during the optimizer step, so the optimizer skips it (no weight
// decay, no moment update), as one process and torch's DDP leave `.grad` None.

#include <loom/distributed/engine_common.hpp>
#include <loom/distributed/sharding.hpp>
#include <loom/policy/catalog.hpp>

#include <algorithm>
#include <map>
#include <optional>

namespace loom::dist {

class BucketEngine final : public EngineBase {
 public:
  /// The engine of the policy `facts` describes: DDP (nothing sharded), ZeRO-1 (optimizer
  /// state sharded) or ZeRO-2 (gradients too).
  BucketEngine(const ShardingFacts& facts, std::shared_ptr<Comm> comm, const EngineOptions& options)
      : EngineBase(std::move(comm)),
        facts_(facts),
        cap_bytes_(static_cast<int64_t>(options.bucket_cap_mb * 1024 * 1024)),
        find_unused_(options.find_unused_parameters),
        reduce_dtype_(options.reduce_dtype) {}
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
    module_state_ = module_state_bytes(module);  // whole on every rank
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
    std::size_t slots = 0;
    for (auto& b : buckets_) {
      b.first = slots;
      slots += b.slots.size();
    }
    ready_.assign(slots, 0);
    used_.assign(slots, 0);
    pieces_.assign(slots, std::nullopt);
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      auto& b = buckets_[k];
      b.padded = detail::round_up(std::max<int64_t>(b.numel, 1), n);
      b.shard = b.padded / n;
      const auto opts = b.slots.front().param.options().requires_grad(false);
      b.flat_param = torch::zeros({b.padded}, opts);
      if (!facts_.shards_gradients) b.flat_grad = torch::zeros({b.padded}, opts);
      else b.grad_shard = torch::zeros({b.shard}, opts);
      for (std::size_t i = 0; i < b.slots.size(); ++i) {
        auto& s = b.slots[i];
        auto view = b.flat_param.narrow(0, s.offset, s.numel).view(s.param.sizes());
        view.copy_(s.param.detach());
        s.param.set_data(view);
        if (!facts_.shards_gradients)
          s.param.mutable_grad() = b.flat_grad.narrow(0, s.offset, s.numel).view(s.param.sizes());
        detail::set_grad_ready_hook(s.param, [this, k, i] { on_grad_ready(k, i); });
        index_[s.param.unsafeGetTensorImpl()] = {k, i};
        if (facts_.shards_optimizer_state) pieces_[b.first + i] = make_piece(b, s);
      }
    }
  }

  /// The piece of `param` this rank updates (the whole parameter for DDP), or none. A ZeRO
  /// piece is made once, at setup: the engine hides and restores the gradient of the very
  /// tensor the optimizer steps.
  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) override {
    const auto [k, i] = locate(param, name);
    auto& b = buckets_[k];
    const auto& s = b.slots[i];
    if (!facts_.shards_optimizer_state) return Piece{name, param, param.grad(), 0, s.numel, s.numel};
    auto piece = pieces_[b.first + i];
    if (piece) piece->name = name;
    return piece;
  }

  /// Does the optimizer step slices (true) or whole parameters (DDP)?
  [[nodiscard]] bool shards_optimizer() const override { return facts_.shards_optimizer_state; }
  /// Are gradients held in shards, so norms and overflow checks need a reduction?
  [[nodiscard]] bool grads_sharded() const override { return facts_.shards_optimizer_state; }

  /// Starts an accumulation group: no parameter has been used in it yet.
  void begin_group(const GroupItems& items, const torch::Device& device) override {
    EngineBase::begin_group(items, device);
    std::fill(used_.begin(), used_.end(), 0);
  }
  /// Before the backward of a micro-step; `last`: the micro-step that completes the group.
  void begin_micro_step(bool last) override {
    restore_grads();
    last_ = last;
    syncing_ = last || facts_.shards_gradients;
    next_launch_ = 0;
    late_.clear();
    std::fill(ready_.begin(), ready_.end(), 0);
    for (auto& b : buckets_) {
      b.ready = 0;
      b.launched = false;
    }
  }
  /// With find_unused_parameters: every parameter `loss` does not reach is ready now.
  void before_backward(const torch::Tensor& loss) override {
    if (!find_unused_ || !syncing_) return;
    const auto reached = detail::graph_leaves(loss);
    for (std::size_t k = 0; k < buckets_.size(); ++k)
      for (std::size_t i = 0; i < buckets_[k].slots.size(); ++i)
        if (!reached.contains(buckets_[k].slots[i].param.unsafeGetTensorImpl())) slot_ready(k, i);
  }
  /// After the backward of a micro-step: launches what the hooks did not, waits for everything;
  /// at the end of a group with find_unused_parameters, hides the gradients no rank produced.
  void after_backward() override {
    if (!syncing_) return;
    while (next_launch_ < buckets_.size()) {
      launch(next_launch_++);
      ++launches_.after_backward;
    }
    UsedMask mask;
    if (find_unused_ && last_) mask = launch_used_mask();
    for (auto& b : buckets_) {
      b.work.wait();
      if (!facts_.shards_optimizer_state && b.send.defined())
        b.flat_grad.copy_(b.send);  // the reduced gradients, cast back
      else if (facts_.shards_optimizer_state && !facts_.shards_gradients && b.rs_out.defined())
        b.flat_grad.narrow(0, comm_->rank() * b.shard, b.shard).copy_(b.rs_out);
      else if (facts_.shards_gradients && b.rs_out.defined())
        b.grad_shard.add_(b.rs_out);
      b.rs_out = torch::Tensor();
      b.staging = torch::Tensor();
      b.send = torch::Tensor();
    }
    check(late_.empty(),
          "the gradient of {} arrived after its bucket had been reduced: backward ran more than once in one "
          "micro-step under --sharding {}; backpropagate the sum of the losses once", late_,
          facts_.name);
    if (find_unused_ && last_) hide_unused_grads(mask);
    syncing_ = false;
  }
  /// After the optimizer step: every rank gets every updated slice (ZeRO).
  void after_step() override {
    if (!facts_.shards_optimizer_state || comm_->size() == 1) return;
    std::vector<Work> works;
    for (auto& b : buckets_) {
      auto mine = b.flat_param.narrow(0, comm_->rank() * b.shard, b.shard).clone();
      works.push_back(comm_->all_gather(b.flat_param, mine, "the parameter all-gather"));
    }
    for (auto& w : works) w.wait();
  }
  /// Zeroes the gradients the engine holds (their buffers stay allocated).
  void zero_grad() override {
    restore_grads();
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
    s.module_state = module_state_;
    return s;
  }
  /// Bucket collectives launched before after_backward (hooks, unreached parameters) and by it.
  [[nodiscard]] GradLaunches grad_launches() const override { return launches_; }

 private:
  static constexpr int64_t kFirstBucketBytes = 1024 * 1024;
  struct Bucket {
    std::vector<detail::Slot> slots;
    std::size_t first = 0;  // index of slots[0] among all slots (ready_, used_, pieces_)
    int64_t numel = 0, padded = 0, shard = 0;
    torch::Tensor flat_param, flat_grad, grad_shard, staging, rs_out;
    torch::Tensor send;  // the gradients cast to reduce_dtype for the collective (none when float32)
    std::size_t ready = 0;
    bool launched = false;
    Work work;
  };
  // The group's used flags summed over the ranks: `sum` (on the device) once `work` is done;
  // `local_all` when this rank used every parameter, so every rank's sum is positive.
  struct UsedMask {
    torch::Tensor sum;
    Work work;
    bool local_all = true;
  };

  // This rank's piece of slot `s` of `b` (ZeRO), its gradient attached.
  std::optional<Piece> make_piece(const Bucket& b, const detail::Slot& s) const {
    const auto range = detail::owned_range(s, comm_->rank(), b.shard);
    if (!range) return std::nullopt;
    const auto [a, e] = *range;
    Piece p{s.name, b.flat_param.narrow(0, a, e - a), {}, a - s.offset, e - s.offset, s.numel};
    p.grad = facts_.shards_gradients ? b.grad_shard.narrow(0, a - comm_->rank() * b.shard, e - a)
                                    : b.flat_grad.narrow(0, a, e - a);
    p.param.mutable_grad() = p.grad;
    return p;
  }

  // A parameter's gradient was accumulated (its post-accumulate-grad hook).
  void on_grad_ready(std::size_t k, std::size_t i) {
    used_[buckets_[k].first + i] = 1;
    if (syncing_) slot_ready(k, i);
  }

  // Slot i of bucket k needs nothing more in this micro-step: its gradient is in, or the loss
  // does not reach it. A complete bucket launches, in index order only, so every rank issues
  // the same sequence of collectives.
  void slot_ready(std::size_t k, std::size_t i) {
    auto& b = buckets_[k];
    auto& ready = ready_[b.first + i];
    if (ready != 0) {
      // A second gradient in one micro-step (a second backward): harmless until the bucket is
      // launched, a lost contribution after.
      if (b.launched && late_.empty()) late_ = b.slots[i].name;
      return;
    }
    ready = 1;
    if (++b.ready < b.slots.size()) return;
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].ready == buckets_[next_launch_].slots.size()) {
      launch(next_launch_++);
      ++launches_.during_backward;
    }
  }

  // Sums the group's used flags over the ranks (after every bucket, so every rank issues the
  // same sequence); in a world of one the local flags are the sum.
  UsedMask launch_used_mask() {
    UsedMask m;
    m.local_all = std::all_of(used_.begin(), used_.end(), [](char u) { return u != 0; });
    const auto device = buckets_.empty() ? torch::Device(torch::kCPU) : buckets_.front().flat_param.device();
    auto host = torch::empty({static_cast<int64_t>(used_.size())},
                             torch::TensorOptions().dtype(torch::kInt).pinned_memory(device.is_cuda()));
    std::copy(used_.begin(), used_.end(), host.data_ptr<int32_t>());
    m.sum = device.is_cuda() ? host.to(device, /*non_blocking=*/true) : host;
    if (comm_->size() > 1) m.work = comm_->all_reduce({m.sum}, "the used-parameter all-reduce");
    return m;
  }

  // Leaves undefined, until restore_grads, the gradient of every parameter no rank used in
  // the group, so the optimizer step skips it. Reads the sum on the host only when this rank
  // left a parameter unused (otherwise every sum is positive): the one host sync of a step.
  void hide_unused_grads(UsedMask& m) {
    m.work.wait();
    if (m.local_all) return;
    const auto sum = m.sum.to(torch::kCPU);
    const auto* used = sum.data_ptr<int32_t>();
    for (auto& b : buckets_)
      for (std::size_t i = 0; i < b.slots.size(); ++i) {
        if (used[b.first + i] != 0) continue;
        hidden_.push_back(b.first + i);
        if (!facts_.shards_optimizer_state) b.slots[i].param.mutable_grad() = torch::Tensor();
        else if (auto& piece = pieces_[b.first + i]) piece->param.mutable_grad() = torch::Tensor();
      }
  }
  // Gives the hidden gradients back their views into the engine's buffers.
  void restore_grads() {
    for (const auto g : hidden_) {
      const auto it = std::upper_bound(buckets_.begin(), buckets_.end(), g,
                                       [](std::size_t v, const Bucket& b) { return v < b.first; });
      auto& b = *std::prev(it);
      auto& s = b.slots[g - b.first];
      if (!facts_.shards_optimizer_state) s.param.mutable_grad() = b.flat_grad.narrow(0, s.offset, s.numel).view(s.param.sizes());
      else if (auto& piece = pieces_[g]) piece->param.mutable_grad() = piece->grad;
    }
    hidden_.clear();
  }

  void launch(std::size_t k) {
    auto& b = buckets_[k];
    if (b.launched) return;
    b.launched = true;
    torch::NoGradGuard no_grad;
    torch::Tensor grads = b.flat_grad;
    if (facts_.shards_gradients) {
      b.staging = torch::zeros({b.padded}, b.flat_param.options());
      for (auto& s : b.slots) {
        if (s.param.grad().defined()) b.staging.narrow(0, s.offset, s.numel).copy_(s.param.grad().reshape({-1}));
        s.param.mutable_grad() = torch::Tensor();
      }
      grads = b.staging;
    }
    if (comm_->size() == 1) {
      if (facts_.shards_gradients) b.rs_out = b.staging;
      return;
    }
    share_.apply(grads);
    if (reduce_dtype_ != grads.scalar_type()) {
      b.send = grads.to(reduce_dtype_);
      b.staging = torch::Tensor();  // ZeRO-2: the float32 copy is no longer needed
      grads = b.send;
    }
    if (!facts_.shards_optimizer_state) {
      b.work = comm_->all_reduce({grads}, "the gradient all-reduce");
    } else {
      b.rs_out = torch::empty({b.shard}, grads.options());
      b.work = comm_->reduce_scatter(b.rs_out, grads, "the gradient reduce-scatter");
    }
  }

  ShardingFacts facts_;  // which of DDP, ZeRO-1, ZeRO-2 this engine runs
  int64_t cap_bytes_;
  bool find_unused_;
  torch::ScalarType reduce_dtype_;  // --sharding_reduce_dtype
  std::vector<Bucket> buckets_;
  bool syncing_ = false, last_ = false;
  std::size_t next_launch_ = 0;
  // Per slot, in bucket order: ready in this micro-step; used (a gradient arrived) in this
  // group; this rank's ZeRO piece (made at setup).
  std::vector<char> ready_, used_;
  std::vector<std::optional<Piece>> pieces_;
  std::vector<std::size_t> hidden_;  // slots whose gradient is hidden for the optimizer step
  std::string late_;                 // a parameter whose gradient came after its bucket launched
  GradLaunches launches_;
  double module_state_ = 0;           // ModuleState bytes of the model (whole on every rank)
};

/// DDP, ZeRO-1 and ZeRO-2 run the bucket engine, configured by their facts.
template <class Tag>
struct BucketPolicy {
  static std::unique_ptr<Engine> make_engine(std::shared_ptr<Comm> comm, const EngineOptions& options) {
    return std::make_unique<BucketEngine>(Tag::facts, std::move(comm), options);
  }
  /// Every rank keeps a whole float32 replica: FullShard alone gathers parameters in another
  /// format. --offload_optimizer needs an optimizer that steps this rank's pieces (ZeRO-1/2; not
  /// DDP); --offload_param is FullShard's.
  static void can_implement(const TrainingArguments& args, const World&) {
    check(sharding_dtype(args.sharding_param_dtype) == torch::kFloat,
          "--sharding_param_dtype {} applies to --sharding {} (the parameters it gathers); --sharding {} keeps a "
          "whole float32 replica on every rank: drop it (--bf16 computes in bfloat16, --sharding_reduce_dtype {} "
          "halves the gradient traffic)", args.sharding_param_dtype, sharding::FullShard::name, Tag::name,
          sharding_dtype::BFloat16::name);
    check_no_units(args, Tag::name);
    check(!args.offload_optimizer || Tag::facts.shards_optimizer_state,
          "--offload_optimizer needs a sharded optimizer, and --sharding {} keeps the whole optimizer on every rank; "
          "use --sharding {} (any of them also at one process)", Tag::name,
          names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_optimizer_state; }));
    check(!args.offload_param,
          "--offload_param needs --sharding {}: under --sharding {} every rank keeps every parameter on the "
          "device for its forward (DeepSpeed offloads parameters under ZeRO stage 3 only); --offload_optimizer alone "
          "moves the optimizer state", names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_parameters; }),
          Tag::name);
  }
};
template <>
struct ShardingImpl<sharding::DDP> : BucketPolicy<sharding::DDP> {};
template <>
struct ShardingImpl<sharding::ZeRO1> : BucketPolicy<sharding::ZeRO1> {};
template <>
struct ShardingImpl<sharding::ZeRO2> : BucketPolicy<sharding::ZeRO2> {};

}  // namespace loom::dist
