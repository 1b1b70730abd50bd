#pragma once
// FullShard: parameters, gradients and optimizer state all sharded at rest (ZeRO-3, as
// torch's FullyShardedDataParallel).
//
// The user marks units by wrapping blocks: `loom::FullShardUnit<Block>(Block(...))` (or
// loom::full_shard_unit(block)). The wrapper is transparent: it registers the block's own
// parameters, buffers and children under itself, so parameter names are the same with or
// without it, and under any other sharding policy it only forwards. Each unit, plus a root
// unit of the parameters outside every unit, keeps one flat float shard (1/N of its padded
// parameters) and a gradient shard of the same size. Under FullShard:
//
//   forward   the unit's parameters are all-gathered into a flat buffer the parameters are
//             views of; the next unit (in the order of the first forward) is prefetched;
//             after the unit's forward the buffer's memory is released (the views stay).
//   backward  a hook on the unit's output gathers the parameters again (prefetching the
//             unit before it); when the last gradient of the unit is accumulated its flat
//             gradient is scaled, reduce-scattered into the gradient shard and freed, and the
//             parameters are released again.
//   step      the optimizer updates the shard in place; nothing is gathered until the next
//             forward.
// The root unit is gathered at the start of each micro-step and released after its backward.
//
// Mixed precision (FSDP2's MixedPrecisionPolicy): with --sharding_param_dtype bf16 the float32
// shard is cast to bfloat16 before each all-gather, so the gathered buffer, the parameters
// (views of it), their gradients and the flat gradient are bfloat16, and forward and backward
// compute with them (under --bf16's autocast, which these weights need no cast for). The
// optimizer still steps the float32 shard, whose state is float32; the next gather casts the
// updated shard again. --sharding_reduce_dtype chooses the format of the reduce-scatter: the
// flat gradient is scaled in the wider of the two formats and cast to it; the result is added
// to the float32 gradient shard. with_full_params (saving, loading) gathers the float32 shards
// and shows them through the parameters, so checkpoints hold the master weights.
//
// --offload_param (FSDP's CPUOffload(offload_params=True), DeepSpeed's offload_param): the
// shards, which are the fp32 master weights, live in host memory (pinned on CUDA); each gather
// first copies the rank's shard to the device (a buffer of its own, also on a CPU run) and
// all-gathers from there; the offloaded optimizer (OptimizerStep) steps the host shard in
// place. Gradient shards stay on the device. In a world of one the gathered buffer is then
// separate from the shard, filled by that copy.

#include <loom/core/deferred.hpp>
#include <loom/core/log.hpp>
#include <loom/distributed/engine_common.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/distributed/sharding.hpp>

#include <algorithm>
#include <set>
#include <map>
#include <optional>
#include <type_traits>

namespace loom::dist {

class FullShardEngine final : public UnitRuntime, public EngineBase {
 public:
  FullShardEngine(std::shared_ptr<Comm> comm, const EngineOptions& options)
      : EngineBase(std::move(comm)), param_dtype_(options.param_dtype), reduce_dtype_(options.reduce_dtype),
        offload_(options.offload_param), wrap_classes_(options.wrap_classes), min_num_params_(options.min_num_params) {}
  FullShardEngine(const FullShardEngine&) = delete;
  FullShardEngine& operator=(const FullShardEngine&) = delete;
  ~FullShardEngine() override {
    for (auto& u : units_) {
      if (u.wrapper) u.wrapper->loom_runtime = nullptr;
      for (auto& s : u.slots) detail::clear_grad_ready_hook(s.param);
    }
  }

  void setup(torch::nn::Module& module) override {
    torch::NoGradGuard no_grad;
    broadcast_module(module);
    // Units: the FullShardUnits the wrap policy chooses (every one by default), nested ones
    // too; each parameter belongs to the innermost chosen unit around it, the rest to the root.
    units_.emplace_back();  // index 0: root
    const auto candidates = unit_candidates(module, wrap_classes_, min_num_params_);  // pre-order
    std::map<const void*, int> owner;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].wrapper->loom_runtime = nullptr;  // a block not chosen only forwards
      if (!candidates[i].chosen) continue;
      for (const auto& p : candidates[i].module->parameters(true))
        owner[p.unsafeGetTensorImpl()] = static_cast<int>(units_.size());  // an inner unit comes later and wins
      units_.emplace_back();
      units_.back().wrapper = candidates[i].wrapper;
      units_.back().name = candidates[i].name;
    }
    for (const auto& item : module.named_parameters(true)) {
      const auto& p = item.value();
      if (!p.requires_grad()) continue;
      check(p.scalar_type() == torch::kFloat, "sharding needs float32 parameters (the master weights); {} is {}",
            item.key(), c10::toString(p.scalar_type()));
      auto it = owner.find(p.unsafeGetTensorImpl());
      auto& u = units_[it == owner.end() ? 0 : it->second];
      u.slots.push_back({p, item.key(), u.numel, p.numel()});
      u.numel += p.numel();
    }
    const int64_t n = comm_->size(), r = comm_->rank();
    // A parameter built under loom::DeferredInit holds no memory: only this rank's slice of
    // it is ever materialized, from the model's values (its seeded init or its weight files).
    const auto* values = dynamic_cast<const DeferredValues*>(&module);
    for (std::size_t k = 0; k < units_.size(); ++k) {
      auto& u = units_[k];
      if (u.wrapper) {
        u.wrapper->loom_runtime = this;
        u.wrapper->loom_unit = static_cast<int>(k);
      }
      if (u.slots.empty()) continue;
      const auto opts = u.slots.front().param.options().requires_grad(false);
      u.padded = detail::round_up(u.numel, n);
      u.shard_numel = u.padded / n;
      // A world of one, not offloaded: the shard is the whole unit and the gathered buffer
      // itself (unless that is of another dtype), so nothing is ever copied or released.
      const bool whole = resident() && !offload_;
      const auto shard_opts = offload_ ? opts.device(torch::kCPU).pinned_memory(opts.device().is_cuda()) : opts;
      u.shard = torch::zeros({whole ? u.padded : u.shard_numel}, shard_opts);
      u.grad_shard = torch::zeros({u.shard_numel}, opts);
      const int64_t lo = whole ? 0 : r * u.shard_numel, hi = lo + u.shard.numel();
      for (const auto& s : u.slots) {
        const int64_t a = std::max(lo, s.offset), e = std::min(hi, s.offset + s.numel);
        if (a >= e) continue;
        auto dst = u.shard.narrow(0, a - lo, e - a);
        if (holds_no_storage(s.param)) {
          check(values != nullptr, "parameter {} holds no memory, and the model gives no values for it (build the "
                "model itself under loom::DeferredInit)", s.name);
          values->initial_values(s.name, s.param, a - s.offset, e - s.offset, dst);
        } else {
          dst.copy_(s.param.detach().reshape({-1}).narrow(0, a - s.offset, e - a));
        }
      }
      // The gathered buffer: allocated (untouched) only to make the parameters views of it,
      // then released until the first gather.
      u.full = whole && !casts_params() ? u.shard : torch::empty({u.padded}, opts.dtype(param_dtype_));
      for (std::size_t i = 0; i < u.slots.size(); ++i) {
        auto& s = u.slots[i];
        s.param.set_data(u.full.narrow(0, s.offset, s.numel).view(s.param.sizes()));
        s.param.mutable_grad() = torch::Tensor();
        detail::set_grad_ready_hook(s.param, [this, k] { on_grad_ready(k); });
        index_[s.param.unsafeGetTensorImpl()] = {k, i};
      }
      release(u);
    }
  }

  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) override {
    const auto [k, i] = locate(param, name);
    auto& u = units_[k];
    const auto& s = u.slots[i];
    const auto range = detail::owned_range(s, comm_->rank(), u.shard_numel);
    if (!range) return std::nullopt;
    const auto [a, e] = *range;
    const int64_t lo = comm_->rank() * u.shard_numel;
    return Piece{name, u.shard.narrow(0, a - lo, e - a), u.grad_shard.narrow(0, a - lo, e - a), a - s.offset,
                 e - s.offset, s.numel, offload_};
  }
  [[nodiscard]] bool shards_optimizer() const override { return true; }
  [[nodiscard]] bool grads_sharded() const override { return true; }

  void begin_micro_step(bool /*last*/) override {
    for (auto& u : units_) {
      u.ready = 0;
      u.backward_started = false;
      u.reduced = false;
    }
    in_backward_pass_ = true;
    auto& root = units_[0];
    if (!root.slots.empty()) {
      gather(root);
      prepare_grads(root);
      root.backward_started = true;
    }
  }
  // --ddp_find_unused_parameters means nothing here: a unit whose gradients did not all
  // arrive is reduced by after_backward, the root unit always is.
  void before_backward(const torch::Tensor& /*loss*/) override {}
  void after_backward() override {
    // Units whose gradients did not all arrive (unused parameters) are reduced now, in
    // index order; then every reduction is waited for.
    for (std::size_t k = 1; k < units_.size(); ++k)
      if (units_[k].backward_started && reduce(units_[k])) ++launches_.after_backward;
    if (!units_[0].slots.empty() && reduce(units_[0])) ++launches_.after_backward;
    for (auto& u : units_) {
      u.work.wait();
      if (u.rs_out.defined()) u.grad_shard.add_(u.rs_out);
      u.rs_out = torch::Tensor();
      u.full_grad = torch::Tensor();
      if (!u.slots.empty()) release(u);
    }
    in_backward_pass_ = false;
  }
  void after_step() override {}
  void zero_grad() override {
    for (auto& u : units_)
      if (u.grad_shard.defined()) u.grad_shard.zero_();
  }

  /// Runs `fn` with every parameter gathered; afterwards the shards take the (possibly
  /// changed) values and the gathered copies are released.
  void with_full_params(const std::function<void()>& fn) override {
    if (casts_params()) {
      with_master_params(fn);
      return;
    }
    for (auto& u : units_)
      if (!u.slots.empty()) gather(u);
    fn();
    torch::NoGradGuard no_grad;
    for (auto& u : units_) {
      if (u.slots.empty()) continue;
      if (!params_aliased()) u.shard.copy_(u.full.narrow(0, comm_->rank() * u.shard_numel, u.shard_numel));
      release(u);
    }
  }
  /// Around forward passes without backward (evaluation): the root stays gathered.
  void begin_forward_only() override {
    if (!units_[0].slots.empty()) gather(units_[0]);
  }
  void end_forward_only() override {
    for (auto& u : units_)
      if (!u.slots.empty()) release(u);
  }

  [[nodiscard]] std::vector<std::string> unit_names() const override {
    std::vector<std::string> names;
    for (const auto& u : units_) names.push_back(u.name);
    return names;
  }

  [[nodiscard]] StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& u : units_) {
      if (u.slots.empty()) continue;
      const auto gathered = static_cast<double>(params_aliased() ? 0 : u.full.storage().nbytes());
      (offload_ ? s.host : s.params) += static_cast<double>(u.shard.nbytes());
      s.params += gathered;
      s.grads += static_cast<double>(u.grad_shard.nbytes());
    }
    return s;
  }
  /// Unit reductions launched from gradient hooks and by after_backward (the root's, and
  /// those of units with an unused parameter).
  [[nodiscard]] GradLaunches grad_launches() const override { return launches_; }

  // ---- UnitRuntime --------------------------------------------------------------------
  void pre_forward(int k) override {
    auto& u = units_[static_cast<std::size_t>(k)];
    if (!recorded_) {
      if (!order_.empty() && order_.front() == k) recorded_ = true;  // the second pass began
      else order_.push_back(k);
    }
    if (u.slots.empty()) return;
    gather(u);
    if (recorded_) prefetch(next_in_order(k, +1));
  }
  torch::Tensor post_forward(int k, torch::Tensor out) override {
    auto& u = units_[static_cast<std::size_t>(k)];
    if (u.slots.empty()) return out;
    if (torch::GradMode::is_enabled() && out.requires_grad() && in_backward_pass_) {
      out.register_hook([this, k](const torch::Tensor& g) {
        pre_backward(k);
        return g;
      });
    }
    release(u);
    return out;
  }

 private:
  struct Unit {
    FullShardUnitBase* wrapper = nullptr;
    std::string name;
    std::vector<detail::Slot> slots;
    int64_t numel = 0, padded = 0, shard_numel = 0;
    torch::Tensor full, shard, grad_shard, full_grad, rs_out;
    torch::Tensor cast_shard;  // the shard cast to param_dtype, sent by the all-gather in flight
    torch::Tensor staged;      // --offload_param: the host shard's copy on the device, until released
    Work gather_work, work;
    bool gathered = false, backward_started = false, reduced = false;
    std::size_t ready = 0;
  };

  int next_in_order(int k, int dir) const {
    for (std::size_t i = 0; i < order_.size(); ++i)
      if (order_[i] == k) {
        const auto j = static_cast<std::ptrdiff_t>(i) + dir;
        if (j >= 0 && j < static_cast<std::ptrdiff_t>(order_.size())) return order_[static_cast<std::size_t>(j)];
      }
    return -1;
  }

  void pre_backward(int k) {
    auto& u = units_[static_cast<std::size_t>(k)];
    if (u.backward_started) return;
    u.backward_started = true;
    gather(u);
    prepare_grads(u);
    prefetch(next_in_order(k, -1));
  }

  void prepare_grads(Unit& u) {
    // A world of one accumulates straight into the gradient shard (the whole unit).
    u.full_grad = grads_aliased() ? u.grad_shard : torch::zeros({u.padded}, u.grad_shard.options().dtype(param_dtype_));
    for (auto& s : u.slots) s.param.mutable_grad() = u.full_grad.narrow(0, s.offset, s.numel).view(s.param.sizes());
  }

  void on_grad_ready(std::size_t k) {
    auto& u = units_[k];
    if (k == 0 || !u.backward_started) return;  // the root is reduced after backward
    if (++u.ready == u.slots.size() && reduce(u)) ++launches_.during_backward;
  }

  // Launches the unit's reduction unless done; false when there was nothing to launch.
  bool reduce(Unit& u) {
    if (u.reduced || !u.full_grad.defined()) return false;
    u.reduced = true;
    torch::NoGradGuard no_grad;
    for (auto& s : u.slots) s.param.mutable_grad() = torch::Tensor();
    if (resident() && !grads_aliased()) {
      u.rs_out = u.full_grad;  // a world of one: after_backward adds it to grad_shard
    } else if (!resident()) {  // (aliased, the gradients are already in grad_shard)
      // Scaled in the wider format: float32 unless both are bfloat16.
      auto& send = u.full_grad;
      if (reduce_dtype_ == torch::kFloat && send.scalar_type() != torch::kFloat) send = send.to(torch::kFloat);
      share_.apply(send);
      if (send.scalar_type() != reduce_dtype_) send = send.to(reduce_dtype_);
      u.rs_out = torch::empty({u.shard_numel}, send.options());
      u.work = comm_->reduce_scatter(u.rs_out, send, "the gradient reduce-scatter");
    }
    if (&u != &units_[0]) release(u);
    return true;
  }

  void prefetch(int k) {
    if (k < 0) return;
    auto& u = units_[static_cast<std::size_t>(k)];
    if (u.slots.empty() || u.gathered || u.gather_work.pending()) return;
    launch_gather(u);
  }
  // A world of one: gradients accumulate straight into the gradient shard.
  [[nodiscard]] bool resident() const { return comm_->size() == 1; }
  // The gathered parameters are of another dtype than the float32 shards.
  [[nodiscard]] bool casts_params() const { return param_dtype_ != torch::kFloat; }
  // The gathered buffer is the shard itself (a world of one, no cast, not offloaded): nothing
  // to gather or free.
  [[nodiscard]] bool params_aliased() const { return resident() && !casts_params() && !offload_; }
  // The gradient buffer is the gradient shard itself (a world of one, no cast).
  [[nodiscard]] bool grads_aliased() const { return resident() && !casts_params(); }
  void launch_gather(Unit& u) {
    if (params_aliased()) return;
    detail::alloc_storage(u.full, static_cast<std::size_t>(u.padded) * u.full.element_size());
    torch::Tensor source = u.shard;
    if (offload_) {  // the host shard to the device first (cast on the way)
      u.staged = u.shard.to(u.full.device(), u.full.scalar_type(), /*non_blocking=*/u.full.is_cuda(), /*copy=*/true);
      source = u.staged;
    } else if (casts_params() && !resident()) {
      u.cast_shard = u.shard.to(param_dtype_);
      source = u.cast_shard;
    }
    if (resident()) {  // a world of one gathers by copying (and casting) its shard
      u.full.copy_(source);
      u.gathered = true;
      return;
    }
    u.gather_work = comm_->all_gather(u.full, source, "the parameter all-gather");
  }
  void gather(Unit& u) {
    if (u.gathered) return;
    if (!u.gather_work.pending()) launch_gather(u);
    u.gather_work.wait();
    u.cast_shard = torch::Tensor();
    u.gathered = true;
  }
  void release(Unit& u) {
    u.gather_work.wait();
    u.cast_shard = torch::Tensor();
    u.gathered = false;
    u.staged = torch::Tensor();
    if (!params_aliased()) detail::free_storage(u.full);
  }

  // with_full_params when the gathered parameters are not float32: each unit's float32 shards
  // are gathered into a buffer of their own and the parameters show it while `fn` runs (what
  // is saved, or loaded, are the master weights); then the shards take the values back and
  // the parameters their gathered-dtype views again.
  void with_master_params(const std::function<void()>& fn) {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> masters(units_.size());
    std::vector<std::vector<torch::Tensor>> views(units_.size());
    std::vector<torch::Tensor> sent(units_.size());  // an offloaded shard's copy on the device
    std::vector<Work> works;
    for (std::size_t k = 0; k < units_.size(); ++k) {
      auto& u = units_[k];
      if (u.slots.empty()) continue;
      release(u);  // as the float32 path leaves it afterwards
      // On the device (grad_shard's place and float32), also when the shard is offloaded.
      masters[k] = resident() && !offload_ ? u.shard : torch::empty({u.padded}, u.grad_shard.options());
      if (resident() && offload_) {
        masters[k].copy_(u.shard);
      } else if (!resident()) {
        sent[k] = offload_ ? u.shard.to(u.grad_shard.device()) : u.shard;
        works.push_back(comm_->all_gather(masters[k], sent[k], "the master-weight all-gather"));
      }
    }
    for (auto& w : works) w.wait();
    for (std::size_t k = 0; k < units_.size(); ++k)
      for (auto& s : units_[k].slots) {
        views[k].push_back(s.param.variable_data());
        s.param.set_data(masters[k].narrow(0, s.offset, s.numel).view(s.param.sizes()));
      }
    fn();
    for (std::size_t k = 0; k < units_.size(); ++k) {
      auto& u = units_[k];
      if (u.slots.empty()) continue;
      if (!resident() || offload_) u.shard.copy_(masters[k].narrow(0, comm_->rank() * u.shard_numel, u.shard_numel));
      for (std::size_t i = 0; i < u.slots.size(); ++i) u.slots[i].param.set_data(views[k][i]);
    }
  }


  std::vector<Unit> units_;
  std::vector<int> order_;
  bool recorded_ = false;
  bool in_backward_pass_ = false;
  GradLaunches launches_;
  torch::ScalarType param_dtype_, reduce_dtype_;  // --sharding_param_dtype, --sharding_reduce_dtype
  bool offload_ = false;                           // --offload_param
  std::vector<std::string> wrap_classes_;          // --fsdp_transformer_layer_cls_to_wrap
  int64_t min_num_params_ = 0;                     // --fsdp_min_num_params
};

template <>
struct ShardingImpl<sharding::FullShard> {
  static std::unique_ptr<Engine> make_engine(std::shared_ptr<Comm> comm, const EngineOptions& options) {
    return std::make_unique<FullShardEngine>(std::move(comm), options);
  }
  /// HF ignores --ddp_find_unused_parameters outside DDP; loom says so when it was asked for.
  /// Gathered bfloat16 parameters compute under --bf16's autocast: without it a float32
  /// activation would meet a bfloat16 weight.
  static void can_implement(const TrainingArguments& args, const World&) {
    check(sharding_dtype(args.sharding_param_dtype) == torch::kFloat || args.bf16,
          "--sharding_param_dtype {0} computes forward and backward with {0} parameters under autocast: add --{1} "
          "(without it a float32 activation meets a {0} weight)", args.sharding_param_dtype, precision::BF16::name);
    if (args.ddp_find_unused_parameters.value_or(false))
      log_message(LogLevel::warning,
                  "--ddp_find_unused_parameters has no effect under --sharding {}: a unit whose gradients did "
                  "not all arrive is reduced after backward, and a parameter no rank used is stepped with a zero "
                  "gradient", sharding::FullShard::name);
  }
};

}  // namespace loom::dist
