// loom::Accelerator: a loop written by hand on the Trainer's parts reproduces the Trainer
// (losses and weights), and each resumes from the other's checkpoints. One process here; the
// 2-rank cases are dist.accelerator (tests/dist/main.cpp, --loop accelerator).

#include <doctest/doctest.h>

#include "../accelerator_loop.hpp"
#include "../trainer_support.hpp"

#include <filesystem>
#include <set>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_accelerator {

namespace {

using loom_test::Batch;
using loom_test::Mlp6;

template <class... Policies>
using MlpTrainer = loom_test::Mlp6Trainer<Policies...>;
using loom_test::fresh_mlp6;
using loom_test::losses_of;

torch::Tensor mlp_loss(Mlp6& model, const Batch& b) { return torch::cross_entropy_loss(model->forward(b.x), b.labels); }

// 100 rows in batches of 8 with 2 micro-batches per step: 7 steps per epoch (the last of one
// batch of 4 rows), 10 steps in all (a second, reshuffled epoch), warmup, decay, clipping.
loom::TrainingArguments loop_args(const std::string& name) { return loom_test::resume_args(name, 8, 10); }

loom::data::TensorDataset<Batch> loop_data() { return loom_test::argmax_data(100, 3, 6); }


void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("logged loss " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= rel * std::abs(want[i]));
  }
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  return worst;
}

std::set<std::string> files_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The Trainer's run and the hand-written loop's, on the same arguments and policies.
template <class... Policies>
void check_loop_matches_trainer(const std::string& name, double tolerance) {
  const auto args = loop_args(name + "_trainer");
  MlpTrainer<Policies...> trainer(args, fresh_mlp6(), loop_data());
  trainer.train();
  const auto want_losses = losses_of(trainer.state());
  REQUIRE(want_losses.size() == 10);

  auto plain_args = loop_args(name + "_plain");
  loom::Accelerator<Policies...> acc(plain_args);
  auto model = fresh_mlp6();
  loom_test::plain_train(acc, model, loom::data::AnyDataset<Batch>(loop_data()), mlp_loss);
  check_close(losses_of(acc.state()), want_losses, tolerance);
  CHECK(max_difference(loom_test::weights(model), loom_test::weights(trainer.model())) <= tolerance);
  CHECK(acc.state().global_step == 10);
  CHECK(acc.state().epoch == doctest::Approx(trainer.state().epoch));
}

}  // namespace

TEST_CASE("a loop written on loom::Accelerator reproduces the Trainer's losses and weights (fp32 and bf16)") {
  check_loop_matches_trainer<>("acc_fp32", 1e-6);
  check_loop_matches_trainer<loom::precision::BF16>("acc_bf16", 1e-6);
}

TEST_CASE("the Trainer and a loop on loom::Accelerator resume from each other's checkpoints") {
  // The reference: the Trainer, uninterrupted, saving at steps 4 and 8.
  auto ref_args = loop_args("acc_resume_ref");
  ref_args.save_strategy = "steps";
  ref_args.save_steps = 4;
  MlpTrainer<> ref(ref_args, fresh_mlp6(), loop_data());
  ref.train();
  const auto want_weights = loom_test::weights(ref.model());
  const auto want_losses = losses_of(ref.state());
  const auto trainer_ckpt = std::filesystem::path(ref_args.output_dir) / "checkpoint-4";
  REQUIRE(std::filesystem::is_directory(trainer_ckpt));

  SUBCASE("the hand-written loop resumes the Trainer's checkpoint") {
    auto args = loop_args("acc_resume_plain");
    args.resume_from_checkpoint = trainer_ckpt.string();
    loom::Accelerator<> acc(args);
    auto model = fresh_mlp6();
    loom_test::plain_train(acc, model, loom::data::AnyDataset<Batch>(loop_data()), mlp_loss);
    CHECK(max_difference(loom_test::weights(model), want_weights) <= 1e-6);
    // The checkpoint's log history and the six steps after it.
    check_close(losses_of(acc.state()), want_losses, 1e-6);
  }

  SUBCASE("the Trainer resumes the hand-written loop's checkpoint, whose folder holds the Trainer's files") {
    auto args = loop_args("acc_resume_written");
    args.save_strategy = "steps";
    args.save_steps = 4;
    loom::Accelerator<> acc(args);
    auto model = fresh_mlp6();
    loom_test::plain_train(acc, model, loom::data::AnyDataset<Batch>(loop_data()), mlp_loss);
    const auto plain_ckpt = std::filesystem::path(args.output_dir) / "checkpoint-4";
    REQUIRE(std::filesystem::is_directory(plain_ckpt));
    CHECK(files_in(plain_ckpt) == files_in(trainer_ckpt));

    auto resume_args = loop_args("acc_resume_trainer");
    resume_args.resume_from_checkpoint = plain_ckpt.string();
    MlpTrainer<> trainer(resume_args, fresh_mlp6(), loop_data());
    trainer.train();
    CHECK(max_difference(loom_test::weights(trainer.model()), want_weights) <= 1e-6);
    check_close(losses_of(trainer.state()), want_losses, 1e-6);
  }
}

TEST_CASE("loom::Accelerator: start-up errors and what it refuses") {
  SUBCASE("arguments are checked against its policies, as the Trainer's") {
    auto args = loop_args("acc_bad_flags");
    args.fp16 = true;
    CHECK_THROWS_WITH_AS(loom::Accelerator<loom::precision::BF16>{args}, doctest::Contains("loom:"), loom::Error);
  }
  SUBCASE("prepare_optimizer before prepare_model") {
    loom::Accelerator<> acc(loop_args("acc_order"));
    auto model = fresh_mlp6();
    loom::schedule::LRScheduler<loom::schedule::Constant> scheduler(loom::schedule::make_schedule_params(acc.args(), 10));
    CHECK_THROWS_WITH_AS(acc.prepare_optimizer(loom::optim::make_optimizer(acc.args(), *model), scheduler),
                         doctest::Contains("call prepare_model"), loom::Error);
  }
  SUBCASE("a second model") {
    loom::Accelerator<> acc(loop_args("acc_twice"));
    auto model = fresh_mlp6();
    acc.prepare_model(model);
    auto other = fresh_mlp6();
    CHECK_THROWS_WITH_AS(acc.prepare_model(other), doctest::Contains("prepare_model was called twice"), loom::Error);
  }
  SUBCASE("save_state before an optimizer") {
    loom::Accelerator<> acc(loop_args("acc_save_early"));
    auto model = fresh_mlp6();
    acc.prepare_model(model);
    CHECK_THROWS_WITH_AS((void)acc.save_state(), doctest::Contains("call prepare_optimizer first"), loom::Error);
  }
  SUBCASE("gather_for_metrics in one process is the tensor itself") {
    loom::Accelerator<> acc(loop_args("acc_gather"));
    const auto t = torch::arange(6).reshape({3, 2});
    CHECK(torch::equal(acc.gather_for_metrics(t), t));
    const auto plan = acc.eval_batches(3);
    REQUIRE(plan.size() == 3);
    CHECK(plan[2].value() == 2);
  }
}

}  // namespace trainer_test_accelerator
