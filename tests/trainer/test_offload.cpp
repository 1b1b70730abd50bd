// --offload_optimizer in one process (a ZeRO policy at a world of one): the optimizer steps
// host tensors of its own, not views of the engine's storage, and the run equals the one
// without offload bitwise. The GAN of tests/gan_loop.hpp has two optimizers, so both
// prepare_optimizer's and add_optimizer's steps are offloaded. The 2-rank runs are dist.offload.

#include <doctest/doctest.h>

#include "../gan_loop.hpp"
#include "../trainer_support.hpp"

#include <set>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_offload {

namespace {

struct Run {
  loom_test::GanRun run;
  std::vector<torch::Tensor> weights;
  loom::dist::StateBytes bytes;
  bool shares_storage = false;  // does any tensor the optimizers step share storage with the model?
};

template <class Sharding>
Run train(const std::string& name, bool offload, bool offload_param = false) {
  auto args = loom_test::quiet_args(name);
  loom_test::set_gan_args(args);
  args.offload_optimizer = offload;
  args.offload_param = offload_param;
  loom::Accelerator<Sharding> acc(args);
  auto model = loom_test::fresh_gan();
  Run r{loom_test::gan_train(acc, model), {}, acc.model_state_bytes()};
  // Under --offload_param the gathered parameters are released between uses, in a world of one too.
  acc.sharding().with_full_params([&] { r.weights = loom_test::weights(model); });
  std::set<const void*> storages;
  for (const auto& p : model->parameters()) storages.insert(p.storage().data());
  for (std::size_t k = 0; k < acc.num_optimizers(); ++k)
    for (const auto& p : acc.optimizer(k).parameters()) r.shares_storage |= storages.contains(p.storage().data());
  return r;
}

template <class Sharding>
void check_offload_is_bitwise(const std::string& name, bool offload_param = false) {
  const auto plain = train<Sharding>(name, false), off = train<Sharding>(name + "_offload", true, offload_param);
  CHECK(plain.shares_storage);  // without offload the optimizers step views of the engine's buffers
  CHECK_FALSE(off.shares_storage);
  REQUIRE(off.run.d_losses.size() == plain.run.d_losses.size());
  for (std::size_t i = 0; i < plain.run.d_losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(off.run.d_losses[i] == plain.run.d_losses[i]);
    CHECK(off.run.g_losses[i] == plain.run.g_losses[i]);
  }
  REQUIRE(off.weights.size() == plain.weights.size());
  for (std::size_t i = 0; i < plain.weights.size(); ++i) CHECK(torch::equal(off.weights[i], plain.weights[i]));
  // Both optimizers' state is host bytes now, with the host copies of the pieces and their
  // gradients (4 + 4 bytes per element: a world of one steps every parameter whole). With
  // --offload_param the shard is the host copy, and the device keeps no parameter between
  // steps (the gathered buffers are released).
  CHECK(plain.bytes.host == 0.0);
  CHECK(off.bytes.optimizer == 0.0);
  CHECK(off.bytes.params == (offload_param ? 0.0 : plain.bytes.params));
  CHECK(off.bytes.host == plain.bytes.optimizer + 2 * plain.bytes.params);
}

}  // namespace

TEST_CASE("optimizer offload in one process: the optimizers step host tensors of their own, bitwise as without") {
  SUBCASE("ZeRO-2") { check_offload_is_bitwise<loom::sharding::ZeRO2>("offload_zero2"); }
  SUBCASE("FullShard") { check_offload_is_bitwise<loom::sharding::FullShard>("offload_full_shard"); }
  SUBCASE("FullShard, --offload_param") {
    check_offload_is_bitwise<loom::sharding::FullShard>("offload_full_shard_params", /*offload_param=*/true);
  }
}

}  // namespace trainer_test_offload
