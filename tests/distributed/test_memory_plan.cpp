// The memory plan (accelerate/memory_plan.hpp): the pure plan follows the ZeRO paper's per-rank
// formulas for every sharding policy, with offload, bf16 gathers and frozen parameters; its
// optimizer state is what the optimizer --optim builds creates; a plan larger than the memory
// is refused, also by the Accelerator before anything reaches the device. The plan against
// the engines' measured bytes at 1 and 2 ranks is tests/dist/memory_plan.cpp.
#include <doctest/doctest.h>

#include <loom/loom.hpp>

#include "trainer_support.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace plan_test {

using Facts = loom::ShardingFacts;

// `numels` as trainable parameters of unit `unit[i]`, with AdamW's state: exp_avg and
// exp_avg_sq of the shape stepped (float32) and a float32 step count.
loom::MemoryPlanInputs inputs(const Facts& facts, int world, const std::vector<int64_t>& numels,
                              const std::vector<int>& units) {
  loom::MemoryPlanInputs in;
  in.sharding = facts;
  in.world = world;
  for (std::size_t i = 0; i < numels.size(); ++i) {
    const int64_t piece = (numels[i] + world - 1) / world;
    in.params.push_back({.numel = numels[i], .unit = units[i], .state_whole = 8.0 * numels[i] + 4,
                         .state_piece = 8.0 * piece + 4});
  }
  return in;
}

}  // namespace plan_test

TEST_CASE("memory plan: per-rank bytes follow the ZeRO formulas for every policy, with offload, bf16 gathers and frozen parameters") {
  using plan_test::inputs;
  // psi = 3 * 4096 + 1024 parameters in three FullShard units (two blocks and the root).
  const std::vector<int64_t> numels{4096, 4096, 4096, 1024};
  const std::vector<int> units{1, 2, 2, 0};
  const double psi = 4096 * 3 + 1024, steps = 4 * 4.0;  // the step counts, 4 bytes a parameter
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    const auto no = loom::make_memory_plan(inputs(loom::sharding::NoShard::facts, n, numels, units));
    CHECK(no.params == 4 * psi);
    CHECK(no.grads == 4 * psi);
    CHECK(no.optimizer == 8 * psi + steps);
    CHECK(no.gathered == 0);
    const auto z1 = loom::make_memory_plan(inputs(loom::sharding::ZeRO1::facts, n, numels, units));
    CHECK(z1.params == 4 * psi);
    CHECK(z1.grads == 4 * psi);
    CHECK(z1.optimizer == 8 * psi / n + steps);
    const auto z2 = loom::make_memory_plan(inputs(loom::sharding::ZeRO2::facts, n, numels, units));
    CHECK(z2.grads == 4 * psi / n);
    CHECK(z2.optimizer == 8 * psi / n + steps);
    const auto fs = loom::make_memory_plan(inputs(loom::sharding::FullShard::facts, n, numels, units));
    CHECK(fs.params == 4 * psi / n);
    CHECK(fs.grads == 4 * psi / n);
    CHECK(fs.optimizer == 8 * psi / n + steps);
    // The largest unit (8192) and the root (1024), float32; none in a world of one, where the
    // shard is the unit. A prefetch holds the largest unit twice.
    CHECK(fs.gathered == (n == 1 ? 0.0 : 4.0 * (8192 + 1024)));
    auto prefetched = inputs(loom::sharding::FullShard::facts, n, numels, units);
    prefetched.prefetch = true;
    CHECK(loom::make_memory_plan(prefetched).gathered == (n == 1 ? 0.0 : 4.0 * (2 * 8192 + 1024)));
    CHECK(fs.model_state() == fs.params + fs.grads + fs.optimizer);

    auto in = inputs(loom::sharding::FullShard::facts, n, numels, units);
    in.gather_element_size = 2;  // --sharding_param_dtype bf16
    CHECK(loom::make_memory_plan(in).gathered == 2.0 * (8192 + 1024));
    in.offload_optimizer = true;
    const auto off = loom::make_memory_plan(in);
    CHECK(off.optimizer == 0);
    CHECK(off.params == fs.params);
    // The state, and the host copies of each piece and of its gradient.
    CHECK(off.host == fs.optimizer + 8 * psi / n);
    in.offload_param = true;
    const auto off_p = loom::make_memory_plan(in);
    CHECK(off_p.params == 0);
    CHECK(off_p.host == fs.optimizer + 4 * psi / n + 4 * psi / n);  // the shard itself is the host copy

    // A frozen parameter (LoRA's base): whole on every rank, no gradient, no optimizer state.
    auto lora = inputs(loom::sharding::ZeRO2::facts, n, numels, units);
    lora.params[0].trainable = false;
    const auto frozen = loom::make_memory_plan(lora);
    CHECK(frozen.frozen == 4 * 4096.0);
    CHECK(frozen.params == 4 * (psi - 4096));
    CHECK(frozen.grads == 4 * (psi - 4096) / n);
    CHECK(frozen.optimizer == 8 * (psi - 4096) / n + steps - 4);
  }
}

TEST_CASE("memory plan: refused above the capacity, with the total and the capacity in the message") {
  auto in = plan_test::inputs(loom::sharding::DDP::facts, 2, {1 << 20}, {0});
  in.activations = 3.0 * (1 << 20);
  const auto plan = loom::make_memory_plan(in);
  const double total = plan.device_total();
  CHECK(total == 4.0 * (1 << 20) * 4 + 4 + 3.0 * (1 << 20));  // params, grads, state (8 + a step), activations
  CHECK_FALSE(loom::memory_plan_refusal(plan, total, false).has_value());
  const auto refusal = loom::memory_plan_refusal(plan, total - 1, false);
  REQUIRE(refusal.has_value());
  CHECK(refusal->find(loom::format_bytes(total)) != std::string::npos);
  CHECK(refusal->find(loom::format_bytes(total - 1)) != std::string::npos);
  CHECK(refusal->find("--skip_memory_check") != std::string::npos);
  CHECK(refusal->find("shard more (--sharding zero1 / zero2 / full_shard)") != std::string::npos);
  // A frozen base larger than the trainable state: only FullShard shards it, and the line says so.
  auto lora = plan_test::inputs(loom::sharding::DDP::facts, 2, {1 << 20, 1024}, {0, 0});
  lora.params.front().trainable = false;
  const auto frozen = loom::make_memory_plan(lora);
  REQUIRE(frozen.frozen == 4.0 * (1 << 20));
  const auto frozen_refusal = loom::memory_plan_refusal(frozen, frozen.device_total() - 1, false);
  REQUIRE(frozen_refusal.has_value());
  CHECK(frozen_refusal->find("shard the frozen parameters (--sharding full_shard: no other policy shards them)") !=
        std::string::npos);
  CHECK(frozen_refusal->find("zero1") == std::string::npos);
  // On the CPU the host line shares the memory.
  in.sharding = loom::sharding::ZeRO2::facts;
  in.offload_optimizer = true;
  const auto offloaded = loom::make_memory_plan(in);
  REQUIRE(offloaded.host > 0);
  CHECK_FALSE(loom::memory_plan_refusal(offloaded, offloaded.device_total(), false).has_value());
  CHECK(loom::memory_plan_refusal(offloaded, offloaded.device_total(), true).has_value());
  // No capacity known: no refusal.
  CHECK_FALSE(loom::memory_plan_refusal(plan, 0, false).has_value());
  // The printout names every line.
  const auto text = loom::format_memory_plan(plan);
  for (const char* line : {"parameters", "gradients", "optimizer state", "activations", "device total"}) {
    CAPTURE(line);
    CHECK(text.find(line) != std::string::npos);
  }
  CHECK(loom::device_memory_bytes(torch::Device(torch::kCPU), 1) > 0);
  CHECK(loom::device_memory_bytes(torch::Device(torch::kCPU), 4) == doctest::Approx(loom::device_memory_bytes(torch::Device(torch::kCPU), 1) / 4));
}

namespace plan_test {
struct TwoUnitsImpl : torch::nn::Module {
  TwoUnitsImpl()
      : a(register_module("a", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(6, 10)))),
        b(register_module("b", loom::FullShardUnit<torch::nn::Linear>(torch::nn::Linear(10, 10)))),
        head(register_module("head", torch::nn::Linear(10, 3))) {
    head->bias.set_requires_grad(false);  // frozen
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(b->forward(a->forward(x).relu()).relu()); }
  loom::FullShardUnit<torch::nn::Linear> a, b;
  torch::nn::Linear head;
};
TORCH_MODULE(TwoUnits);
}  // namespace plan_test

TEST_CASE("memory plan: the optimizer state counted on meta tensors is what the --optim optimizer creates") {
  for (const std::string optim : {"adamw_torch", "adamw_torch_fused", "adafactor", "lion", "adagrad", "rmsprop"}) {
    CAPTURE(optim);
    loom::TrainingArguments args;
    args.optim = optim;
    plan_test::TwoUnits model;
    const auto in = loom::memory_plan_inputs(*model, args, loom::sharding::FullShard::facts, 2);
    REQUIRE(in.params.size() == 6);
    double planned = 0;
    int frozen = 0;
    std::vector<int> units;
    for (const auto& p : in.params) {
      planned += p.state_whole;
      frozen += p.trainable ? 0 : 1;
      units.push_back(p.unit);
    }
    CHECK(frozen == 1);
    CHECK(units == std::vector<int>{1, 1, 2, 2, 0, 0});
    auto opt = loom::optim::make_optimizer(args, *model);
    model->forward(torch::randn({4, 6})).sum().backward();
    opt.step(1e-3);
    double created = 0;
    for (const auto& [name, t] : opt.state_tensors()) created += static_cast<double>(t.nbytes());
    MESSAGE(optim << ": planned " << planned << " bytes of state, created " << created);
    CHECK(planned == created);
  }
}

TEST_CASE("memory plan: the Accelerator refuses a model larger than the memory before moving it") {
  auto args = loom_test::quiet_args("memory_plan_refusal");
  loom::Accelerator<> acc(args);
  // 2^42 float32 elements (16 TiB) on the meta device: nothing is allocated.
  auto big = std::make_shared<torch::nn::Module>();
  big->register_parameter("weight", torch::empty({int64_t{1} << 21, int64_t{1} << 21}, torch::TensorOptions().device(torch::kMeta)));
  std::string message;
  try {
    acc.prepare_model(big);
  } catch (const loom::Error& e) {
    message = e.what();
  }
  MESSAGE(message);
  CHECK(message.rfind("loom: the memory plan needs 64.00 TiB per process", 0) == 0);
  CHECK(message.find("--skip_memory_check") != std::string::npos);
  REQUIRE(acc.memory_plan().has_value());
  CHECK(acc.memory_plan()->params == 4.0 * static_cast<double>(int64_t{1} << 42));
  CHECK_FALSE(acc.memory_plan()->activations.has_value());
}

TEST_CASE("memory plan: the set-up peak, the model whole beside the shards unless it is built without memory") {
  // Eight units of a parameters each, plain SGD (no optimizer state), two ranks.
  const int64_t n = 2, a = 1 << 20;
  loom::MemoryPlanInputs in;
  in.sharding = loom::sharding::FullShard::facts;
  in.world = n;
  for (int u = 1; u <= 8; ++u) in.params.push_back({.numel = a, .unit = u});
  const double whole = 8 * 4.0 * a;
  const auto eager = loom::make_memory_plan(in);
  CHECK(eager.params == whole / 2);
  CHECK(eager.grads == whole / 2);
  // The shards, and the model whole as built beside them (the gradient shards come later,
  // with the first reduction).
  CHECK(eager.setup == whole / 2 + whole);
  CHECK(eager.setup > eager.device_total());
  in.deferred = true;
  const auto deferred = loom::make_memory_plan(in);
  CHECK(deferred.setup == whole / 2 + 4.0 * a);  // the one parameter in flight
  CHECK(deferred.setup < deferred.device_total());
  // A capacity above training's total refuses the eager model for its set-up alone, and says
  // how to avoid it; the deferred one starts.
  const double capacity = eager.device_total() + 4.0 * a;
  const auto refusal = loom::memory_plan_refusal(eager, capacity, false);
  REQUIRE(refusal.has_value());
  CHECK(refusal->find("set-up peak") != std::string::npos);
  CHECK(refusal->find("loom::DeferredInit") != std::string::npos);
  CHECK_FALSE(loom::memory_plan_refusal(deferred, capacity, false).has_value());
  CHECK(loom::format_memory_plan(deferred).find("set-up peak") != std::string::npos);
  // The other policies keep their engines' layout at set-up: never above training's total.
  in.sharding = loom::sharding::DDP::facts;
  const auto replica = loom::make_memory_plan(in);
  CHECK(replica.setup == replica.params + replica.grads);
  CHECK(replica.setup <= replica.device_total());
}

namespace plan_test {
// A block around one projection (a unit's wrapper shows the block's children, not the block).
struct ProjImpl : torch::nn::Module {
  ProjImpl(int64_t in, int64_t out) : proj(register_module("proj", loom::peft::AdaptableLinear(in, out, false))) {}
  torch::Tensor forward(const torch::Tensor& x) { return proj(x); }
  loom::peft::AdaptableLinear proj;
};
TORCH_MODULE(Proj);
// Two units holding a 64 x 128 projection each, made 4-bit (the head, the last parameter's
// module, stays float as transformers keeps it).
struct FourBitImpl : torch::nn::Module {
  FourBitImpl()
      : a(register_module("a", loom::FullShardUnit<Proj>(Proj(128, 64)))),
        b(register_module("b", loom::FullShardUnit<Proj>(Proj(64, 128)))),
        head(register_module("head", loom::peft::AdaptableLinear(128, 3, true))) {}
  loom::FullShardUnit<Proj> a, b;
  loom::peft::AdaptableLinear head;
};
TORCH_MODULE(FourBit);
}  // namespace plan_test

TEST_CASE("memory plan: a 4-bit base's bytes are frozen state of their unit, whole on every rank but sharded by FullShard") {
  plan_test::FourBit model;
  CHECK(loom::peft::quantize_base_4bit(*model, {.quant_type = loom::peft::Bnb4Type::nf4, .use_double_quant = true}) == 2);
  const double bytes = static_cast<double>(loom::peft::quantized_base(*model).bytes);
  CHECK(bytes == 2 * (4096 + 128 + 4 + 4));  // codes, 8-bit absmaxes, one nested absmax, the offset
  loom::TrainingArguments args;
  const auto in = loom::memory_plan_inputs(*model, args, loom::sharding::FullShard::facts, 2);
  std::vector<int> state_units;
  for (const auto& p : in.params)
    if (p.element_size == 1) state_units.push_back(p.unit);
  CHECK(state_units == std::vector<int>{1, 2});
  const double ddp_frozen = loom::make_memory_plan(loom::memory_plan_inputs(*model, args, loom::sharding::DDP::facts, 2)).frozen;
  CHECK(ddp_frozen == bytes);  // DDP: the 4-bit base whole on every rank (the empty weights count nothing)
  const auto sharded = loom::make_memory_plan(in);
  CHECK(sharded.frozen == bytes / 2);  // each unit's 4232 bytes, split in two
  // Gathered at the peak: one unit's 4-bit bytes beside the root (the float head, 387 values padded to 388).
  CHECK(sharded.gathered == 4232.0 + 388 * 4);
  // Built under DeferredInit the 4-bit tensors hold no memory yet: the same bytes planned, and
  // the set-up peak adds one layer materialized (its float32 weight and quantize_4bit's scratch,
  // 8192 values x (4 + 8) bytes) beside its 4-bit bytes whole.
  std::optional<plan_test::FourBit> lazy;
  {
    const loom::DeferredInit scope;
    lazy.emplace();
  }
  loom::peft::quantize_base_4bit(**lazy, {.quant_type = loom::peft::Bnb4Type::nf4, .use_double_quant = true});
  const auto lazy_in = loom::memory_plan_inputs(**lazy, args, loom::sharding::FullShard::facts, 2);
  CHECK(lazy_in.deferred);
  const auto lazy_plan = loom::make_memory_plan(lazy_in);
  CHECK(lazy_plan.frozen == sharded.frozen);
  CHECK(lazy_plan.setup == lazy_plan.params + lazy_plan.frozen + 4232 + 8192 * 12);
  const auto ddp_lazy = loom::make_memory_plan(loom::memory_plan_inputs(**lazy, args, loom::sharding::DDP::facts, 2));
  CHECK(ddp_lazy.setup == ddp_lazy.params + ddp_lazy.frozen + ddp_lazy.grads + 8192 * 12);
}
