#pragma once
// The training set-up shared by the tests that run a real Trainer: the batch type,
// seeded synthetic classification data, quiet arguments, the cross-entropy loss and
// accuracy metric, and a linear classifier Trainer. Inline or templates only: the unit
// tests are one executable.

#include <loom/loom.hpp>

#include "support.hpp"

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace loom_test {

/// Features and class labels.
struct Batch {
  torch::Tensor x;       ///< float [N, features]
  torch::Tensor labels;  ///< int64 [N]
};

/// `n` rows of `features` standard normal features (own generator, seeded `seed`); the
/// label is the argmax of the first three.
inline loom::data::TensorDataset<Batch> argmax_data(int64_t n, uint64_t seed, int64_t features) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, features}, gen);
  return loom::data::TensorDataset<Batch>({x, x.narrow(1, 0, 3).argmax(1)});
}

/// A 3-class problem on 4 features that a linear model separates well.
inline loom::data::TensorDataset<Batch> linear_data(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto x = torch::randn({n, 4}, gen);
  auto w = torch::tensor({{2.0f, -1.0f, 0.5f}, {-1.0f, 2.0f, 0.0f}, {0.5f, 0.5f, -2.0f}, {1.0f, 0.0f, 1.0f}});
  auto labels = x.matmul(w).argmax(1);
  return loom::data::TensorDataset<Batch>({x, labels});
}

/// Arguments writing to tmp_dir(name), on the CPU, without progress bar or checkpoints.
inline loom::TrainingArguments quiet_args(const std::string& name) {
  loom::TrainingArguments a;
  a.output_dir = tmp_dir(name).string();
  a.disable_tqdm = true;
  a.save_strategy = "no";
  a.use_cpu = true;
  return a;
}

/// quiet_args(name) for 3 steps of `batch` rows x `accumulation` micro-batches at a
/// constant `learning_rate`, logging every step: gradient accumulation against one batch.
inline loom::TrainingArguments accumulation_args(const std::string& name, int64_t batch, int64_t accumulation,
                                                 double learning_rate) {
  auto a = quiet_args(name);
  a.per_device_train_batch_size = batch;
  a.gradient_accumulation_steps = accumulation;
  a.max_steps = 3;
  a.learning_rate = learning_rate;
  a.lr_scheduler_type = "constant";
  a.logging_steps = 1;
  return a;
}

/// quiet_args(name) for `steps` steps of `batch` rows x 2 micro-batches: lr 1e-2 on a linear
/// schedule with 2 warmup steps, weight decay 0.01, clipping at 0.5 (active), logging every
/// step, seed 5. Training runs whose resumes are compared bitwise use it.
inline loom::TrainingArguments resume_args(const std::string& name, int64_t batch, int64_t steps) {
  auto a = quiet_args(name);
  a.per_device_train_batch_size = batch;
  a.gradient_accumulation_steps = 2;
  a.max_steps = steps;
  a.learning_rate = 1e-2;
  a.lr_scheduler_type = "linear";
  a.warmup_steps = 2;
  a.weight_decay = 0.01;
  a.max_grad_norm = 0.5;
  a.logging_steps = 1;
  a.seed = 5;
  return a;
}

/// Detached copies of `model`'s parameters, in order.
template <class Model>
std::vector<torch::Tensor> weights(Model& model) {
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

/// Cross-entropy of model(b.x) against b.labels, with the logits as predictions.
template <class Model, class B>
loom::ModelOutput cross_entropy(Model& model, const B& b) {
  auto logits = model->forward(b.x);
  return {torch::cross_entropy_loss(logits, b.labels), logits};
}

/// {"accuracy": share of rows whose argmax is the label}.
inline loom::Metrics accuracy(const loom::EvalPrediction& p) {
  return {{"accuracy", p.predictions.argmax(1).eq(p.label_ids).to(torch::kDouble).mean().item<double>()}};
}

/// Stops training at the end of optimizer step `step` (-1: never): an interrupted run.
struct StopAt {
  int64_t step = -1;
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl& c) const {
    if (s.global_step == step) c.should_training_stop = true;
  }
};

/// Linear(6, 16) -> tanh -> Linear(16, 3), for argmax_data(n, seed, 6).
struct Mlp6Impl : torch::nn::Module {
  Mlp6Impl() : a(register_module("a", torch::nn::Linear(6, 16))), b(register_module("b", torch::nn::Linear(16, 3))) {}
  torch::Tensor forward(const torch::Tensor& x) { return b->forward(torch::tanh(a->forward(x))); }
  torch::nn::Linear a, b;
};
TORCH_MODULE(Mlp6);

/// An Mlp6 with the same initial weights every call (seed 11).
inline Mlp6 fresh_mlp6() {
  torch::manual_seed(11);
  return Mlp6();
}

/// A Trainer of Mlp6 on Batch with the cross-entropy loss, with `Policies`.
template <class... Policies>
struct Mlp6Trainer : loom::Trainer<Mlp6Trainer<Policies...>, Mlp6, Policies...> {
  using Base = loom::Trainer<Mlp6Trainer<Policies...>, Mlp6, Policies...>;
  using Base::Base;
  torch::Tensor compute_loss(Mlp6& model, Batch& b) { return torch::cross_entropy_loss(model->forward(b.x), b.labels); }
};

/// The training losses of `s`'s log history, in order.
inline std::vector<double> losses_of(const loom::TrainerState& s) {
  std::vector<double> out;
  for (const auto& e : s.log_history)
    if (e.contains("loss")) out.push_back(e.at("loss").get<double>());
  return out;
}

/// A linear classifier Trainer on Batch with `Policies`, reporting accuracy.
template <class... Policies>
struct Classifier : loom::Trainer<Classifier<Policies...>, torch::nn::Linear, Policies...> {
  using Base = loom::Trainer<Classifier<Policies...>, torch::nn::Linear, Policies...>;
  using Base::Base;
  loom::ModelOutput compute_loss(torch::nn::Linear& model, Batch& b) { return cross_entropy(model, b); }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return accuracy(p); }
};

/// The same Linear(4, 3) every call (seed 11).
inline torch::nn::Linear fresh_model() {
  torch::manual_seed(11);
  return torch::nn::Linear(4, 3);
}

// --full_determinism changes process-wide state (torch's deterministic flags and the CUDA /
// cuBLAS variables), as HF's does: a test that turns it on holds one of these, which puts back
// what the other tests of the process run with, also when the test stops early.
class DeterminismRestore {
 public:
  DeterminismRestore()
      : algorithms_(ctx().deterministicAlgorithms()),
        warn_only_(ctx().deterministicAlgorithmsWarnOnly()),
        cudnn_(ctx().deterministicCuDNN()),
        benchmark_(ctx().benchmarkCuDNN()) {
    for (const char* n : kNames) env_.push_back(std::getenv(n) ? std::optional<std::string>(std::getenv(n)) : std::nullopt);
  }
  DeterminismRestore(const DeterminismRestore&) = delete;
  DeterminismRestore& operator=(const DeterminismRestore&) = delete;
  ~DeterminismRestore() {
    ctx().setDeterministicAlgorithms(algorithms_, warn_only_);
    ctx().setDeterministicCuDNN(cudnn_);
    ctx().setBenchmarkCuDNN(benchmark_);
    for (std::size_t i = 0; i < env_.size(); ++i)
      if (env_[i]) ::setenv(kNames[i], env_[i]->c_str(), 1);
      else ::unsetenv(kNames[i]);
  }

 private:
  static at::Context& ctx() { return at::globalContext(); }
  static constexpr const char* kNames[] = {"CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG",
                                           "FLASH_ATTENTION_DETERMINISTIC"};
  bool algorithms_, warn_only_, cudnn_, benchmark_;
  std::vector<std::optional<std::string>> env_;
};

}  // namespace loom_test
