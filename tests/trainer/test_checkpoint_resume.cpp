// Checkpoints from the real loop: N steps straight equal N/2 steps + resume to N bitwise
// (FP32, BF16, FP16; with accumulation and evaluation in between), the files HF users
// expect (model.safetensors read by Python's safetensors), rotation that keeps the best,
// load_best_model_at_end, save_strategy "best", and the start-up errors.
#include <loom/loom.hpp>

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace trainer_test_checkpoint_resume {

namespace fs = std::filesystem;

namespace {

using loom_test::Batch;

// 6 features; the label is the argmax of the first three.
loom::data::TensorDataset<Batch> data(int64_t n, uint64_t seed) { return loom_test::argmax_data(n, seed, 6); }

using loom_test::StopAt;

using Mlp = loom_test::Mlp6;

template <class Precision>
struct T : loom::Trainer<T<Precision>, Mlp, Precision, loom::Callbacks<StopAt>> {
  using Base = loom::Trainer<T<Precision>, Mlp, Precision, loom::Callbacks<StopAt>>;
  using Base::Base;
  loom::ModelOutput compute_loss(Mlp& model, Batch& b) { return loom_test::cross_entropy(model, b); }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return loom_test::accuracy(p); }
};

loom::TrainingArguments base_args(const std::string& name) {
  auto a = loom_test::quiet_args(name);
  a.per_device_train_batch_size = 4;
  a.gradient_accumulation_steps = 2;
  a.learning_rate = 0.02;
  a.weight_decay = 0.01;
  a.warmup_steps = 2;
  a.max_steps = 12;
  a.logging_steps = 1;
  a.eval_strategy = "steps";
  a.eval_steps = 3;
  a.save_strategy = "steps";
  a.save_steps = 6;
  return a;
}

using loom_test::weights;

template <class Precision>
void straight_vs_resumed(const std::string& name, bool full_determinism = false, bool deterministic = false) {
  INFO(name);
  // Straight: 12 steps.
  auto a = base_args(name + "_straight");
  a.full_determinism = full_determinism;
  a.deterministic = deterministic;
  torch::manual_seed(5);
  T<Precision> straight(a, Mlp{}, data(40, 1), data(12, 2));
  straight.train();
  // Interrupted at 6 (checkpoint-6 written by save_steps), then resumed from "latest".
  auto b = base_args(name + "_resumed");
  b.full_determinism = full_determinism;
  b.deterministic = deterministic;
  {
    torch::manual_seed(5);
    T<Precision> first(b, Mlp{}, data(40, 1), data(12, 2));
    first.template callback<StopAt>().step = 6;
    first.train();
    CHECK(first.state().global_step == 6);
  }
  REQUIRE(fs::exists(fs::path(b.output_dir) / "checkpoint-6" / "model.safetensors"));
  b.resume_from_checkpoint = "latest";
  torch::manual_seed(999);  // the resumed run must not depend on the fresh initialization
  T<Precision> resumed(b, Mlp{}, data(40, 1), data(12, 2));
  resumed.train();
  CHECK(resumed.state().global_step == 12);
  auto w1 = weights(straight.model()), w2 = weights(resumed.model());
  REQUIRE(w1.size() == w2.size());
  for (std::size_t i = 0; i < w1.size(); ++i) CHECK(torch::equal(w1[i], w2[i]));  // bitwise
  // The logs after the resume point are the same too (losses, rates, grad norms, evals).
  const auto& h1 = straight.state().log_history;
  const auto& h2 = resumed.state().log_history;
  REQUIRE(h1.size() == h2.size());
  for (std::size_t i = 0; i + 1 < h1.size(); ++i) {
    for (const char* k : {"loss", "learning_rate", "grad_norm", "eval_loss", "eval_accuracy"})
      if (h1[i].contains(k)) {
        INFO("entry " << i << " " << k);
        REQUIRE(h2[i].contains(k));
        CHECK(h1[i][k].template get<double>() == h2[i][k].template get<double>());
      }
  }
  CHECK(straight.state().log_history.back()["train_loss"].template get<double>() ==
        doctest::Approx(resumed.state().log_history.back()["train_loss"].template get<double>()).epsilon(1e-9));
}

using loom_test::run_capture;

}  // namespace

TEST_CASE("resume: N straight steps equal N/2 + resume to N, bitwise (FP32)") {
  straight_vs_resumed<loom::precision::FP32>("resume_fp32");
}
TEST_CASE("resume: N straight steps equal N/2 + resume to N, bitwise (BF16)") {
  straight_vs_resumed<loom::precision::BF16>("resume_bf16");
}
TEST_CASE("--full_determinism: torch's deterministic algorithms, cuDNN and cuBLAS set as HF does; the resume is bitwise") {
  const loom_test::DeterminismRestore restore;  // a process-wide setting, as HF's
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(false, false);
  straight_vs_resumed<loom::precision::FP32>("resume_full_determinism", true);
  CHECK(ctx.deterministicAlgorithms());
  CHECK_FALSE(ctx.deterministicAlgorithmsWarnOnly());
  CHECK(ctx.deterministicCuDNN());
  CHECK_FALSE(ctx.benchmarkCuDNN());
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":16:8");
  CHECK(std::string(std::getenv("CUDA_LAUNCH_BLOCKING")) == "1");
}

TEST_CASE("--deterministic: deterministic algorithms and cuBLAS workspace without blocking launches; the resume is bitwise") {
  const loom_test::DeterminismRestore restore;
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(false, false);
  ctx.setDeterministicCuDNN(false);
  ctx.setBenchmarkCuDNN(true);
  ::unsetenv("CUBLAS_WORKSPACE_CONFIG");
  ::unsetenv("CUDA_LAUNCH_BLOCKING");
  straight_vs_resumed<loom::precision::FP32>("resume_deterministic", false, true);
  CHECK(ctx.deterministicAlgorithms());
  CHECK_FALSE(ctx.deterministicAlgorithmsWarnOnly());
  CHECK(ctx.deterministicCuDNN());
  CHECK_FALSE(ctx.benchmarkCuDNN());
  REQUIRE(std::getenv("CUBLAS_WORKSPACE_CONFIG") != nullptr);
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");  // Lightning's
  CHECK(std::getenv("CUDA_LAUNCH_BLOCKING") == nullptr);                    // what --full_determinism costs
  // A deterministic workspace the user chose is kept; any other is replaced.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  loom::enable_determinism();
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":16:8");
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0", 1);
  loom::enable_determinism();
  CHECK(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")) == ":4096:8");
}

TEST_CASE("resume: N straight steps equal N/2 + resume to N, bitwise (FP16, scaler state restored)") {
  straight_vs_resumed<loom::precision::FP16>("resume_fp16");
}

TEST_CASE("a checkpoint holds HF's files; model.safetensors reads in Python's safetensors") {
  auto a = base_args("ckpt_files");
  a.max_steps = 6;
  torch::manual_seed(1);
  T<loom::precision::FP32> t(a, Mlp{}, data(40, 1), data(12, 2));
  t.train();
  const fs::path dir = fs::path(a.output_dir) / "checkpoint-6";
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "optimizer.json", "scheduler.json",
                        "scaler.json", "rng_state.safetensors", "trainer_state.json", "training_args.json"})
    CHECK_MESSAGE(fs::exists(dir / f), f);
  auto state = loom::TrainerState::load(dir / "trainer_state.json");
  CHECK(state.global_step == 6);
  CHECK(loom::load_json<loom::TrainingArguments>(dir / "training_args.json").max_steps == 6);
  // No temporary folder is left behind (the run's lock is held while the Trainer lives).
  for (const auto& e : fs::directory_iterator(a.output_dir)) {
    const auto name = e.path().filename().string();
    CHECK((name.rfind(".", 0) != 0 || name == ".loom.lock"));
  }

  const char* py = loom_test::python("Python safetensors check");
  if (py == nullptr) return;
  const std::string out = run_capture(std::string(py) +
                                      " -c \"import json,sys; from safetensors.torch import load_file; "
                                      "d=load_file(sys.argv[1]); print(json.dumps({k: v.double().sum().item() for k, v in d.items()}))\" " +
                                      (dir / "model.safetensors").string());
  const auto sums = nlohmann::json::parse(out);
  auto named = t.model()->named_parameters();
  CHECK(sums.size() == named.size());
  for (const auto& p : named) {
    INFO(p.key());
    REQUIRE(sums.contains(p.key()));
    CHECK(sums[p.key()].get<double>() == doctest::Approx(p.value().to(torch::kDouble).sum().item<double>()));
  }
}

TEST_CASE("rotation keeps save_total_limit checkpoints and never the best one") {
  auto a = base_args("rotation");
  a.max_steps = 10;
  a.eval_steps = 2;
  a.save_steps = 2;
  a.save_total_limit = 2;
  a.metric_for_best_model = "loss";
  a.greater_is_better = true;  // "best" = highest eval loss: an early checkpoint, so it must survive
  torch::manual_seed(2);
  T<loom::precision::FP32> t(a, Mlp{}, data(40, 1), data(12, 2));
  t.train();
  std::vector<std::string> left;
  for (const auto& p : loom::checkpoint::sorted_checkpoints(a.output_dir)) left.push_back(p.filename().string());
  REQUIRE(t.state().best_model_checkpoint.has_value());
  const std::string best = fs::path(*t.state().best_model_checkpoint).filename().string();
  CHECK(std::find(left.begin(), left.end(), best) != left.end());
  CHECK(std::find(left.begin(), left.end(), "checkpoint-10") != left.end());
  CHECK(left.size() == 2);
  CHECK(t.state().best_metric.has_value());
}

TEST_CASE("load_best_model_at_end reloads the best checkpoint's weights; save_strategy best saves on improvement") {
  auto a = base_args("best");
  a.max_steps = 8;
  a.eval_steps = 2;
  a.save_steps = 2;
  a.load_best_model_at_end = true;
  a.metric_for_best_model = "loss";
  a.greater_is_better = true;  // the worst loss is "best": the model must be rolled back
  torch::manual_seed(3);
  T<loom::precision::FP32> t(a, Mlp{}, data(40, 1), data(12, 2));
  t.train();
  REQUIRE(t.state().best_model_checkpoint.has_value());
  const fs::path best(*t.state().best_model_checkpoint);
  CHECK(best.filename() != "checkpoint-8");
  Mlp reference;
  loom::checkpoint::load_module(*reference, best / "model.safetensors");
  auto w1 = weights(t.model()), w2 = weights(reference);
  for (std::size_t i = 0; i < w1.size(); ++i) CHECK(torch::equal(w1[i], w2[i]));
  auto state = loom::TrainerState::load(fs::path(a.output_dir) / "trainer_state.json");
  CHECK(state.best_model_checkpoint == t.state().best_model_checkpoint);

  auto b = base_args("save_best");
  b.max_steps = 8;
  b.eval_steps = 2;
  b.save_strategy = "best";
  b.metric_for_best_model = "loss";
  b.greater_is_better = false;
  torch::manual_seed(3);
  T<loom::precision::FP32> u(b, Mlp{}, data(40, 1), data(12, 2));
  u.train();
  // One checkpoint per improvement of eval_loss, none otherwise.
  int improvements = 0;
  double best_loss = 1e300;
  for (const auto& e : u.state().log_history)
    if (e.contains("eval_loss") && e["eval_loss"].get<double>() < best_loss) {
      best_loss = e["eval_loss"].get<double>();
      ++improvements;
      CHECK(fs::exists(loom::checkpoint::checkpoint_dir(b.output_dir, e["step"].get<int64_t>())));
    }
  CHECK(loom::checkpoint::sorted_checkpoints(b.output_dir).size() == static_cast<std::size_t>(improvements));
}

TEST_CASE("bad checkpoints and weights stop at start-up with one loom: line") {
  auto no_eval = base_args("no_eval");
  CHECK_THROWS_WITH_AS(T<loom::precision::FP32>(no_eval, Mlp{}, data(40, 1)),
                       "loom: --eval_strategy steps needs an evaluation dataset; pass one to the Trainer or use "
                       "--eval_strategy no",
                       loom::Error);
  auto base_args = [](const std::string& name) {
    auto a = trainer_test_checkpoint_resume::base_args(name);
    a.eval_strategy = "no";
    return a;
  };
  auto a = base_args("bad_resume");
  a.resume_from_checkpoint = (fs::path(a.output_dir) / "checkpoint-99").string();
  T<loom::precision::FP32> t(a, Mlp{}, data(40, 1));
  CHECK_THROWS_WITH_AS(t.train(), doctest::Contains("loom: checkpoint folder"), loom::Error);

  a.resume_from_checkpoint = "latest";
  T<loom::precision::FP32> t2(a, Mlp{}, data(40, 1));
  CHECK_THROWS_WITH_AS(t2.train(), doctest::Contains("loom: --resume_from_checkpoint latest: no complete checkpoint"),
                       loom::Error);

  // A truncated checkpoint: the model file cut short.
  auto b = base_args("truncated");
  b.max_steps = 6;
  torch::manual_seed(1);
  {
    T<loom::precision::FP32> first(b, Mlp{}, data(40, 1));
    first.train();
  }
  const auto model = fs::path(b.output_dir) / "checkpoint-6" / "model.safetensors";
  fs::resize_file(model, fs::file_size(model) / 2);
  b.resume_from_checkpoint = "latest";
  b.max_steps = 12;
  T<loom::precision::FP32> t3(b, Mlp{}, data(40, 1));
  CHECK_THROWS_WITH_AS(t3.train(), doctest::Contains("loom: "), loom::Error);

  // save_only_model checkpoints hold no optimizer state: resuming says how to start from them.
  auto c = base_args("only_model");
  c.max_steps = 6;
  c.save_only_model = true;
  {
    T<loom::precision::FP32> first(c, Mlp{}, data(40, 1));
    first.train();
  }
  c.resume_from_checkpoint = "latest";
  c.max_steps = 12;
  T<loom::precision::FP32> t4(c, Mlp{}, data(40, 1));
  CHECK_THROWS_WITH_AS(t4.train(), doctest::Contains("cannot resume training"), loom::Error);

  // --model_name_or_path: strict names and shapes.
  auto d = base_args("from_weights");
  d.model_name_or_path = (fs::path(c.output_dir) / "checkpoint-6").string();
  T<loom::precision::FP32> ok(d, Mlp{}, data(40, 1));
  Mlp saved;
  loom::checkpoint::load_module(*saved, fs::path(*d.model_name_or_path) / "model.safetensors");
  CHECK(torch::equal(ok.model()->a->weight, saved->a->weight));
  struct OtherImpl : torch::nn::Module {
    OtherImpl() : a(register_module("a", torch::nn::Linear(6, 8))) {}
    torch::Tensor forward(const torch::Tensor& x) { return a->forward(x); }
    torch::nn::Linear a;
  };
  TORCH_MODULE(Other);
  struct OtherTrainer : loom::Trainer<OtherTrainer, Other> {
    using Trainer::Trainer;
    torch::Tensor compute_loss(Other& m, Batch& b) { return m->forward(b.x).sum(); }
  };
  CHECK_THROWS_WITH_AS(OtherTrainer(d, Other{}, data(8, 1)), doctest::Contains("does not match the model"), loom::Error);
  d.model_name_or_path = "/nonexistent/weights";
  CHECK_THROWS_WITH_AS(OtherTrainer(d, Other{}, data(8, 1)), doctest::Contains("--model_name_or_path /nonexistent/weights"),
                       loom::Error);
}

TEST_CASE("a checkpoint's state files are read strictly: each bad field is a loom: error naming file and field") {
  auto a = base_args("strict_state");
  a.eval_strategy = "no";
  a.max_steps = 6;
  torch::manual_seed(1);
  {
    T<loom::precision::FP32> first(a, Mlp{}, data(40, 1));
    first.train();
  }
  const auto ckpt = fs::path(a.output_dir) / "checkpoint-6";
  const auto pristine = fs::path(a.output_dir + "-pristine");
  fs::remove_all(pristine);
  fs::copy(ckpt, pristine, fs::copy_options::recursive);
  a.resume_from_checkpoint = ckpt.string();
  a.max_steps = 12;
  // Restores the checkpoint, applies `damage`, resumes, returns the error.
  auto resume_after = [&](auto damage) {
    fs::remove_all(ckpt);
    fs::copy(pristine, ckpt, fs::copy_options::recursive);
    damage();
    T<loom::precision::FP32> t(a, Mlp{}, data(40, 1));
    return loom_test::error_of([&] { t.train(); });
  };
  auto edit_json = [&](const std::string& file, auto change) {
    auto j = nlohmann::json::parse(loom_test::read_bytes(ckpt / file));
    change(j);
    loom_test::write_bytes(ckpt / file, j.dump(2));
  };
  auto expect = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(msg.find(part) != std::string::npos);
    CHECK(msg.rfind("loom: ", 0) == 0);
  };
  expect(resume_after([&] { edit_json("trainer_state.json", [](auto& j) { j["global_step"] = -5; }); }),
         (ckpt / "trainer_state.json").string() + ": field 'global_step' must be an integer >= 0, got -5");
  expect(resume_after([&] { edit_json("trainer_state.json", [](auto& j) { j["epoch"] = "1"; }); }),
         "trainer_state.json: field 'epoch' must be a number, got \"1\"");
  expect(resume_after([&] {
           auto text = loom_test::read_bytes(ckpt / "trainer_state.json");
           text.replace(text.find("\"global_step\""), 0, "\"global_step\": 7,\n  ");
           loom_test::write_bytes(ckpt / "trainer_state.json", text);
         }),
         "trainer_state.json: key 'global_step' appears twice in the top-level object");
  expect(resume_after([&] { edit_json("loop_state.json", [](auto& j) { j["tr_loss"] = "x"; }); }),
         (ckpt / "loop_state.json").string() + ": field 'tr_loss' must be a number, got \"x\"");
  expect(resume_after([&] { edit_json("loop_state.json", [](auto& j) { j["skipped_steps"] = 1.5; }); }),
         "loop_state.json: field 'skipped_steps' must be an integer >= 0, got 1.5");
  expect(resume_after([&] { edit_json("scheduler.json", [](auto& j) { j.erase("last_epoch"); }); }),
         (ckpt / "scheduler.json").string() + ": field 'last_epoch' is missing");
  expect(resume_after([&] { edit_json("optimizer.json", [](auto& j) { j["steps"] = -1; }); }),
         (ckpt / "optimizer.json").string() + ": field 'steps' must be an integer >= 0, got -1");
  // A moment with the right element count in another layout (transposed): not loaded flattened.
  expect(resume_after([&] {
           auto tensors = loom::checkpoint::load_safetensors(ckpt / "optimizer.safetensors");
           for (auto& [name, t] : tensors)
             if (name == "exp_avg.a.weight") t = t.t().contiguous();
           loom::checkpoint::save_safetensors(tensors, ckpt / "optimizer.safetensors");
         }),
         "the optimizer state exp_avg.a.weight has shape [6, 16] but parameter a.weight has shape [16, 6]");
  // The untouched copy still resumes.
  CHECK(resume_after([] {}) == "<no loom::Error>");
}

namespace {
// Sends this thread a real signal at the end of a chosen step.
struct RaiseAt {
  int64_t step = -1;
  int signal = SIGTERM;
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& state, loom::TrainerControl&) const {
    if (state.global_step == step) std::raise(signal);
  }
};
struct Preemptible : loom::Trainer<Preemptible, Mlp, loom::Callbacks<RaiseAt>> {
  using Trainer::Trainer;
  loom::ModelOutput compute_loss(Mlp& model, Batch& b) { return loom_test::cross_entropy(model, b); }
};
}  // namespace

TEST_CASE("resuming with another batch layout says what changed; the same layout says nothing") {
  loom::TrainingArguments a;
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = 2;
  const nlohmann::json saved = {{"per_device_train_batch_size", 8}, {"gradient_accumulation_steps", 2}, {"world_size", 2}};
  CHECK(loom::resume_warning(saved, a, 2, 40).empty());
  CHECK(loom::resume_warning({{"tr_loss", 0.0}}, a, 4, 40).empty());  // a checkpoint from before these fields
  a.per_device_train_batch_size = 4;
  CHECK(loom::resume_warning(saved, a, 4, 40) ==
        "loom: warning: resuming at step 40 with per_device_train_batch_size 4 (was 8), world size 4 (was 2): a step "
        "takes 32 examples (was 32), the position in the data is recomputed in the new steps, so the examples after "
        "the resume are not those an uninterrupted run would read, and the learning-rate schedule follows this run's "
        "length");
  a.per_device_train_batch_size = 8;
  CHECK(loom::resume_warning(saved, a, 1, 40).find("world size 1 (was 2): a step takes 16 examples (was 32)") !=
        std::string::npos);
}

TEST_CASE("SIGTERM, SIGUSR1 and SIGINT stop training after the step, saved; the resume is bitwise") {
  auto a = base_args("preempt_straight");
  a.eval_strategy = "no";
  a.save_strategy = "no";
  torch::manual_seed(1);
  Preemptible straight(a, Mlp{}, data(40, 1));
  straight.train();
  for (const int sig : {SIGTERM, SIGUSR1, SIGINT}) {
    CAPTURE(sig);
    auto b = a;
    b.output_dir = loom_test::tmp_dir("preempt_" + std::to_string(sig)).string();
    struct sigaction before {};
    REQUIRE(sigaction(sig, nullptr, &before) == 0);  // doctest's own handler, or the default
    torch::manual_seed(1);
    {
      Preemptible first(b, Mlp{}, data(40, 1));
      first.callback<RaiseAt>().step = 5;
      first.callback<RaiseAt>().signal = sig;
      try {
        first.train();
        FAIL("train() returned after the signal");
      } catch (const loom::Preempted& e) {
        CHECK(e.signal() == sig);
        CHECK(e.global_step() == 5);  // one process: it stops after the very step
        CHECK(e.checkpoint() == (fs::path(b.output_dir) / "checkpoint-5").string());
        CHECK(std::string(e.what()) == "loom: stopped by " + loom::Preempted::signal_name(sig) +
                                           " after step 5; the run is saved in " + e.checkpoint() +
                                           " (resume with --resume_from_checkpoint latest)");
      }
      CHECK(first.state().global_step == 5);
    }
    // The handlers are gone after train(): the one before is back.
    struct sigaction now {};
    REQUIRE(sigaction(sig, nullptr, &now) == 0);
    const bool restored = now.sa_handler == before.sa_handler;
    CHECK(restored);
    CHECK_NOTHROW(loom::checkpoint::validate_checkpoint(fs::path(b.output_dir) / "checkpoint-5"));
    CHECK(fs::exists(fs::path(b.output_dir) / "trainer_state.json"));
    b.resume_from_checkpoint = "latest";
    torch::manual_seed(1);
    Preemptible resumed(b, Mlp{}, data(40, 1));
    resumed.train();
    CHECK(resumed.state().global_step == 12);
    const auto w0 = weights(straight.model()), w1 = weights(resumed.model());
    for (std::size_t i = 0; i < w0.size(); ++i) CHECK(torch::equal(w0[i], w1[i]));
    CHECK(resumed.state().log_history.size() == straight.state().log_history.size());
  }
}

namespace {
struct WithEarlyStop : loom::Trainer<WithEarlyStop, Mlp, loom::Callbacks<StopAt, loom::EarlyStopping>> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(Mlp& model, Batch& b) { return torch::cross_entropy_loss(model->forward(b.x), b.labels); }
};
}  // namespace

TEST_CASE("callback state (EarlyStopping's patience counter) is checkpointed and restored on resume") {
  auto a = base_args("callback_state");
  a.learning_rate = 0.0;  // eval_loss never improves: the counter climbs by one per evaluation
  a.eval_steps = 2;
  a.save_steps = 4;
  a.max_steps = 12;
  a.metric_for_best_model = "loss";
  {
    torch::manual_seed(1);
    WithEarlyStop first(a, Mlp{}, data(40, 1), data(12, 2));
    first.callback<loom::EarlyStopping>().patience = 5;
    first.callback<StopAt>().step = 4;
    first.train();
    CHECK(first.callback<loom::EarlyStopping>().patience_counter() == 1);  // evals at 2 (best) and 4
  }
  auto state = loom::TrainerState::load(fs::path(a.output_dir) / "checkpoint-4" / "trainer_state.json");
  REQUIRE(state.stateful_callbacks.contains("EarlyStoppingCallback"));
  CHECK(state.stateful_callbacks["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"] == 1);
  {
    // HF's default: restore_callback_states_from_checkpoint false, the counter starts at 0.
    auto b = a;
    b.output_dir = loom_test::fresh_dir("callback_state_not_restored").string();
    b.resume_from_checkpoint = (fs::path(a.output_dir) / "checkpoint-4").string();
    torch::manual_seed(1);
    WithEarlyStop fresh(b, Mlp{}, data(40, 1), data(12, 2));
    fresh.callback<loom::EarlyStopping>().patience = 5;
    fresh.train();
    CHECK(fresh.callback<loom::EarlyStopping>().patience_counter() == 4);
    CHECK(fresh.state().global_step == 12);
  }
  a.resume_from_checkpoint = "latest";
  a.restore_callback_states_from_checkpoint = true;
  torch::manual_seed(1);
  WithEarlyStop resumed(a, Mlp{}, data(40, 1), data(12, 2));
  resumed.callback<loom::EarlyStopping>().patience = 5;
  resumed.train();
  // Restored at 1, then evals at 6, 8, 10, 12 -> 5 = patience: stops at step 12 exactly;
  // without the restored counter it would have reached only 4.
  CHECK(resumed.callback<loom::EarlyStopping>().patience_counter() == 5);
}

}  // namespace trainer_test_checkpoint_resume
