// Precision policies in the real loop: BF16 autocast with float32 master weights; FP16 loss
// scaling with an injected overflow (that step skipped, the scale halved, weights and
// optimizer state untouched, the schedule not advanced) and growth after 2000 clean steps.
#include <loom/loom.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../trainer_support.hpp"

#include <filesystem>
#include <limits>
#include <random>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace precision_test_precision {

namespace {

using loom_test::Batch;

// 8 features; the label is the argmax of the first three.
loom::data::TensorDataset<Batch> make_data(int64_t n, uint64_t seed) { return loom_test::argmax_data(n, seed, 8); }

loom::TrainingArguments args_for(const std::string& name, int64_t max_steps = -1, double logging_steps = 500) {
  auto a = loom_test::quiet_args(name);
  a.per_device_train_batch_size = 8;
  a.learning_rate = 0.01;
  a.max_steps = max_steps;
  a.logging_steps = logging_steps;
  return a;
}

// Records the dtype compute_loss saw, and can poison one chosen optimizer step.
template <class Precision>
struct Probe : loom::Trainer<Probe<Precision>, torch::nn::Linear, Precision, loom::schedule::Linear> {
  using Base = loom::Trainer<Probe<Precision>, torch::nn::Linear, Precision, loom::schedule::Linear>;
  using Base::Base;
  int64_t poison_step = -1;  // global_step value during which the loss becomes inf
  bool poison_all = false;   // ... or every step
  torch::ScalarType seen = torch::kDouble;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) {
    auto logits = model->forward(b.x);
    seen = logits.scalar_type();
    auto loss = torch::cross_entropy_loss(logits, b.labels);
    if (poison_all || this->state().global_step == poison_step) loss = loss * std::numeric_limits<float>::infinity();
    return loss;
  }
};

// Snapshots the weights, Adam moments and learning rate around each step.
struct Snapshots {
  std::vector<torch::Tensor>* params = nullptr;
  std::vector<std::vector<torch::Tensor>> before, after;
  std::vector<double> scale_after;
  std::function<double()> scale;
  void on_step_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    before.push_back(copy());
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    after.push_back(copy());
    if (scale) scale_after.push_back(scale());
  }
  std::vector<torch::Tensor> copy() const {
    std::vector<torch::Tensor> out;
    for (auto& p : *params) out.push_back(p.detach().clone());
    return out;
  }
};

template <class Precision>
struct Watched : loom::Trainer<Watched<Precision>, torch::nn::Linear, Precision, loom::schedule::Linear,
                               loom::Callbacks<Snapshots>> {
  using Base = loom::Trainer<Watched<Precision>, torch::nn::Linear, Precision, loom::schedule::Linear,
                             loom::Callbacks<Snapshots>>;
  using Base::Base;
  int64_t poison_step = -1;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) {
    auto loss = torch::cross_entropy_loss(model->forward(b.x), b.labels);
    if (this->state().global_step == poison_step) loss = loss * std::numeric_limits<float>::infinity();
    return loss;
  }
};

// One Trainer type for every policy: the flags choose when the run starts.
struct FlagProbe : loom::Trainer<FlagProbe, torch::nn::Linear, loom::sharding::FromArgs, loom::precision::FromArgs,
                                 loom::schedule::Linear> {
  using Trainer::Trainer;
  int64_t poison_step = -1;
  torch::ScalarType seen = torch::kDouble;
  torch::Tensor compute_loss(torch::nn::Linear& model, Batch& b) {
    auto logits = model->forward(b.x);
    seen = logits.scalar_type();
    auto loss = torch::cross_entropy_loss(logits, b.labels);
    if (this->state().global_step == poison_step) loss = loss * std::numeric_limits<float>::infinity();
    return loss;
  }
};

}  // namespace

TEST_CASE("BF16: forward under bfloat16 autocast, float32 master weights, loss falls") {
  auto args = args_for("bf16", 40, 10);
  torch::manual_seed(0);
  Probe<loom::precision::BF16> t(args, torch::nn::Linear(8, 3), make_data(256, 1));
  CHECK(t.args().bf16);  // the type's policy is reflected in the arguments
  t.train();
  CHECK((t.seen == torch::kBFloat16));
  CHECK((t.model()->weight.scalar_type() == torch::kFloat));
  const auto& h = t.state().log_history;
  CHECK(h[3]["loss"].get<double>() < h[0]["loss"].get<double>());
}

TEST_CASE("FP16: an injected overflow skips exactly that step and halves the scale") {
  auto args = args_for("fp16_overflow");
  args.max_steps = 6;
  args.logging_steps = 1;
  torch::manual_seed(0);
  Watched<loom::precision::FP16> t(args, torch::nn::Linear(8, 3), make_data(256, 2));
  t.poison_step = 2;  // the third optimizer step (global_step is 2 while it runs)
  auto params = t.model()->parameters();
  auto& snap = t.template callback<Snapshots>();
  snap.params = &params;
  snap.scale = [&] { return t.precision().scale().template item<double>(); };
  t.train();
  REQUIRE(snap.before.size() == 6);
  for (std::size_t step = 0; step < 6; ++step) {
    INFO("step " << step);
    for (std::size_t i = 0; i < params.size(); ++i) {
      CHECK(torch::isfinite(snap.after[step][i]).all().template item<bool>());
      if (step == 2) CHECK(torch::equal(snap.before[step][i], snap.after[step][i]));  // skipped: unchanged
      else CHECK_FALSE(torch::equal(snap.before[step][i], snap.after[step][i]));     // others moved
    }
  }
  CHECK(snap.scale_after[1] == doctest::Approx(65536.0));
  CHECK(snap.scale_after[2] == doctest::Approx(32768.0));
  CHECK(snap.scale_after[5] == doctest::Approx(32768.0));
  CHECK(t.skipped_steps() == 1);
  // The schedule did not advance on the skipped step: steps 3 and 4 (1-based) used the same rate.
  const auto& h = t.state().log_history;
  CHECK(h[2]["learning_rate"].get<double>() == doctest::Approx(h[3]["learning_rate"].get<double>()));
  CHECK(h[1]["learning_rate"].get<double>() > h[2]["learning_rate"].get<double>());
  // Each log says how many of its steps were skipped.
  for (std::size_t i = 0; i < 6; ++i) CHECK(h[i]["skipped_steps"].get<double>() == (i == 2 ? 1.0 : 0.0));
}

TEST_CASE("FP16: a loss scale that collapses below 1 stops the run with a loom: error") {
  auto args = args_for("fp16_collapse", 40, 10);
  torch::manual_seed(0);
  Probe<loom::precision::FP16> t(args, torch::nn::Linear(8, 3), make_data(256, 2));
  t.poison_all = true;  // every step overflows: the scale halves each time, 2^16 -> 2^-1 after 17
  const auto msg = loom_test::error_of([&] { t.train(); });
  INFO(msg);
  CHECK(msg.rfind("loom: the fp16 loss scale fell to 0.5 (below 1) at step 17 after 17 skipped steps", 0) == 0);
  CHECK(t.skipped_steps() == 17);
  // The first window logged its ten skipped steps.
  REQUIRE(t.state().log_history.size() == 1);
  CHECK(t.state().log_history[0]["skipped_steps"].get<double>() == 10.0);
}

TEST_CASE("FP16: the scale floor stops a Trainer run when the collapse is found at a save or at the end") {
  // A step's skip flag is read at the next optimizer step, or at a save or the end of training
  // when none follows; the floor is checked on each path (the Trainer settles the flag through
  // its Accelerator). Step 17 takes the scale from 1 to 0.5; no log reads the flag here.
  for (const bool at_save : {false, true}) {
    INFO((at_save ? "found at the save of step 17" : "found at the end of training"));
    auto args = args_for(at_save ? "fp16_floor_save" : "fp16_floor_end", at_save ? 40 : 17);
    args.logging_strategy = "no";
    if (at_save) {
      args.save_strategy = "steps";
      args.save_steps = 17;
    }
    torch::manual_seed(0);
    Probe<loom::precision::FP16> t(args, torch::nn::Linear(8, 3), make_data(256, 2));
    t.poison_all = true;
    const auto msg = loom_test::error_of([&] { t.train(); });
    CHECK(msg.rfind("loom: the fp16 loss scale fell to 0.5 (below 1) at step 17 after 17 skipped steps", 0) == 0);
    CHECK(t.state().global_step == 17);
    // The collapsed step is not saved as a checkpoint.
    CHECK_FALSE(std::filesystem::exists(std::filesystem::path(args.output_dir) / "checkpoint-17"));
  }
}

TEST_CASE("FP16: the scale doubles after 2000 clean steps (PyTorch's growth interval)") {
  auto args = args_for("fp16_growth");
  args.max_steps = 2001;
  args.logging_steps = 1000;
  args.learning_rate = 1e-4;
  args.per_device_train_batch_size = 4;
  torch::manual_seed(0);
  // Small inputs keep the scaled fp16 gradients (scale 2^16) finite, so every step is clean.
  auto data = make_data(64, 3);
  Batch small{data.tensors().x * 0.01, data.tensors().labels};
  Probe<loom::precision::FP16> t(args, torch::nn::Linear(8, 3), loom::data::TensorDataset<Batch>(small));
  CHECK(t.args().fp16);
  t.train();
  CHECK((t.seen == torch::kHalf));
  CHECK(t.skipped_steps() == 0);
  // 2000 clean steps grow the scale once: 2^16 -> 2^17; the 2001st does not grow it again.
  CHECK(t.precision().scale().item<double>() == doctest::Approx(131072.0));
}

TEST_CASE("FP16 under --loss_scale_rule deepspeed: the scale DeepSpeed's DynamicLossScaler gives, step for step") {
  const char* py = loom_test::python("DeepSpeed loss scaler cross-check");
  if (py == nullptr) return;
  struct Case {
    double init;
    int64_t window, hysteresis;
    bool consecutive;
    double min_scale;
    std::vector<bool> overflows;
  };
  std::mt19937 rng(5);
  const auto random_flags = [&](int n, int one_in) {
    std::vector<bool> v;
    for (int i = 0; i < n; ++i) v.push_back(rng() % static_cast<unsigned>(one_in) == 0);
    return v;
  };
  std::vector<Case> cases{
      {65536, 3, 2, false, 1, random_flags(60, 4)},
      {65536, 3, 2, true, 1, random_flags(60, 3)},
      {1024, 2, 1, false, 1, random_flags(50, 3)},
      {256, 4, 3, false, 32, random_flags(80, 2)},
      {4, 1000, 1, false, 1, {true, true, false, true}},  // reaches the minimum, and overflows there
      {8, 5, 2, true, 2, random_flags(40, 2)},
  };
  auto list = nlohmann::json::array();
  for (const auto& c : cases)
    list.push_back({{"kind", "loss_scale"}, {"init_scale", c.init}, {"scale_window", c.window},
                    {"min_scale", c.min_scale}, {"delayed_shift", c.hysteresis},
                    {"consecutive_hysteresis", c.consecutive}, {"overflows", c.overflows}});
  const auto dir = loom_test::fresh_dir("precision/deepspeed_scaler");
  loom_test::write_bytes(dir / "cases.json", list.dump());
  const std::string printed = loom_test::run_capture(
      std::string(py) + " " + (loom_test::source_dir() / "tests/schedule/deepspeed_peer.py").string() + " " +
      (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1");
  INFO(printed);
  REQUIRE(std::filesystem::exists(dir / "out.json"));
  const auto want = nlohmann::json::parse(loom_test::read_bytes(dir / "out.json"));
  bool floor_reached = false;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    CAPTURE(i);
    loom::precision::ScalerOptions o;
    o.deepspeed = true, o.init_scale = c.init, o.growth_interval = c.window, o.hysteresis = c.hysteresis;
    o.consecutive_hysteresis = c.consecutive, o.min_scale = c.min_scale;
    loom::precision::PrecisionImpl<loom::precision::FP16> fp16(torch::kCPU, o);
    auto p = torch::zeros({3}).requires_grad_(true);
    const auto& scales = want[i]["scales"];
    const auto raised = want[i]["raised_at"];
    for (std::size_t k = 0; k < c.overflows.size(); ++k) {
      CAPTURE(k);
      CHECK(fp16.scale().item<double>() == scales[k].get<double>());
      p.mutable_grad() = torch::full({3}, c.overflows[k] ? std::numeric_limits<float>::infinity() : 1.0f);
      fp16.unscale({p});
      fp16.update();
      const bool stops = !raised.is_null() && raised.get<std::size_t>() == k;
      const auto error = loom_test::error_of([&] { fp16.check_scale_floor(1, static_cast<int64_t>(k)); });
      CHECK((error.find("loss scale is at its minimum") != std::string::npos) == stops);
      if (stops) {
        floor_reached = true;
        break;
      }
      if (k + 1 == c.overflows.size()) CHECK(fp16.scale().item<double>() == scales[k + 1].get<double>());
    }
    // The state round-trips.
    loom::precision::PrecisionImpl<loom::precision::FP16> again(torch::kCPU, o);
    again.load_state_dict(fp16.state_dict());
    CHECK(again.state_dict() == fp16.state_dict());
  }
  CHECK(floor_reached);  // one case reaches DeepSpeed's "already at minimum"
}

TEST_CASE("sharding::FromArgs and precision::FromArgs: one Trainer type, the flags choose as the run starts") {
  const auto has_key = [](const FlagProbe& t, const char* key) {
    for (const auto& entry : t.state().log_history)
      if (entry.contains(key)) return true;
    return false;
  };
  SUBCASE("no precision flag: float32, no loss scale, no skipped_steps in the logs") {
    auto args = args_for("from_args_fp32", 4, 1);
    torch::manual_seed(0);
    FlagProbe t(args, torch::nn::Linear(8, 3), make_data(64, 5));
    t.train();
    CHECK((t.seen == torch::kFloat));
    CHECK(t.accelerator().precision_facts().name == "fp32");
    CHECK(t.accelerator().sharding_facts().name == "no");  // auto in one process
    CHECK(t.args().sharding == "no");                       // training_args.json says what ran
    CHECK_FALSE(t.accelerator().forward_is_collective());
    CHECK_FALSE(t.precision().scale().defined());
    CHECK_FALSE(has_key(t, "skipped_steps"));
  }
  SUBCASE("--bf16: bfloat16 autocast, float32 weights") {
    auto args = args_for("from_args_bf16", 4, 1);
    args.bf16 = true;
    torch::manual_seed(0);
    FlagProbe t(args, torch::nn::Linear(8, 3), make_data(64, 5));
    t.train();
    CHECK((t.seen == torch::kBFloat16));
    CHECK((t.model()->weight.scalar_type() == torch::kFloat));
    CHECK(t.accelerator().precision_facts().name == "bf16");
    CHECK_FALSE(has_key(t, "skipped_steps"));
  }
  SUBCASE("--fp16: the loss scaler, an overflow skipped and logged, the same weights as precision::FP16") {
    auto args = args_for("from_args_fp16", 5, 1);
    args.fp16 = true;
    torch::manual_seed(0);
    FlagProbe t(args, torch::nn::Linear(8, 3), make_data(64, 5));
    t.poison_step = 2;
    t.train();
    CHECK((t.seen == torch::kHalf));
    CHECK(t.skipped_steps() == 1);
    CHECK(t.precision().scale().item<double>() == doctest::Approx(32768.0));
    CHECK(t.precision().state_dict()["scale"].get<double>() == doctest::Approx(32768.0));
    CHECK(has_key(t, "skipped_steps"));
    // The compiled FP16 Trainer on the same data and seed ends at the same weights, bit for bit.
    auto fixed_args = args_for("from_args_fp16_fixed", 5, 1);
    torch::manual_seed(0);
    Probe<loom::precision::FP16> fixed(fixed_args, torch::nn::Linear(8, 3), make_data(64, 5));
    fixed.poison_step = 2;
    fixed.train();
    CHECK(torch::equal(t.model()->weight, fixed.model()->weight));
    CHECK(torch::equal(t.model()->bias, fixed.model()->bias));
  }
  SUBCASE("an unknown --sharding names the choices") {
    auto args = args_for("from_args_bad");
    args.sharding = "zero9";
    CHECK_THROWS_WITH_AS(FlagProbe(args, torch::nn::Linear(8, 3), make_data(16, 4)),
                         "loom: --sharding zero9 is not one of no|ddp|zero1|zero2|full_shard|auto", loom::Error);
  }
}

TEST_CASE("--bf16 on a Trainer compiled for FP32 is a start-up error; select_policies picks the type") {
  auto args = args_for("mismatch");
  args.bf16 = true;
  CHECK_THROWS_WITH_AS(Probe<loom::precision::FP32>(args, torch::nn::Linear(8, 3), make_data(16, 4)),
                       doctest::Contains("loom: --bf16 is set but this Trainer was compiled with precision::FP32"),
                       loom::Error);
  auto picked = loom::select_precision(args, []<class P>() { return std::string(P::name); });
  CHECK(picked == "bf16");
  args.bf16 = false;
  args.fp16 = true;
  CHECK(loom::select_precision(args, []<class P>() { return std::string(P::name); }) == "fp16");
  args.fp16 = false;
  CHECK(loom::select_precision(args, []<class P>() { return std::string(P::name); }) == "fp32");
  args.fp16 = args.bf16 = true;
  CHECK_THROWS_WITH_AS(loom::select_precision(args, []<class P>() { return 0; }),
                       "loom: --bf16 and --fp16 are both set; choose one", loom::Error);
}

}  // namespace precision_test_precision
