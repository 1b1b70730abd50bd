#pragma once
// ShardingImpl<Tag>: the engine behind each sharding tag, with one interface the Trainer
// drives (docs/architecture.md, "Sharding engines"):
//
//   setup(module)                  after the model is on its device
//   piece_of(param, name)          what this rank's optimizer steps for `param`
//   begin_group(items, device)     an accumulation group starts (items on this rank)
//   begin_micro_step(last)         before a micro-step's forward
//   after_backward()               after its backward: gradients reduced when they must be
//   after_step()                   after the optimizer step (ZeRO: all-gather parameters)
//   zero_grad()                    gradients the engine owns
//   with_full_params(fn)           fn sees complete parameters (save, load)
//   begin/end_forward_only()       around evaluation
//   all_reduce(t, what)            SUM over ranks, for norms, overflow flags and logged losses
//   state_bytes()                  parameter and gradient bytes held
//
// NoShard implements it with no process group at all (the single-process Trainer is unchanged).

#include <loom/distributed/bucket_engine.hpp>
#include <loom/distributed/full_shard.hpp>
#include <loom/policy/tags.hpp>

namespace loom::dist {

template <class Tag>
class ShardingImpl;

template <>
class ShardingImpl<sharding::NoShard> {
 public:
  static constexpr bool uses_comm = false;   ///< needs a process group
  static constexpr bool owns_grads = false;  ///< gradients are the autograd defaults (set to none after a step)
  explicit ShardingImpl(std::shared_ptr<Comm> /*comm*/, double /*bucket_cap_mb*/) {}
  void setup(torch::nn::Module& module) { module_ = &module; }
  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) {
    return Piece{name, param, param.grad(), 0, param.numel(), param.numel()};
  }
  [[nodiscard]] bool shards_optimizer() const { return false; }
  [[nodiscard]] bool grads_sharded() const { return false; }
  void begin_group(int64_t, const torch::Device&) {}
  [[nodiscard]] const torch::Tensor& item_factor() const { return none_; }
  void begin_micro_step(bool) {}
  void after_backward() {}
  void after_step() {}
  void zero_grad() {}
  template <class F>
  void with_full_params(F&& fn) {
    fn();
  }
  void begin_forward_only() {}
  void end_forward_only() {}
  void all_reduce(torch::Tensor&, const char*) {}
  [[nodiscard]] Comm* comm() const { return nullptr; }
  [[nodiscard]] StateBytes state_bytes() const {
    StateBytes s;
    if (module_ == nullptr) return s;
    for (const auto& p : module_->parameters(true)) {
      s.params += static_cast<double>(p.nbytes());
      if (p.grad().defined()) s.grads += static_cast<double>(p.grad().nbytes());
    }
    return s;
  }

 private:
  torch::nn::Module* module_ = nullptr;
  torch::Tensor none_;
};

// DDP, ZeRO1 and ZeRO2: the bucket engine at one stage.
template <Stage S>
class StagedBuckets : public BucketEngine {
 public:
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  StagedBuckets(std::shared_ptr<Comm> comm, double bucket_cap_mb) : BucketEngine(S, std::move(comm), bucket_cap_mb) {}
};
template <>
class ShardingImpl<sharding::DDP> : public StagedBuckets<Stage::ddp> {
  using StagedBuckets::StagedBuckets;
};
template <>
class ShardingImpl<sharding::ZeRO1> : public StagedBuckets<Stage::zero1> {
  using StagedBuckets::StagedBuckets;
};
template <>
class ShardingImpl<sharding::ZeRO2> : public StagedBuckets<Stage::zero2> {
  using StagedBuckets::StagedBuckets;
};

template <>
class ShardingImpl<sharding::FullShard> : public FullShardEngine {
 public:
  static constexpr bool uses_comm = true;
  static constexpr bool owns_grads = true;
  ShardingImpl(std::shared_ptr<Comm> comm, double /*bucket_cap_mb*/) : FullShardEngine(std::move(comm)) {}
};

}  // namespace loom::dist
