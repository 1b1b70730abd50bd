// Several optimizers in loom::Accelerator (issue 26 point 5): a small GAN whose generator and
// discriminator each have their own optimizer and lr schedule, stepped in alternation. It
// resumes bitwise from its checkpoint, each optimizer's files apart (optimizer.* and
// scheduler.json for the first, optimizer_1.* and scheduler_1.json for the second), under
// every sharding policy in one process; the policies that shard the optimizer agree with the
// unsharded run. A parameter given to two optimizers is a loom: error naming it. The 2-rank
// case is dist.gan (tests/dist/main.cpp).

#include <doctest/doctest.h>

#include "../gan_loop.hpp"
#include "../trainer_support.hpp"

#include <filesystem>
#include <set>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_multi_optimizer {

namespace {

using loom_test::Gan;

loom::TrainingArguments gan_args(const std::string& name) {
  auto a = loom_test::quiet_args(name);
  loom_test::set_gan_args(a);
  return a;
}

std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

void check_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO(what << " " << i);
    CHECK(torch::equal(a[i], b[i]));
  }
}

// Straight through 6 steps (saving at 3), then a second run resumed from checkpoint-3: the same
// losses for steps 4..6, the same weights and both optimizers' state, bit for bit.
template <class... Policies>
loom_test::GanRun check_gan_resumes_bitwise(const std::string& name) {
  auto args = gan_args(name);
  args.save_strategy = "steps";
  args.save_steps = 3;
  loom::Accelerator<Policies...> acc(args);
  auto model = loom_test::fresh_gan();
  const auto straight = loom_test::gan_train(acc, model);
  REQUIRE(straight.d_losses.size() == 6);
  CHECK(acc.num_optimizers() == 2);

  const auto ckpt = std::filesystem::path(args.output_dir) / "checkpoint-3";
  const auto files = files_in(ckpt);
  const bool sharded = acc.sharding().shards_optimizer();
  for (const char* f : {"scheduler.json", "scheduler_1.json", "optimizer.json", "optimizer_1.json"}) {
    INFO(f);
    CHECK(files.count(f) == 1);
  }
  for (const char* stem : {"optimizer", "optimizer_1"}) {
    const std::string whole = std::string(stem) + ".safetensors", shard = std::string(stem) + "-0-of-1.safetensors";
    INFO(stem);
    CHECK(files.count(sharded ? shard : whole) == 1);
    CHECK(files.count(sharded ? whole : shard) == 0);
  }
  // model_state_bytes counts both optimizers' state.
  double state_bytes = 0;
  for (std::size_t k = 0; k < 2; ++k)
    for (const auto& [key, t] : acc.optimizer(k).state_tensors()) state_bytes += static_cast<double>(t.nbytes());
  CHECK(state_bytes > 0);
  CHECK(acc.model_state_bytes().optimizer == state_bytes);
  // Each optimizer's state is over its own parameters, named as the model names them.
  for (const auto& [key, t] : acc.optimizer(0).state_tensors()) CHECK(key.find(".generator.") != std::string::npos);
  for (const auto& [key, t] : acc.optimizer(1).state_tensors()) CHECK(key.find(".discriminator.") != std::string::npos);

  auto resumed_args = gan_args(name + "_resumed");  // a folder of its own (tmp_dir empties it)
  resumed_args.resume_from_checkpoint = ckpt.string();
  loom::Accelerator<Policies...> again(resumed_args);
  auto other = loom_test::fresh_gan(/*seed=*/99);  // the checkpoint's weights replace these
  const auto resumed = loom_test::gan_train(again, other);
  REQUIRE(resumed.d_losses.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    INFO("step " << i + 4);
    CHECK(resumed.d_losses[i] == straight.d_losses[i + 3]);
    CHECK(resumed.g_losses[i] == straight.g_losses[i + 3]);
    CHECK(resumed.d_lrs[i] == straight.d_lrs[i + 3]);
    CHECK(resumed.g_lrs[i] == straight.g_lrs[i + 3]);
  }
  check_equal(loom_test::weights(other), loom_test::weights(model), "weight");
  for (std::size_t k = 0; k < 2; ++k) {
    const auto a = acc.optimizer(k).state_tensors(), b = again.optimizer(k).state_tensors();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("optimizer " << k << " state " << a[i].first);
      CHECK(a[i].first == b[i].first);
      CHECK(torch::equal(a[i].second, b[i].second));
    }
  }
  return straight;
}

}  // namespace

TEST_CASE("two optimizers in loom::Accelerator: a GAN with its own schedules resumes bitwise") {
  const auto plain = check_gan_resumes_bitwise<>("gan_noshard");
  // The discriminator steps at its cosine schedule from 2e-3, the generator at its linear
  // schedule with warmup from 1e-3: each optimizer follows its own scheduler.
  auto g_args = gan_args("gan_lr_check");
  loom::schedule::LRScheduler<loom::schedule::Linear> g_sched(loom::schedule::make_schedule_params(g_args, 6));
  auto d_args = g_args;
  loom_test::set_discriminator_args(d_args);
  loom::schedule::LRScheduler<loom::schedule::Cosine> d_sched(loom::schedule::make_schedule_params(d_args, 6));
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(plain.g_lrs[i] == g_sched.lr_at(static_cast<int64_t>(i)));
    CHECK(plain.d_lrs[i] == d_sched.lr_at(static_cast<int64_t>(i)));
  }
  // Both players learn something: the losses change from step to step.
  CHECK(plain.d_losses.front() != plain.d_losses.back());
  CHECK(plain.g_losses.front() != plain.g_losses.back());

  auto close_to_plain = [&](const loom_test::GanRun& run) {
    for (std::size_t i = 0; i < 6; ++i) {
      INFO("step " << i + 1 << ": " << run.d_losses[i] << " vs " << plain.d_losses[i]);
      CHECK(run.d_losses[i] == doctest::Approx(plain.d_losses[i]).epsilon(1e-5));
      CHECK(run.g_losses[i] == doctest::Approx(plain.g_losses[i]).epsilon(1e-5));
    }
  };
  SUBCASE("DDP") { close_to_plain(check_gan_resumes_bitwise<loom::sharding::DDP>("gan_ddp")); }
  SUBCASE("ZeRO-1") { close_to_plain(check_gan_resumes_bitwise<loom::sharding::ZeRO1>("gan_zero1")); }
  SUBCASE("ZeRO-2") { close_to_plain(check_gan_resumes_bitwise<loom::sharding::ZeRO2>("gan_zero2")); }
  SUBCASE("FullShard") { close_to_plain(check_gan_resumes_bitwise<loom::sharding::FullShard>("gan_full_shard")); }
}

// An Accelerator with the GAN prepared and the generator's optimizer (index 0) at a constant
// schedule; `further` is a scheduler for an optimizer added by the test.
template <class... Policies>
struct GanPrepared {
  explicit GanPrepared(const loom::TrainingArguments& args)
      : acc(args), model(loom_test::fresh_gan()), first(loom::schedule::make_schedule_params(args, 6)),
        further(loom::schedule::make_schedule_params(args, 6)) {
    acc.prepare_model(model);
    acc.prepare_optimizer(loom::optim::make_optimizer(args, *model->generator), first);
  }
  loom::Accelerator<Policies...> acc;
  Gan model;
  loom::schedule::LRScheduler<loom::schedule::Constant> first, further;
};

TEST_CASE("two optimizers in loom::Accelerator: what it refuses") {
  auto args = gan_args("gan_refused");
  SUBCASE("a parameter another optimizer holds") {
    GanPrepared<> p(args);
    // The second optimizer over the whole model takes the generator's parameters too.
    CHECK_THROWS_WITH_AS(p.acc.add_optimizer(loom::optim::make_optimizer(args, *p.model), p.further),
                         doctest::Contains("loom: parameter generator.0.weight is given to optimizer 1, but optimizer 0 "
                                           "already holds it"),
                         loom::Error);
  }
  SUBCASE("add_optimizer before prepare_optimizer") {
    loom::Accelerator<> acc(args);
    auto model = loom_test::fresh_gan();
    acc.prepare_model(model);
    loom::schedule::LRScheduler<loom::schedule::Constant> s(loom::schedule::make_schedule_params(args, 6));
    CHECK_THROWS_WITH_AS(acc.add_optimizer(loom::optim::make_optimizer(args, *model->generator), s),
                         doctest::Contains("call prepare_optimizer"), loom::Error);
  }
  SUBCASE("several optimizers under fp16") {
    auto fp16 = args;
    fp16.fp16 = true;
    GanPrepared<loom::precision::FP16> p(fp16);
    CHECK_THROWS_WITH_AS(p.acc.add_optimizer(loom::optim::make_optimizer(args, *p.model->discriminator), p.further),
                         doctest::Contains("several optimizers cannot run under --fp16"), loom::Error);
  }
  SUBCASE("an optimizer index it does not hold") {
    GanPrepared<> p(args);
    CHECK_THROWS_WITH_AS((void)p.acc.optimizer(1), doctest::Contains("there is no optimizer 1"), loom::Error);
    CHECK_THROWS_WITH_AS((void)p.acc.step(1), doctest::Contains("there is no optimizer 1"), loom::Error);
  }
  SUBCASE("a checkpoint of one optimizer cannot resume two") {
    GanPrepared<> p(args);
    const auto dir = p.acc.save_state();
    p.acc.add_optimizer(loom::optim::make_optimizer(args, *p.model->discriminator), p.further);
    CHECK(p.acc.num_optimizers() == 2);
    CHECK_THROWS_WITH_AS(p.acc.load_state(dir), doctest::Contains("it has no optimizer_1.json"), loom::Error);
  }
}

}  // namespace trainer_test_multi_optimizer
