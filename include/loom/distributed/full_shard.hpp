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
//             views of; after the unit's forward the buffer's memory is released (the views
//             stay). --fsdp_forward_prefetch also launches the next unit's gather (in the
//             order of the first forward) before this unit's forward runs.
//   backward  a hook on the unit's output gathers the parameters again; when the last
//             gradient of the unit is accumulated its flat gradient is scaled,
//             reduce-scattered into the gradient shard and freed, and the parameters are
//             released again. --fsdp_backward_prefetch backward_pre launches the gather of the
//             unit before it when its backward starts, backward_post when its gradients are
//             done (FSDP's BackwardPrefetch). Without either, as HF's Trainer configures FSDP,
//             one unit is gathered at a time.
//   step      the optimizer updates the shard in place; nothing is gathered until the next
//             forward. The gradient shards' memory is then freed (zero_grad, set_to_none) and
//             comes back with each unit's first reduction, which lands in it directly.
// The root unit is gathered at the start of each micro-step and released after its backward.
//
// Frozen parameters (a base under an adapter) are sharded too, in a second flat buffer per
// unit (per their dtype), with no gradient and no optimizer state: gathered with the unit for
// its forward and its backward, and released once the unit's backward is over. That moment is
// the gradient of the unit's input (a hook on each input that requires grad: autograd runs it
// after every use of the input inside the unit), or, for a unit with trainable parameters,
// the later of that and the unit's reduction; the end of backward otherwise.
//
// Module state (core/deferred.hpp's ModuleState: a 4-bit base's codes and absmaxes, QLoRA) is
// sharded as FSDP + QLoRA shards bitsandbytes' quantized storage: a third flat buffer per unit,
// of bytes (each tensor's bytes at an offset aligned to 4 bytes, so the gathered buffer shows each
// again in its dtype), gathered and released with the frozen parameters. The modules hold
// views of the gathered buffer. A state built without memory (loom::DeferredInit) is computed
// one module at a time (its whole weight materialized and quantized), and only this rank's
// bytes are kept.
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
#include <utility>

namespace loom::dist {

class FullShardEngine final : public UnitRuntime, public EngineBase {
 public:
  FullShardEngine(std::shared_ptr<Comm> comm, const EngineOptions& options)
      : EngineBase(std::move(comm)), param_dtype_(options.param_dtype), reduce_dtype_(options.reduce_dtype),
        offload_(options.offload_param), forward_prefetch_(options.forward_prefetch),
        backward_prefetch_(options.backward_prefetch), wrap_classes_(options.wrap_classes),
        min_num_params_(options.min_num_params) {}
  FullShardEngine(const FullShardEngine&) = delete;
  FullShardEngine& operator=(const FullShardEngine&) = delete;
  ~FullShardEngine() override {
    for (auto& u : units_) {
      if (u.wrapper) u.wrapper->loom_runtime = nullptr;
      for (auto& s : u.train.slots) detail::clear_grad_ready_hook(s.param);
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
    // A parameter built under loom::DeferredInit holds no memory: only this rank's slice of
    // it is ever materialized, from the model's values (its seeded init or its weight files).
    const auto* values = dynamic_cast<const DeferredValues*>(&module);
    std::set<const void*> whole;  // frozen, kept whole (see below)
    for (const auto& item : module.named_parameters(true)) {
      const auto& p = item.value();
      auto it = owner.find(p.unsafeGetTensorImpl());
      auto& u = units_[it == owner.end() ? 0 : it->second];
      if (p.requires_grad()) {
        check(p.scalar_type() == torch::kFloat, "sharding needs float32 parameters (the master weights); {} is {}",
              item.key(), c10::toString(p.scalar_type()));
        u.train.add(p, item.key());
      } else if (p.numel() == 0) {
        continue;  // a 4-bit layer's empty weight: its 4-bit state is module state (below)
      } else if (!p.is_floating_point() ||
                 (!u.frozen.slots.empty() && u.frozen.slots.front().param.scalar_type() != p.scalar_type())) {
        whole.insert(p.unsafeGetTensorImpl());  // one dtype per flat buffer: another one stays whole
      } else {
        u.frozen.add(p, item.key());
      }
    }
    materialize(module, [&](const torch::Tensor& p) { return whole.contains(p.unsafeGetTensorImpl()); });
    // Module state: in the innermost chosen unit around its module (an inner unit comes later and wins).
    std::map<const void*, int> module_unit;
    for (int i = 0, k = 0; i < static_cast<int>(candidates.size()); ++i) {
      if (!candidates[static_cast<std::size_t>(i)].chosen) continue;
      ++k;
      for (const auto& m : candidates[static_cast<std::size_t>(i)].module->modules(/*include_self=*/true)) module_unit[m.get()] = k;
    }
    for (const auto& [name, state] : module_states(module)) {
      const auto it = module_unit.find(dynamic_cast<const torch::nn::Module*>(state));
      auto& u = units_[it == module_unit.end() ? 0 : static_cast<std::size_t>(it->second)];
      const auto tensors = state->state_tensors();
      if (tensors.empty()) continue;
      u.states.push_back({state, name, {}});
      for (const auto& t : tensors) {  // (a slot keeps no tensor: the whole state goes once sharded)
        const int64_t offset = detail::round_up(u.bytes.numel, kStateAlignment), size = t.numel() * t.element_size();
        u.bytes.slots.push_back({torch::Tensor(), name, offset, size});
        u.bytes.numel = offset + size;
      }
    }
    for (std::size_t k = 0; k < units_.size(); ++k) {
      auto& u = units_[k];
      if (u.wrapper) {
        u.wrapper->loom_runtime = this;
        u.wrapper->loom_unit = static_cast<int>(k);
      }
      if (!u.train.slots.empty()) {
        shard_flat(u.train, values, param_dtype_);
        // float32, on the device (the parameters are views of the gathered buffer by now);
        // its memory exists from the unit's first reduction to zero_grad (see there).
        u.grad_shard = torch::empty({u.train.shard_numel},
                                    u.train.slots.front().param.options().dtype(torch::kFloat).requires_grad(false));
        detail::free_storage(u.grad_shard);
        for (std::size_t i = 0; i < u.train.slots.size(); ++i) {
          auto& s = u.train.slots[i];
          s.param.mutable_grad() = torch::Tensor();
          detail::set_grad_ready_hook(s.param, [this, k] { on_grad_ready(k); });
          index_[s.param.unsafeGetTensorImpl()] = {k, i};
        }
      }
      if (!u.frozen.slots.empty()) {
        // Gathered in the trainable parameters' gather dtype when it is float32 (a cast under
        // --sharding_param_dtype), else in its own.
        const auto dtype = u.frozen.slots.front().param.scalar_type();
        shard_flat(u.frozen, values, dtype == torch::kFloat ? param_dtype_ : dtype);
      }
      if (!u.bytes.slots.empty()) shard_state(u, values);
      if (!u.empty()) release(u);
    }
  }

  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) override {
    const auto [k, i] = locate(param, name);
    auto& u = units_[k];
    const auto& s = u.train.slots[i];
    const auto range = detail::owned_range(s, comm_->rank(), u.train.shard_numel);
    if (!range) return std::nullopt;
    const auto [a, e] = *range;
    const int64_t lo = comm_->rank() * u.train.shard_numel;
    // A view of the gradient shard's storage, which has memory only from a step's first
    // reduction to zero_grad: given memory for the moment of the view's making.
    const bool had = has_storage(u.grad_shard);
    if (!had) detail::alloc_storage(u.grad_shard, u.grad_shard.nbytes());
    auto grad = u.grad_shard.narrow(0, a - lo, e - a);
    if (!had) detail::free_storage(u.grad_shard);
    return Piece{name, u.train.shard.narrow(0, a - lo, e - a), grad, a - s.offset, e - s.offset, s.numel, offload_};
  }
  [[nodiscard]] bool shards_optimizer() const override { return true; }
  [[nodiscard]] bool grads_sharded() const override { return true; }

  void begin_micro_step(bool /*last*/) override {
    for (auto& u : units_) {
      u.ready = 0;
      u.backward_started = false;
      u.reduced = false;
      u.inputs_watched = u.inputs_done = 0;
      u.feeds.clear();
    }
    last_output_ = torch::Tensor();
    in_backward_pass_ = true;
    auto& root = units_[0];
    if (!root.empty()) {
      gather(root);
      if (!root.train.slots.empty()) prepare_grads(root);
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
    if (!units_[0].train.slots.empty() && reduce(units_[0])) ++launches_.after_backward;
    for (auto& u : units_) {
      finish_reduce(u);
      if (!u.empty()) release(u);
      // A unit no gradient reached this step (nor an earlier micro-step of it): zeros.
      if (u.grad_shard.defined() && !has_storage(u.grad_shard)) allocate_grad_shard(u);
    }
    pending_reduce_ = -1;
    last_output_ = torch::Tensor();
    in_backward_pass_ = false;
  }
  void after_step() override {}
  // As torch's zero_grad(set_to_none=True), HF's default: the gradient shards' memory is freed
  // after the optimizer step and comes back with each unit's first reduction of the next step
  // (after_backward gives zeros to a unit none reached), so the shards do not sit beside the
  // activations of the next forward. The optimizer's pieces stay views of the same storage.
  void zero_grad() override {
    for (auto& u : units_)
      if (u.grad_shard.defined()) detail::free_storage(u.grad_shard);
  }

  /// Runs `fn` with every parameter gathered (frozen ones too); afterwards the shards take the
  /// (possibly changed) values and the gathered copies are released.
  void with_full_params(const std::function<void()>& fn) override { with_params(fn, /*frozen_too=*/true); }
  /// The same for the trainable parameters alone: the frozen ones stay sharded.
  void with_trainable_params(const std::function<void()>& fn) override { with_params(fn, /*frozen_too=*/false); }

  /// One unit at a time, its parameters whole in their master dtype (the float32 shards
  /// gathered, also under bfloat16 gathers), then its modules' state tensors (ModuleState),
  /// gathered, for reading: what a streamed save writes.
  void for_each_gathered_group(const std::function<void(const std::vector<torch::Tensor>&)>& fn) override {
    torch::NoGradGuard no_grad;
    for (auto& u : units_) {
      if (u.empty()) continue;
      release(u);  // at rest (outside a step) it is already
      std::vector<Flat*> flats;
      for (auto* f : {&u.train, &u.frozen})
        if (!f->slots.empty()) flats.push_back(f);
      const auto masters = gather_masters(flats);
      std::vector<torch::Tensor> params;
      std::vector<std::vector<torch::Tensor>> views(flats.size());
      for (std::size_t i = 0; i < flats.size(); ++i)
        for (auto& s : flats[i]->slots) {
          views[i].push_back(s.param.variable_data());
          s.param.set_data(masters[i].narrow(0, s.offset, s.numel).view(s.param.sizes()));
          params.push_back(s.param);
        }
      // The module state, gathered as in training (its bytes are its master values), after the
      // parameters: the tensors the modules hold.
      gather_flat(u.bytes);
      for (const auto& h : u.states) params.insert(params.end(), h.views.begin(), h.views.end());
      fn(params);
      release_flat(u.bytes);
      for (std::size_t i = 0; i < flats.size(); ++i)
        for (std::size_t j = 0; j < flats[i]->slots.size(); ++j) flats[i]->slots[j].param.set_data(views[i][j]);
    }
  }
  /// Writes each slot's slice on this rank straight into the shard (a load that never holds a
  /// parameter whole).
  void fill_shards(const ShardFill& fill) override {
    torch::NoGradGuard no_grad;
    // (The gathered copies, in a world of one under a cast or offload, follow at the next gather.)
    for (auto& u : units_)
      for (auto* f : {&u.train, &u.frozen})
        for_each_owned_slice(*f, [&](const detail::Slot& s, int64_t begin, int64_t end, torch::Tensor& dst) {
          fill(s.name, begin, end, dst);
        });
  }
  [[nodiscard]] torch::ScalarType master_dtype(const torch::Tensor& param) const override {
    const auto it = master_dtypes_.find(param.unsafeGetTensorImpl());
    return it == master_dtypes_.end() ? param.scalar_type() : it->second;
  }
  /// Around forward passes without backward (evaluation): the root stays gathered.
  void begin_forward_only() override {
    if (!units_[0].empty()) gather(units_[0]);
  }
  void end_forward_only() override {
    for (auto& u : units_)
      if (!u.empty()) release(u);
  }

  [[nodiscard]] std::vector<std::string> unit_names() const override {
    std::vector<std::string> names;
    for (const auto& u : units_) names.push_back(u.name);
    return names;
  }

  [[nodiscard]] StateBytes state_bytes() const override {
    StateBytes s;
    for (const auto& u : units_) {
      for (const auto* f : {&u.train, &u.frozen}) {
        if (f->slots.empty()) continue;
        (offload_ ? s.host : s.params) += static_cast<double>(f->shard.nbytes());
        if (!f->aliased) s.params += static_cast<double>(f->full.storage().nbytes());
      }
      if (!u.bytes.slots.empty()) s.module_state += static_cast<double>(u.bytes.shard.nbytes());
      if (u.grad_shard.defined()) s.grads += static_cast<double>(u.grad_shard.nbytes());
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
    if (u.empty()) return;
    gather(u);
    if (recorded_ && forward_prefetch_) prefetch(next_in_order(k, +1));
  }
  void post_forward(int k, const std::vector<torch::Tensor>& outputs) override {
    auto& u = units_[static_cast<std::size_t>(k)];
    if (u.empty()) return;
    int hooked = 0;
    for (const auto& out : outputs) {
      if (!torch::GradMode::is_enabled() || !out.defined() || !out.requires_grad() || !in_backward_pass_) continue;
      ++hooked;
      out.register_hook([this, k](const torch::Tensor& g) {
        // The units this output feeds are done with it first (their backward is over once
        // its gradient is whole), so their frozen parameters go before this unit's come.
        for (const int j : std::exchange(units_[static_cast<std::size_t>(k)].feeds, {}))
          on_input_grad(static_cast<std::size_t>(j));
        pre_backward(k);
        return g;
      });
      last_output_ = hooked == 1 ? out : torch::Tensor();
      last_output_unit_ = k;
    }
    release(u);
  }
  void watch_input(int k, const torch::Tensor& x) override {
    auto& u = units_[static_cast<std::size_t>(k)];
    if (k == 0 || (u.frozen.slots.empty() && u.bytes.slots.empty()) || !x.defined() || !x.requires_grad() || !torch::GradMode::is_enabled() ||
        !in_backward_pass_)
      return;
    ++u.inputs_watched;
    // The previous unit's output: its hook tells this unit first (two hooks on one tensor run
    // in the order they were added, which would gather that unit before this one is released).
    if (last_output_.defined() && x.is_same(last_output_)) {
      units_[static_cast<std::size_t>(last_output_unit_)].feeds.push_back(k);
      last_output_ = torch::Tensor();
      return;
    }
    x.register_hook([this, k](const torch::Tensor&) { on_input_grad(static_cast<std::size_t>(k)); });
  }

 private:
  // One flat buffer of a unit's parameters of one kind (trainable, or frozen) and its shard.
  struct Flat {
    std::vector<detail::Slot> slots;
    int64_t numel = 0, padded = 0, shard_numel = 0;
    torch::Tensor full, shard;
    torch::Tensor cast_shard;  // the shard cast to the gather dtype, sent by the all-gather in flight
    torch::Tensor staged;      // --offload_param: the host shard's copy on the device, until released
    Work gather_work;
    bool gathered = false;
    bool aliased = false;  // the gathered buffer is the shard itself: nothing to gather or free
    void add(const torch::Tensor& p, const std::string& name) {
      slots.push_back({p, name, numel, p.numel()});
      numel += p.numel();
    }
  };
  // A module's state (ModuleState) in its unit's bytes flat: the views of the gathered buffer it holds.
  struct StateHolder {
    ModuleState* state;
    std::string name;
    std::vector<torch::Tensor> views;
  };
  static constexpr int64_t kStateAlignment = 4;  // each state tensor's offset in the bytes flat (float32's size)
  struct Unit {
    FullShardUnitBase* wrapper = nullptr;
    std::string name;
    Flat train, frozen;
    Flat bytes;  // the module state's bytes (frozen too)
    std::vector<StateHolder> states;
    torch::Tensor grad_shard, full_grad, rs_out;
    Work work;
    bool backward_started = false, reduced = false;
    std::size_t ready = 0;
    int inputs_watched = 0, inputs_done = 0;  // the unit's inputs whose gradient is hooked; done
    std::vector<int> feeds;  // the units whose watched input is this unit's output (this micro-step)
    [[nodiscard]] bool empty() const { return train.slots.empty() && frozen.slots.empty() && bytes.slots.empty(); }
  };

  // Lays the flat's parameters out: this rank's shard filled (from the parameters, or from the
  // model's values for those that hold no memory), the parameters made views of the gathered
  // buffer, whose memory is then released until the first gather.
  void shard_flat(Flat& f, const DeferredValues* values, torch::ScalarType gather_dtype) {
    const int64_t n = comm_->size();
    const auto opts = f.slots.front().param.options().requires_grad(false);
    f.padded = detail::round_up(f.numel, n);
    f.shard_numel = f.padded / n;
    // A world of one, not offloaded: the shard is the whole unit.
    const bool whole = resident() && !offload_;
    f.aliased = whole && gather_dtype == opts.dtype().toScalarType();
    const auto shard_opts = offload_ ? opts.device(torch::kCPU).pinned_memory(opts.device().is_cuda()) : opts;
    f.shard = torch::zeros({whole ? f.padded : f.shard_numel}, shard_opts);
    for_each_owned_slice(f, [&](const detail::Slot& s, int64_t begin, int64_t end, torch::Tensor& dst) {
      if (holds_no_storage(s.param)) {
        check(values != nullptr, "parameter {} holds no memory, and the model gives no values for it (build the "
              "model itself under loom::DeferredInit)", s.name);
        values->initial_values(s.name, s.param, begin, end, dst);
      } else {
        dst.copy_(s.param.detach().reshape({-1}).narrow(0, begin, end - begin));
      }
    });
    // The gathered buffer: allocated (untouched) only to make the parameters views of it.
    f.full = f.aliased ? f.shard : torch::empty({f.padded}, opts.dtype(gather_dtype));
    for (auto& s : f.slots) {
      s.param.set_data(f.full.narrow(0, s.offset, s.numel).view(s.param.sizes()));
      master_dtypes_[s.param.unsafeGetTensorImpl()] = f.shard.scalar_type();
    }
  }

  // The unit's module state laid out in its bytes flat (setup): one module at a time, its state
  // materialized when it holds no memory yet, this rank's bytes copied into the shard, and the
  // module's tensors replaced by views of the gathered buffer (whose memory is then released
  // until the first gather).
  void shard_state(Unit& u, const DeferredValues* values) {
    auto& f = u.bytes;
    const int64_t n = comm_->size();
    const auto device = u.states.front().state->state_tensors().front().device();
    const auto opts = torch::TensorOptions().dtype(torch::kUInt8).device(device);
    f.padded = detail::round_up(f.numel, n);
    f.shard_numel = f.padded / n;
    f.aliased = resident() && !offload_;
    f.shard = torch::zeros({f.aliased ? f.padded : f.shard_numel},
                           offload_ ? opts.device(torch::kCPU).pinned_memory(device.is_cuda()) : opts);
    f.full = f.aliased ? f.shard : torch::empty({f.padded}, opts);
    const int64_t lo = comm_->rank() * f.shard_numel;
    std::size_t slot = 0;
    for (auto& h : u.states) {
      if (holds_no_storage(*h.state)) {
        check(values != nullptr, "module {} holds state without memory, and the model gives no values for it (build "
              "the model itself under loom::DeferredInit)", h.name);
        h.state->materialize_state(*values, h.name);
      }
      h.views.clear();
      for (const auto& t : h.state->state_tensors()) {
        const auto& s = f.slots[slot++];
        if (const auto range = detail::owned_range(s, comm_->rank(), f.shard_numel)) {
          const auto [a, e] = *range;
          const auto bytes = t.contiguous().reshape({-1}).view(torch::kUInt8);
          f.shard.narrow(0, a - lo, e - a).copy_(bytes.narrow(0, a - s.offset, e - a));
        }
        // Its own version counter: a gather writing the buffer is no in-place change of a
        // tensor autograd saved.
        h.views.push_back(f.full.narrow(0, s.offset, s.numel).view(t.scalar_type()).view(t.sizes()).variable_data());
      }
      h.state->set_state_tensors(h.views);  // the whole tensors go
    }
  }

  // Calls fn(slot, begin, end, dst) for each slot's elements [begin, end) this rank's shard
  // holds (detail::owned_range; in a world of one the shard is the whole flat), `dst` their
  // place in the shard.
  template <class Fn>
  void for_each_owned_slice(Flat& f, Fn&& fn) {
    const int64_t lo = comm_->rank() * f.shard_numel;
    for (const auto& s : f.slots) {
      const auto range = detail::owned_range(s, comm_->rank(), f.shard_numel);
      if (!range) continue;
      const auto [a, e] = *range;
      auto dst = f.shard.narrow(0, a - lo, e - a);
      fn(s, a - s.offset, e - s.offset, dst);
    }
  }

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
    if (!u.train.slots.empty()) prepare_grads(u);
    if (backward_prefetch_ == BackwardPrefetch::pre) prefetch(next_in_order(k, -1));
  }

  // The gradient of each of the unit's watched inputs has arrived: its backward is over, and
  // its frozen parameters are released once its reduction (if any) is launched too.
  void on_input_grad(std::size_t k) {
    auto& u = units_[k];
    if (++u.inputs_done < u.inputs_watched) return;
    if (u.train.slots.empty() || u.reduced) release_frozen(u);
  }

  void prepare_grads(Unit& u) {
    // A world of one accumulates straight into the gradient shard (the whole unit).
    if (grads_aliased() && !has_storage(u.grad_shard)) allocate_grad_shard(u);
    u.full_grad = grads_aliased() ? u.grad_shard : torch::zeros({u.train.padded}, u.grad_shard.options().dtype(param_dtype_));
    for (auto& s : u.train.slots) s.param.mutable_grad() = u.full_grad.narrow(0, s.offset, s.numel).view(s.param.sizes());
  }

  void on_grad_ready(std::size_t k) {
    auto& u = units_[k];
    if (k == 0 || !u.backward_started) return;  // the root is reduced after backward
    if (++u.ready == u.train.slots.size() && reduce(u)) ++launches_.during_backward;
  }

  // Launches the unit's reduction unless done; false when there was nothing to launch.
  bool reduce(Unit& u) {
    if (u.reduced || !u.full_grad.defined()) return false;
    u.reduced = true;
    torch::NoGradGuard no_grad;
    for (auto& s : u.train.slots) s.param.mutable_grad() = torch::Tensor();
    if (resident() && !grads_aliased()) {
      u.rs_out = u.full_grad;  // a world of one: after_backward adds it to grad_shard
    } else if (!resident()) {  // (aliased, the gradients are already in grad_shard)
      // Scaled in the wider format: float32 unless both are bfloat16.
      auto& send = u.full_grad;
      if (reduce_dtype_ == torch::kFloat && send.scalar_type() != torch::kFloat) send = send.to(torch::kFloat);
      share_.apply(send);
      if (send.scalar_type() != reduce_dtype_) send = send.to(reduce_dtype_);
      // The step's first reduction of the unit lands in the gradient shard itself when the
      // formats agree; a later micro-step's is added to it (finish_reduce).
      if (!has_storage(u.grad_shard) && send.scalar_type() == u.grad_shard.scalar_type()) {
        detail::alloc_storage(u.grad_shard, u.grad_shard.nbytes());
        u.rs_out = u.grad_shard;
      } else {
        u.rs_out = torch::empty({u.train.shard_numel}, send.options());
      }
      u.work = comm_->reduce_scatter(u.rs_out, send, "the gradient reduce-scatter");
      // The collective holds what it reads (Gloo a copy made at launch; NCCL's allocator
      // keeps the block for its stream): the whole gradient is not held here past the launch.
      u.full_grad = torch::Tensor();
    }
    // At most one reduction in flight: the one launched before this is finished now, so a
    // unit's whole gradient lives from its backward to the next unit's reduction, not to the
    // end of backward.
    const auto k = static_cast<int>(&u - units_.data());
    if (pending_reduce_ >= 0 && pending_reduce_ != k) finish_reduce(units_[static_cast<std::size_t>(pending_reduce_)]);
    pending_reduce_ = k;
    // FSDP's BACKWARD_POST: the unit before is gathered once this unit's gradients are computed.
    if (backward_prefetch_ == BackwardPrefetch::post && k != 0) prefetch(next_in_order(k, -1));
    if (&u != &units_[0]) {
      release_flat(u.train);
      // The frozen parameters wait for the unit's inputs' gradients (the end of its backward).
      if (u.inputs_watched > 0 && u.inputs_done >= u.inputs_watched) release_frozen(u);
    }
    return true;
  }

  // Waits for the unit's reduction and adds it to the gradient shard; its whole gradient and
  // the reduction's output are freed.
  void finish_reduce(Unit& u) {
    u.work.wait();
    if (u.rs_out.defined() && !u.rs_out.is_same(u.grad_shard)) {
      if (!has_storage(u.grad_shard)) allocate_grad_shard(u);
      u.grad_shard.add_(u.rs_out);
    }
    u.rs_out = torch::Tensor();
    u.full_grad = torch::Tensor();
  }
  static bool has_storage(const torch::Tensor& t) { return t.storage().nbytes() > 0; }
  // The gradient shard's memory again, zeros.
  static void allocate_grad_shard(Unit& u) {
    detail::alloc_storage(u.grad_shard, u.grad_shard.nbytes());
    u.grad_shard.zero_();
  }

  void prefetch(int k) {
    if (k >= 0) launch_gathers(units_[static_cast<std::size_t>(k)]);
  }
  // Launches the all-gather of each of the unit's flats not gathered or in flight yet.
  void launch_gathers(Unit& u) {
    for (auto* f : {&u.train, &u.frozen, &u.bytes})
      if (!f->slots.empty() && !f->gathered && !f->gather_work.pending()) launch_gather(*f);
  }
  // A world of one: gradients accumulate straight into the gradient shard.
  [[nodiscard]] bool resident() const { return comm_->size() == 1; }
  // The gathered parameters are of another dtype than the float32 shards.
  [[nodiscard]] bool casts_params() const { return param_dtype_ != torch::kFloat; }
  // The gradient buffer is the gradient shard itself (a world of one, no cast).
  [[nodiscard]] bool grads_aliased() const { return resident() && !casts_params(); }
  void launch_gather(Flat& f) {
    if (f.aliased) return;
    detail::alloc_storage(f.full, static_cast<std::size_t>(f.padded) * f.full.element_size());
    torch::Tensor source = f.shard;
    const bool cast = f.full.scalar_type() != f.shard.scalar_type();
    if (offload_) {  // the host shard to the device first (cast on the way)
      f.staged = f.shard.to(f.full.device(), f.full.scalar_type(), /*non_blocking=*/f.full.is_cuda(), /*copy=*/true);
      source = f.staged;
    } else if (cast && !resident()) {
      f.cast_shard = f.shard.to(f.full.scalar_type());
      source = f.cast_shard;
    }
    if (resident()) {  // a world of one gathers by copying (and casting) its shard
      f.full.copy_(source);
      f.gathered = true;
      return;
    }
    f.gather_work = comm_->all_gather(f.full, source, "the parameter all-gather");
  }
  void gather_flat(Flat& f) {
    if (f.slots.empty() || f.gathered) return;
    if (!f.gather_work.pending()) launch_gather(f);
    f.gather_work.wait();
    f.cast_shard = torch::Tensor();
    f.gathered = true;
  }
  void gather(Unit& u) {
    launch_gathers(u);  // all launched before any is waited for
    gather_flat(u.train);
    gather_flat(u.frozen);
    gather_flat(u.bytes);
  }
  void release_flat(Flat& f) {
    if (f.slots.empty()) return;
    f.gather_work.wait();
    f.cast_shard = torch::Tensor();
    f.gathered = false;
    f.staged = torch::Tensor();
    if (!f.aliased) detail::free_storage(f.full);
  }
  // What has no gradient: the frozen parameters and the module state.
  void release_frozen(Unit& u) {
    release_flat(u.frozen);
    release_flat(u.bytes);
  }
  void release(Unit& u) {
    release_flat(u.train);
    release_frozen(u);
  }

  // with_full_params / with_trainable_params: the flats gathered, `fn`, the shards take the
  // values back, the flats released.
  void with_params(const std::function<void()>& fn, bool frozen_too) {
    // The module state, gathered around fn with the frozen parameters (it is never written back).
    std::vector<Flat*> states;
    for (auto& u : units_)
      if (frozen_too && !u.bytes.slots.empty()) states.push_back(&u.bytes);
    for (auto* f : states)
      if (!f->gathered && !f->gather_work.pending()) launch_gather(*f);
    for (auto* f : states) gather_flat(*f);
    if (casts_params()) with_master_params(fn, frozen_too);
    else with_gathered_params(fn, frozen_too);
    for (auto* f : states) release_flat(*f);
  }
  void with_gathered_params(const std::function<void()>& fn, bool frozen_too) {
    std::vector<Flat*> flats;
    for (auto& u : units_)
      for (auto* f : {&u.train, &u.frozen})
        if (!f->slots.empty() && (frozen_too || f == &u.train)) flats.push_back(f);
    for (auto* f : flats)
      if (!f->gathered && !f->gather_work.pending()) launch_gather(*f);
    for (auto* f : flats) gather_flat(*f);
    fn();
    torch::NoGradGuard no_grad;
    for (auto* f : flats) {
      if (!f->aliased) f->shard.copy_(f->full.narrow(0, comm_->rank() * f->shard_numel, f->shard_numel));
      release_flat(*f);
    }
  }

  // Each flat's shards gathered whole in their own dtype (the master weights), on the device:
  // the shard itself in a world of one that is not offloaded.
  std::vector<torch::Tensor> gather_masters(const std::vector<Flat*>& flats) {
    std::vector<torch::Tensor> masters(flats.size()), sent(flats.size());  // sent: an offloaded shard on the device
    std::vector<Work> works;
    for (std::size_t i = 0; i < flats.size(); ++i) {
      auto& f = *flats[i];
      const auto device_opts = f.full.options().dtype(f.shard.scalar_type());
      masters[i] = resident() && !offload_ ? f.shard : torch::empty({f.padded}, device_opts);
      if (resident() && offload_) {
        masters[i].copy_(f.shard);
      } else if (!resident()) {
        sent[i] = offload_ ? f.shard.to(f.full.device()) : f.shard;
        works.push_back(comm_->all_gather(masters[i], sent[i], "the master-weight all-gather"));
      }
    }
    for (auto& w : works) w.wait();
    return masters;
  }

  // with_params when the gathered parameters are not the shards' dtype: each flat's shards
  // are gathered in their own dtype into a buffer of their own and the parameters show it
  // while `fn` runs (what is saved, or loaded, are the master weights); then the shards take
  // the values back and the parameters their gathered-dtype views again.
  void with_master_params(const std::function<void()>& fn, bool frozen_too) {
    torch::NoGradGuard no_grad;
    std::vector<Flat*> flats;
    for (auto& u : units_) {
      if (u.empty()) continue;
      release_flat(u.train);  // as the float32 path leaves them afterwards (the module state: with_params)
      release_flat(u.frozen);
      for (auto* f : {&u.train, &u.frozen})
        if (!f->slots.empty() && (frozen_too || f == &u.train)) flats.push_back(f);
    }
    const auto masters = gather_masters(flats);
    std::vector<std::vector<torch::Tensor>> views(flats.size());
    for (std::size_t i = 0; i < flats.size(); ++i)
      for (auto& s : flats[i]->slots) {
        views[i].push_back(s.param.variable_data());
        s.param.set_data(masters[i].narrow(0, s.offset, s.numel).view(s.param.sizes()));
      }
    fn();
    for (std::size_t i = 0; i < flats.size(); ++i) {
      auto& f = *flats[i];
      if (!resident() || offload_) f.shard.copy_(masters[i].narrow(0, comm_->rank() * f.shard_numel, f.shard_numel));
      for (std::size_t j = 0; j < f.slots.size(); ++j) f.slots[j].param.set_data(views[i][j]);
    }
  }

  std::vector<Unit> units_;
  std::map<const void*, torch::ScalarType> master_dtypes_;  // each sharded parameter's shard dtype
  std::vector<int> order_;
  bool recorded_ = false;
  bool in_backward_pass_ = false;
  int pending_reduce_ = -1;  // the unit whose reduction is in flight (reduce())
  torch::Tensor last_output_;  // the last unit output hooked for backward (watch_input matches it)
  int last_output_unit_ = -1;
  GradLaunches launches_;
  torch::ScalarType param_dtype_, reduce_dtype_;  // --sharding_param_dtype, --sharding_reduce_dtype
  bool offload_ = false;                           // --offload_param
  bool forward_prefetch_ = false;                  // --fsdp_forward_prefetch
  BackwardPrefetch backward_prefetch_ = BackwardPrefetch::none;  // --fsdp_backward_prefetch
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
