#pragma once
// make_engine and the NoShard engine; the only place that names every engine.

#include <loom/core/error.hpp>
#include <loom/distributed/bucket_engine.hpp>
#include <loom/distributed/engine.hpp>
#include <loom/distributed/full_shard.hpp>

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
  void begin_group(int64_t, const torch::Device&) override {}
  [[nodiscard]] const torch::Tensor& item_factor() const override { return none_; }
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
    return s;
  }
  [[nodiscard]] GradLaunches grad_launches() const override { return {}; }

 private:
  torch::nn::Module* module_ = nullptr;
  torch::Tensor none_;
};

}  // namespace detail

LOOM_INLINE std::unique_ptr<Engine> make_engine(EngineKind kind, std::shared_ptr<Comm> comm,
                                                const EngineOptions& options) {
  switch (kind) {
    case EngineKind::none:
      return std::make_unique<detail::NoShardEngine>();
    case EngineKind::ddp:
      return std::make_unique<BucketEngine>(Stage::ddp, std::move(comm), options);
    case EngineKind::zero1:
      return std::make_unique<BucketEngine>(Stage::zero1, std::move(comm), options);
    case EngineKind::zero2:
      return std::make_unique<BucketEngine>(Stage::zero2, std::move(comm), options);
    case EngineKind::full_shard:
      return std::make_unique<FullShardEngine>(std::move(comm));
  }
  fail("unknown sharding engine {}", static_cast<int>(kind));
}

}  // namespace loom::dist
