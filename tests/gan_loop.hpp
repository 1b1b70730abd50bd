#pragma once
// A small GAN trained by a hand-written loop on loom::Accelerator with two optimizers: the
// generator's (prepare_optimizer, index 0: AdamW at a linear schedule with warmup) and the
// discriminator's (add_optimizer, index 1: AdamW at a cosine schedule, its own peak lr). Each
// step trains the discriminator on a batch of real points and as many generated ones, then the
// generator against it. tests/trainer/test_multi_optimizer.cpp runs it in one process, the
// dist worker's --loop gan at 2 ranks; both resume it from its checkpoints.

#include <loom/loom.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "trainer_support.hpp"

namespace loom_test {

inline constexpr int64_t kGanNoise = 4;

/// generator: noise [N, 4] -> points [N, 2]; discriminator: points -> a logit [N, 1].
struct GanImpl : torch::nn::Module {
  GanImpl()
      : generator(register_module("generator", torch::nn::Sequential(torch::nn::Linear(kGanNoise, 16), torch::nn::Tanh(),
                                                                     torch::nn::Linear(16, 2)))),
        discriminator(register_module("discriminator", torch::nn::Sequential(torch::nn::Linear(2, 16), torch::nn::Tanh(),
                                                                             torch::nn::Linear(16, 1)))) {}
  torch::nn::Sequential generator, discriminator;
};
TORCH_MODULE(Gan);

inline Gan fresh_gan(uint64_t seed = 7) {
  torch::manual_seed(seed);
  return Gan();
}

/// The "real" points: 40 draws of a Gaussian around (2, -1) (labels unused).
inline loom::data::TensorDataset<Batch> gan_data() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto x = torch::randn({40, 2}, gen) * 0.5 + torch::tensor({2.0f, -1.0f});
  return loom::data::TensorDataset<Batch>({x, torch::zeros({40}, torch::kLong)});
}

/// The run's arguments (the generator's optimizer and schedule): 5 batches of 8 per epoch, 6 steps.
inline void set_gan_args(loom::TrainingArguments& a) {
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = 1;
  a.max_steps = 6;
  a.learning_rate = 1e-3;
  a.lr_scheduler_type = "linear";
  a.warmup_steps = 2;
  a.weight_decay = 0.01;
  a.max_grad_norm = 1.0;
  a.seed = 5;
}
/// What the discriminator's optimizer and schedule read instead: its own peak lr, cosine.
inline void set_discriminator_args(loom::TrainingArguments& a) {
  a.learning_rate = 2e-3;
  a.lr_scheduler_type = "cosine";
  a.warmup_steps = 0;
}

/// Each step's losses (averaged over ranks) and learning rates.
struct GanRun {
  std::vector<double> d_losses, g_losses, d_lrs, g_lrs;
};

/// Trains `model` for --max_steps (resuming from --resume_from_checkpoint when given; saving
/// every --save_steps under --save_strategy steps). The schedulers live in this call: after it
/// the Accelerator's optimizers may be read, not stepped.
template <class Acc>
GanRun gan_train(Acc& acc, Gan& model) {
  const auto& args = acc.args();
  acc.prepare_model(model);
  auto loader = acc.prepare_train_loader(loom::data::AnyDataset<Batch>(gan_data()));
  const auto plan = loom::TrainingPlan::make(args, loader.size(), loader.num_examples(), acc.num_processes());
  loom::schedule::LRScheduler<loom::schedule::Linear> g_sched(loom::schedule::make_schedule_params(args, plan.max_steps));
  acc.prepare_optimizer(loom::optim::make_optimizer(args, *model->generator), g_sched);
  auto d_args = args;
  set_discriminator_args(d_args);
  loom::schedule::LRScheduler<loom::schedule::Cosine> d_sched(loom::schedule::make_schedule_params(d_args, plan.max_steps));
  const std::size_t d = acc.add_optimizer(loom::optim::make_optimizer(d_args, *model->discriminator), d_sched);
  auto& state = acc.state();
  state = plan.initial_state(args, acc.is_main_process(), acc.is_local_main_process());
  int64_t first_epoch = 0, first_batch = 0;
  if (acc.load_state()) {
    first_epoch = state.global_step / plan.updates_per_epoch;
    first_batch = state.global_step % plan.updates_per_epoch;
  }
  model->train();
  auto bce = [](const torch::Tensor& logits, double target) {
    return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, target));
  };
  auto mean_over_ranks = [&acc](const torch::Tensor& loss) {
    return acc.reduce_sum(loss.detach().to(torch::kDouble)).template item<double>() / acc.num_processes();
  };
  GanRun run;
  for (int64_t epoch = first_epoch; epoch < plan.num_epochs && state.global_step < plan.max_steps; ++epoch) {
    loader.set_epoch(epoch);
    for (int64_t b = epoch == first_epoch ? first_batch : 0; b < loader.size() && state.global_step < plan.max_steps; ++b) {
      auto batch = loader.batch(b);
      loom::data::to_device(batch, acc.device());
      const int64_t rows = batch.x.size(0);
      // The discriminator: real points are 1, generated ones 0 (the generator not trained here).
      // Every forward comes after begin_micro_step (FullShard gathers the parameters there).
      acc.begin_accumulation(rows);
      acc.begin_micro_step(true);
      torch::Tensor fake;
      {
        torch::NoGradGuard no_grad;
        fake = model->generator->forward(torch::randn({rows, kGanNoise}).to(acc.device()));
      }
      torch::Tensor d_loss;
      {
        auto autocast = acc.autocast();
        const auto logits = model->discriminator->forward(torch::cat({batch.x, fake}));
        d_loss = bce(logits.narrow(0, 0, rows), 1.0) + bce(logits.narrow(0, rows, rows), 0.0);
      }
      acc.backward(d_loss.to(torch::kFloat));
      acc.end_micro_step();
      acc.clip_grad_norm(args.max_grad_norm, d);
      run.d_lrs.push_back(acc.step(d));  // then every gradient is zeroed
      run.d_losses.push_back(mean_over_ranks(d_loss));
      // The generator: its points should pass for real.
      const auto z = torch::randn({rows, kGanNoise}).to(acc.device());
      acc.begin_accumulation(rows);
      acc.begin_micro_step(true);
      torch::Tensor g_loss;
      {
        auto autocast = acc.autocast();
        g_loss = bce(model->discriminator->forward(model->generator->forward(z)), 1.0);
      }
      acc.backward(g_loss.to(torch::kFloat));
      acc.end_micro_step();
      acc.clip_grad_norm(args.max_grad_norm, 0);
      run.g_lrs.push_back(acc.step(0));
      run.g_losses.push_back(mean_over_ranks(g_loss));
      state.global_step += 1;
      state.epoch = static_cast<double>(epoch) + static_cast<double>(b + 1) / static_cast<double>(loader.size());
      if (args.save_strategy == "steps" && state.global_step % state.save_steps == 0) (void)acc.save_state();
    }
  }
  return run;
}

}  // namespace loom_test
