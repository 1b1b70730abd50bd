// create_optimizer and --optim in the real loop: per-group learning rates from an override, a
// plain torch::optim::Adam returned through optim::Optimizer::wrap (checkpointed with torch's
// own serialization, resumed bitwise, stepped under DDP), loom's rules with state resumed
// bitwise (RMSprop's buffers, Adafactor's factored moments), and the loom: errors for what a
// sharded optimizer cannot step.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_create_optimizer {

namespace fs = std::filesystem;

namespace {

using loom_test::Batch;

loom::data::TensorDataset<Batch> data(int64_t n, uint64_t seed) { return loom_test::argmax_data(n, seed, 6); }

using loom_test::StopAt;

using Mlp = loom_test::Mlp6;

// How create_optimizer is overridden.
enum class Make { args, groups, torch_adam };

template <class... Policies>
struct T : loom::Trainer<T<Policies...>, Mlp, loom::Callbacks<StopAt>, Policies...> {
  using Base = loom::Trainer<T<Policies...>, Mlp, loom::Callbacks<StopAt>, Policies...>;
  using Base::Base;
  Make make = Make::args;
  double a_lr = 0.0;  // Make::groups: layer a's own lr; layer b keeps the schedule's

  loom::ModelOutput compute_loss(Mlp& model, Batch& b) { return loom_test::cross_entropy(model, b); }

  loom::optim::Optimizer create_optimizer() {
    auto& m = this->model();
    if (make == Make::torch_adam)
      return loom::optim::Optimizer::wrap(
          std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(this->args().learning_rate)));
    if (make == Make::args) return Base::create_optimizer();
    std::vector<loom::optim::ParamGroup> groups(2);
    for (const auto& item : m->named_parameters()) {
      auto& g = groups[item.key().rfind("a.", 0) == 0 ? 0 : 1];
      g.params.push_back(item.value());
      g.names.push_back(item.key());
    }
    groups[0].lr = a_lr;
    groups[1].weight_decay = 0.5;
    return loom::optim::Optimizer(groups, loom::optim::options_from_args(this->args()));
  }
};

loom::TrainingArguments base_args(const std::string& name) {
  auto a = loom_test::quiet_args(name);
  a.per_device_train_batch_size = 4;
  a.learning_rate = 0.01;
  a.warmup_steps = 2;
  a.max_steps = 8;
  a.save_strategy = "steps";
  a.save_steps = 4;
  return a;
}

// 8 steps straight against 4 steps, a checkpoint, and a resume from it: bitwise the same.
template <class Tr>
void straight_vs_resumed(const std::string& name, const loom::TrainingArguments& base, Make make) {
  INFO(name);
  auto a = base;
  a.output_dir = loom_test::tmp_dir("create_optimizer/" + name + "_straight").string();
  torch::manual_seed(5);
  Tr straight(a, Mlp{}, data(40, 1));
  straight.make = make;
  straight.train();
  auto b = base;
  b.output_dir = loom_test::tmp_dir("create_optimizer/" + name + "_resumed").string();
  {
    torch::manual_seed(5);
    Tr first(b, Mlp{}, data(40, 1));
    first.make = make;
    first.template callback<StopAt>().step = 4;
    first.train();
    REQUIRE(first.state().global_step == 4);
  }
  const auto ckpt = fs::path(b.output_dir) / "checkpoint-4";
  const std::string sharding = loom::resolved_sharding(b);  // auto: one process does not shard
  const bool sharded = sharding != "no" && sharding != "ddp";
  CHECK(fs::exists(ckpt / (make == Make::torch_adam ? "optimizer.pt"
                           : sharded              ? "optimizer-0-of-1.safetensors"
                                                  : "optimizer.safetensors")));
  b.resume_from_checkpoint = "latest";
  torch::manual_seed(999);
  Tr resumed(b, Mlp{}, data(40, 1));
  resumed.make = make;
  resumed.train();
  CHECK(resumed.state().global_step == 8);
  auto w1 = loom_test::weights(straight.model()), w2 = loom_test::weights(resumed.model());
  REQUIRE(w1.size() == w2.size());
  for (std::size_t i = 0; i < w1.size(); ++i) CHECK(torch::equal(w1[i], w2[i]));
  // And it trained: the weights moved from a fresh initialization's.
  torch::manual_seed(5);
  Mlp init;
  CHECK_FALSE(torch::equal(w1[0], init->parameters()[0]));
}

}  // namespace

TEST_CASE("create_optimizer: a group's own lr follows the schedule's factor; its weight decay applies") {
  auto a = base_args("create_optimizer/groups");
  a.save_strategy = "no";
  a.max_steps = 3;
  a.optim = "sgd";
  torch::manual_seed(5);
  T<> frozen_a(a, Mlp{}, data(40, 1));
  frozen_a.make = Make::groups;
  frozen_a.a_lr = 0.0;  // layer a steps at lr 0 * factor
  const auto before = loom_test::weights(frozen_a.model());
  frozen_a.train();
  const auto after = loom_test::weights(frozen_a.model());
  CHECK(torch::equal(before[0], after[0]));  // a.weight
  CHECK(torch::equal(before[1], after[1]));  // a.bias
  CHECK_FALSE(torch::equal(before[2], after[2]));  // b.weight
  REQUIRE(frozen_a.optimizer().groups().size() == 2);
  CHECK(frozen_a.optimizer().base_lr() == 0.01);

  // Layer a at its own lr 0.03 (3x --learning_rate): with plain SGD, one step at the peak moves
  // it exactly 3x as far as at --learning_rate.
  auto one_step = [&](double a_lr) {
    auto c = a;
    c.max_steps = 1;
    c.warmup_steps = 0;
    c.lr_scheduler_type = "constant";
    c.max_grad_norm = 0;
    torch::manual_seed(5);
    T<> t(c, Mlp{}, data(40, 1));
    t.make = Make::groups;
    t.a_lr = a_lr;
    const auto w0 = loom_test::weights(t.model());
    t.train();
    return (loom_test::weights(t.model())[0] - w0[0]);
  };
  const auto at_base = one_step(0.01), at_three = one_step(0.03);
  CHECK(at_base.abs().max().item<double>() > 0);
  CHECK(torch::allclose(at_three, at_base * 3, 1e-4, 1e-7));
}

TEST_CASE("a torch::optim::Adam from create_optimizer is stepped, saved as optimizer.pt and resumed bitwise") {
  straight_vs_resumed<T<>>("torch_adam", base_args("unused"), Make::torch_adam);
}

TEST_CASE("loom's rules with state resume bitwise through the checkpoint (RMSprop, SGD momentum, Adafactor, Lion)") {
  for (auto [optim, optim_args] : std::vector<std::pair<std::string, std::string>>{
           {"rmsprop", "momentum=0.9,centered=True"}, {"sgd", "momentum=0.9,nesterov=True"}, {"adafactor", "beta1=0.9"},
           {"lion", ""}, {"adagrad", "lr_decay=0.01"}}) {
    auto a = base_args("unused");
    a.optim = optim;
    if (!optim_args.empty()) a.optim_args = optim_args;
    a.weight_decay = 0.01;
    straight_vs_resumed<T<>>(optim, a, Make::args);
  }
}

TEST_CASE("under ZeRO-1 the sharded optimizer files carry the new state kinds and resume bitwise") {
  for (auto [optim, optim_args] : std::vector<std::pair<std::string, std::string>>{
           {"rmsprop", "momentum=0.9,centered=True"}, {"sgd", "momentum=0.9,dampening=0.1"}}) {
    auto a = base_args("unused");
    a.sharding = "zero1";
    a.optim = optim;
    a.optim_args = optim_args;
    a.weight_decay = 0.01;
    straight_vs_resumed<T<loom::sharding::ZeRO1>>("zero1_" + optim, a, Make::args);
  }
}

TEST_CASE("a torch::optim optimizer trains under DDP") {
  auto a = base_args("create_optimizer/ddp");
  a.sharding = "ddp";
  a.save_strategy = "no";
  a.max_steps = 2;
  torch::manual_seed(5);
  T<loom::sharding::DDP> t(a, Mlp{}, data(40, 1));
  t.make = Make::torch_adam;
  const auto before = loom_test::weights(t.model());
  t.train();
  CHECK(t.state().global_step == 2);
  CHECK_FALSE(torch::equal(before[0], loom_test::weights(t.model())[0]));
}

TEST_CASE("under ZeRO, Adafactor and a torch::optim optimizer stop at train() with a loom: line") {
  auto a = base_args("create_optimizer/zero");
  a.sharding = "zero1";
  a.save_strategy = "no";
  a.max_steps = 2;
  a.optim = "adafactor";
  torch::manual_seed(5);
  T<loom::sharding::ZeRO1> adafactor(a, Mlp{}, data(40, 1));
  CHECK(loom_test::error_of([&] { adafactor.train(); }) ==
        "loom: --optim adafactor cannot run under this sharding policy (ZeRO-1, ZeRO-2 or FullShard): its factored "
        "second moments need each matrix whole and the policy steps flat pieces of the parameters; use --sharding "
        "ddp or another --optim");
  a.optim = "adamw_torch";
  T<loom::sharding::ZeRO1> wrapped(a, Mlp{}, data(40, 1));
  wrapped.make = Make::torch_adam;
  CHECK(loom_test::error_of([&] { wrapped.train(); }) ==
        "loom: create_optimizer returned a wrapped torch::optim::Optimizer, but this sharding policy (ZeRO-1, ZeRO-2 "
        "or FullShard) steps each rank's flat pieces of the parameters and a torch optimizer keeps its state by "
        "whole parameter; return a loom optimizer (--optim) or use --sharding ddp");
  // Lion's elementwise rule steps the pieces.
  a.optim = "lion";
  T<loom::sharding::ZeRO1> lion(a, Mlp{}, data(40, 1));
  lion.train();
  CHECK(lion.state().global_step == 2);
}

TEST_CASE("resuming with another --optim than the checkpoint's is a loom: error") {
  auto a = base_args("create_optimizer/switch");
  a.max_steps = 4;
  a.optim = "rmsprop";
  torch::manual_seed(5);
  T<>(a, Mlp{}, data(40, 1)).train();
  a.resume_from_checkpoint = "latest";
  a.optim = "adagrad";
  a.max_steps = 6;
  T<> again(a, Mlp{}, data(40, 1));
  CHECK(loom_test::error_of([&] { again.train(); }) ==
        "loom: the checkpoint's optimizer is rmsprop but this run's is adagrad; resume with the same --optim (or "
        "create_optimizer)");
}

}  // namespace trainer_test_create_optimizer
