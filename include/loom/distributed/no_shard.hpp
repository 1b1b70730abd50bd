#pragma once
// sharding::NoShard: one process holding everything, with no process group and autograd's
// own gradients; its engine and its ShardingImpl.

#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/sharding.hpp>
#include <loom/policy/catalog.hpp>

#include <memory>

namespace loom::dist {
namespace detail {

// One process holding everything: no process group, autograd's own gradients.
class NoShardEngine final : public Engine {
 public:
  void setup(torch::nn::Module& module) override { module_ = &module; }
  std::optional<Piece> piece_of(const torch::Tensor& param, const std::string& name) override {
    return Piece{name, param, param.grad(), 0, param.numel(), param.numel()};
  }
  [[nodiscard]] bool shards_optimizer() const override { return false; }
  [[nodiscard]] bool grads_sharded() const override { return false; }
  [[nodiscard]] bool owns_grads() const override { return false; }  // autograd's, set to none after a step
  void begin_group(const GroupItems&, const torch::Device&) override {}
  [[nodiscard]] const torch::Tensor& item_factor() const override { return none_; }
  [[nodiscard]] const torch::Tensor& global_items() const override { return none_; }
  void begin_micro_step(bool) override {}
  // One process: a parameter without a gradient keeps it undefined, and the optimizer skips it.
  void before_backward(const torch::Tensor&) override {}
  void after_backward() override {}
  void after_step() override {}
  void zero_grad() override {}
  void with_full_params(const std::function<void()>& fn) override { fn(); }
  void begin_forward_only() override {}
  void end_forward_only() override {}
  void all_reduce(torch::Tensor&, const char*) override {}
  [[nodiscard]] Comm* comm() const override { return nullptr; }
  [[nodiscard]] StateBytes state_bytes() const override {
    StateBytes s;
    if (module_ == nullptr) return s;
    for (const auto& p : module_->parameters(true)) {
      s.params += static_cast<double>(p.nbytes());
      if (p.grad().defined()) s.grads += static_cast<double>(p.grad().nbytes());
    }
    s.module_state = module_state_bytes(*module_);
    return s;
  }
  [[nodiscard]] GradLaunches grad_launches() const override { return {}; }

 private:
  torch::nn::Module* module_ = nullptr;
  torch::Tensor none_;
};

}  // namespace detail

template <>
struct ShardingImpl<sharding::NoShard> {
  static std::unique_ptr<Engine> make_engine(std::shared_ptr<Comm>, const EngineOptions&) {
    return std::make_unique<detail::NoShardEngine>();
  }
  /// One process: several would each train alone and write the same files. No offload.
  static void can_implement(const TrainingArguments& args, const World& world) {
    check(world.size == 1,
          "WORLD_SIZE is {} but this Trainer does not shard (--sharding {}); pass --sharding {}, or start one process",
          world.size, sharding::NoShard::name,
          names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.uses_comm; }));
    check(sharding_dtype(args.sharding_param_dtype) == torch::kFloat &&
              sharding_dtype(reduce_dtype_name(args)) == torch::kFloat,
          "--sharding_param_dtype {} / --sharding_reduce_dtype {}: --sharding {} communicates nothing, so there is no "
          "format to choose; drop them (--bf16 computes in bfloat16)", args.sharding_param_dtype,
          reduce_dtype_name(args), sharding::NoShard::name);
    check_no_units(args, sharding::NoShard::name);
    check(!args.offload_optimizer,
          "--offload_optimizer needs a sharded optimizer, and --sharding {} has none; use --sharding {} (any of them "
          "also at one process)", sharding::NoShard::name,
          names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_optimizer_state; }));
    check(!args.offload_param, "--offload_param needs --sharding {}; --sharding {} keeps the model whole",
          names_where<ShardingCatalog>([](const ShardingFacts& f) { return f.shards_parameters; }),
          sharding::NoShard::name);
  }
};

}  // namespace loom::dist
