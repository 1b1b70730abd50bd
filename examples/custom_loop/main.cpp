// A training loop written by hand on loom's parts (loom::Accelerator), for what the Trainer's
// loop cannot express: two tasks with two batch types, alternating optimizer steps. One
// network learns Fashion-MNIST's classes and, as a self-supervised auxiliary task, by how many
// quarter turns an image was rotated; even steps train the first task, odd steps the second.
//
//   build/examples/custom_loop --max_steps 200
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/custom_loop \
//       --sharding zero2 --bf16 --max_steps 200 --save_strategy steps --save_steps 100
//   ... --resume_from_checkpoint latest          # goes on from the last checkpoint
//
// Everything a Trainer step does is here, in the open: this rank's batches, accumulation
// (gradients communicated once per step), autocast and loss scaling, global-norm clipping,
// the optimizer and scheduler step, the evaluation gathered in batch order, and checkpoints
// in the Trainer's format (--resume_from_checkpoint works across the two). docs/api.md,
// "Your own loop", maps each call to Accelerate's.

// The parts a hand-written loop uses, without the Trainer (trainer/trainer.hpp): this program
// neither needs it nor rebuilds when it changes.
#include <loom/config/reflect.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/idx.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/optim/optimizer.hpp>
#include <loom/schedule/from_args.hpp>
#include <loom/accelerate/accelerator.hpp>
#include <loom/trainer/run_files.hpp>
#include <loom/trainer/run_main.hpp>
#include <loom/trainer/selector.hpp>

#include "../common/fashion_mnist_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

/// The classification task's batch.
struct ClassBatch {
  torch::Tensor images;  ///< float32 [N, 1, 28, 28]
  torch::Tensor labels;  ///< int64 [N], the class
};

/// The rotation task's batch: images turned by `turns` quarter turns.
struct RotationBatch {
  torch::Tensor images;  ///< float32 [N, 1, 28, 28]
  torch::Tensor turns;   ///< int64 [N], 0..3
};

/// A shared convolutional trunk and one head per task. The blocks are FullShard units, so
/// --sharding full_shard gathers each only around its own forward and backward.
struct TwoHeadNetImpl : torch::nn::Module {
  template <class M>
  using Unit = loom::dist::FullShardUnit<M>;
  TwoHeadNetImpl()
      : conv1(register_module("conv1", Unit<torch::nn::Conv2d>(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1))))),
        conv2(register_module("conv2", Unit<torch::nn::Conv2d>(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1))))),
        fc(register_module("fc", Unit<torch::nn::Linear>(torch::nn::Linear(32 * 7 * 7, 128)))),
        classes(register_module("classes", torch::nn::Linear(128, 10))),
        rotation(register_module("rotation", torch::nn::Linear(128, 4))) {}

  torch::Tensor features(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    h = torch::max_pool2d(torch::relu(conv2->forward(h)), 2);
    return torch::relu(fc->forward(h.flatten(1)));
  }
  torch::Tensor classify(const torch::Tensor& x) { return classes->forward(features(x)); }
  torch::Tensor turns(const torch::Tensor& x) { return rotation->forward(features(x)); }

  Unit<torch::nn::Conv2d> conv1, conv2;
  Unit<torch::nn::Linear> fc;
  torch::nn::Linear classes, rotation;
};
TORCH_MODULE(TwoHeadNet);

// Image i turned by i % 4 quarter turns.
static loom::data::TensorDataset<RotationBatch> rotated(const torch::Tensor& images) {
  const auto turns = torch::arange(images.size(0), torch::kLong).remainder(4);
  auto out = images.clone();
  for (int64_t k = 1; k < 4; ++k) {
    const auto rows = turns.eq(k).nonzero().squeeze(1);
    out.index_copy_(0, rows, torch::rot90(images.index_select(0, rows), k, {2, 3}));
  }
  return loom::data::TensorDataset<RotationBatch>({out.contiguous(), turns});
}

// One task: its loader and how its batches become a loss.
template <class Batch, class Loss>
struct Task {
  loom::data::DataLoader<Batch> loader;
  Loss loss;  // (model, batch) -> {loss, logits, targets}
  int64_t updates_per_epoch(int64_t ga) const { return (loader.size() + ga - 1) / ga; }
};

struct LossOut {
  torch::Tensor loss, logits, targets;
};

// The k-th optimizer step of `task`: its accumulation group of this epoch's batches (the epoch
// and position follow from k alone, so a resumed run reads exactly the batches it would have).
// Returns the group's loss on this rank (weighted by its share of the items), on the device.
template <class Acc, class T>
torch::Tensor train_step(Acc& acc, TwoHeadNet& model, T& task, int64_t k) {
  const int64_t ga = acc.args().gradient_accumulation_steps;
  const int64_t per_epoch = task.updates_per_epoch(ga);
  task.loader.set_epoch(k / per_epoch);
  const int64_t first = (k % per_epoch) * ga, count = std::min(ga, task.loader.size() - first);
  using Batch = std::decay_t<decltype(task.loader.batch(0))>;
  std::vector<Batch> group;
  int64_t items = 0;
  for (int64_t i = 0; i < count; ++i) {
    group.push_back(task.loader.batch(first + i));
    items += loom::data::batch_rows(group.back());
    loom::data::to_device(group.back(), acc.device());
  }
  acc.begin_accumulation(items);  // each rank's gradient weighted by its share of the items
  torch::Tensor total = torch::zeros({}, torch::TensorOptions().device(acc.device()));
  for (int64_t i = 0; i < count; ++i) {
    acc.begin_micro_step(i + 1 == count);  // gradients communicated after the last micro-batch
    torch::Tensor loss;
    {
      auto autocast = acc.autocast();
      loss = task.loss(model, group[static_cast<std::size_t>(i)]).loss.to(torch::kFloat);
    }
    loss = loss * (static_cast<double>(loom::data::batch_rows(group[static_cast<std::size_t>(i)])) /
                   static_cast<double>(items));
    acc.backward(loss);  // scaled under fp16
    acc.end_micro_step();
    total = total + (acc.item_factor().defined() ? loss.detach() * acc.item_factor() : loss.detach());
  }
  return total;
}

// Accuracy of `task` on `data`: this rank's batches, gathered back in batch order.
template <class Acc, class Batch, class Loss>
double accuracy(Acc& acc, TwoHeadNet& model, const loom::data::AnyDataset<Batch>& data, const Loss& loss_of) {
  auto loader = acc.prepare_eval_loader(data);
  loader.set_epoch(0);
  model->eval();
  torch::NoGradGuard no_grad;
  acc.begin_evaluation();
  int64_t right = 0, rows = 0;
  for (const auto b : acc.eval_batches(loader.size())) {
    torch::Tensor predicted, targets;
    if (b || acc.forward_is_collective()) {  // FullShard: every rank joins every forward
      auto batch = loader.batch(b.value_or(0));
      loom::data::to_device(batch, acc.device());
      auto autocast = acc.autocast();
      auto out = loss_of(model, batch);
      if (b) {
        predicted = out.logits.argmax(1);
        targets = out.targets;
      }
    }
    const auto all_predicted = acc.gather_for_metrics(predicted), all_targets = acc.gather_for_metrics(targets);
    if (all_predicted.defined()) {
      right += all_predicted.eq(all_targets).sum().template item<int64_t>();
      rows += all_predicted.size(0);
    }
  }
  acc.end_evaluation();
  model->train();
  return rows > 0 ? static_cast<double>(right) / static_cast<double>(rows) : 0.0;
}

void run(const loom::TrainingArguments& args, const fashion_mnist::DataArguments& opts) {
  // The sharding and precision --sharding and --bf16 / --fp16 name, chosen as the run starts.
  loom::Accelerator<loom::sharding::FromArgs, loom::precision::FromArgs> acc(args);  // joins the job, seeds the generators
  const std::filesystem::path dir(opts.data_dir);
  const auto [train_images, train_labels] = fashion_mnist::load_split(dir, "train", opts.max_train_samples);
  const auto [test_images, test_labels] = fashion_mnist::load_split(dir, "t10k", opts.max_eval_samples);
  const loom::data::AnyDataset<ClassBatch> class_train(loom::data::TensorDataset<ClassBatch>({train_images, train_labels}));
  const loom::data::AnyDataset<ClassBatch> class_test(loom::data::TensorDataset<ClassBatch>({test_images, test_labels}));
  const loom::data::AnyDataset<RotationBatch> turn_train(rotated(train_images)), turn_test(rotated(test_images));
  if (acc.is_main_process())
    fmt::print("custom_loop: {} training and {} test images, {} process(es), {} / {}\n", train_images.size(0),
               test_images.size(0), acc.num_processes(), acc.sharding_facts().name, acc.precision_facts().name);

  TwoHeadNet model;
  acc.prepare_model(model);
  const auto class_loss = [](TwoHeadNet& m, const ClassBatch& b) {
    auto logits = m->classify(b.images);
    return LossOut{torch::cross_entropy_loss(logits, b.labels), logits, b.labels};
  };
  const auto turn_loss = [](TwoHeadNet& m, const RotationBatch& b) {
    auto logits = m->turns(b.images);
    return LossOut{torch::cross_entropy_loss(logits, b.turns), logits, b.turns};
  };
  Task<ClassBatch, decltype(class_loss)> classify{acc.prepare_train_loader(class_train), class_loss};
  Task<RotationBatch, decltype(turn_loss)> turn{acc.prepare_train_loader(turn_train), turn_loss};

  // Without --max_steps: --num_train_epochs over the classification data, as many steps again
  // for the rotation task.
  const int64_t ga = args.gradient_accumulation_steps;
  const int64_t max_steps =
      args.max_steps > 0 ? args.max_steps
                         : 2 * static_cast<int64_t>(std::ceil(args.num_train_epochs *
                                                              static_cast<double>(classify.updates_per_epoch(ga))));
  loom::schedule::LRScheduler<loom::schedule::FromArgs> scheduler(loom::schedule::make_schedule_params(args, max_steps),
                                                                  args.lr_scheduler_type);
  acc.prepare_optimizer(loom::optim::make_optimizer(args, *model), scheduler);
  auto& state = acc.state();
  state.max_steps = max_steps;
  state.logging_steps = args.logging_steps > 0 ? static_cast<int64_t>(args.logging_steps) : 500;
  state.save_steps = args.save_steps > 0 ? static_cast<int64_t>(args.save_steps) : 500;
  state.train_batch_size = args.per_device_train_batch_size;
  if (auto from = acc.load_state(); from && acc.is_main_process())
    fmt::print("custom_loop: resumed from {} at step {}\n", from->string(), state.global_step);

  model->train();
  // Each task's losses since the last log, on the device: summed over ranks (one collective,
  // one host read) only when logged.
  torch::Tensor window[2] = {torch::zeros({}, torch::TensorOptions().device(acc.device())),
                             torch::zeros({}, torch::TensorOptions().device(acc.device()))};
  while (state.global_step < max_steps) {
    const int64_t s = state.global_step, task = s % 2, k = s / 2;  // even: classes, odd: rotation
    window[task] += task == 0 ? train_step(acc, model, classify, k) : train_step(acc, model, turn, k);
    const auto grad_norm = acc.clip_grad_norm(args.max_grad_norm);
    const double lr = acc.step();  // optimizer, scheduler, zero_grad (an fp16 overflow skips both)
    state.global_step += 1;
    state.epoch = static_cast<double>(k + 1) / static_cast<double>(classify.updates_per_epoch(ga));
    if (state.global_step % state.logging_steps == 0) {
      const double half = static_cast<double>(state.logging_steps) / 2.0;
      const double class_loss_mean = acc.reduce_sum(window[0]).template item<double>() / half;
      const double turn_loss_mean = acc.reduce_sum(window[1]).template item<double>() / half;
      state.append_log({{"classification_loss", class_loss_mean}, {"rotation_loss", turn_loss_mean},
                        {"grad_norm", grad_norm.template item<double>()}, {"learning_rate", lr}});
      if (acc.is_main_process() && !args.disable_tqdm)
        fmt::print("step {}: classification loss {:.4f}, rotation loss {:.4f}, lr {:.3g}\n", state.global_step,
                   class_loss_mean, turn_loss_mean, lr);
      window[0].zero_();
      window[1].zero_();
    }
    if (args.save_strategy == "steps" && state.global_step % state.save_steps == 0) (void)acc.save_state();
  }

  const loom::Metrics results{{"eval_accuracy", accuracy(acc, model, class_test, class_loss)},
                              {"eval_rotation_accuracy", accuracy(acc, model, turn_test, turn_loss)}};
  state.append_log(results);
  acc.save_model(args.output_dir);  // model.safetensors (gathered), training_args.json
  if (acc.is_main_process()) {
    state.save(std::filesystem::path(args.output_dir) / "trainer_state.json");
    loom::detail::save_metrics(args.output_dir, "eval", results);
    fmt::print("custom_loop: step {}, eval_accuracy {:.4f}, eval_rotation_accuracy {:.4f}\n", state.global_step,
               results.get("eval_accuracy").value(), results.get("eval_rotation_accuracy").value());
  }
}

int main(int argc, char** argv) {
  return loom::run_main([&] {
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/custom_loop";
    defaults.learning_rate = 1e-3;
    defaults.per_device_train_batch_size = 64;
    defaults.per_device_eval_batch_size = 256;
    defaults.logging_steps = 50;
    defaults.save_strategy = "no";
    defaults.max_steps = 400;
    auto [opts, args] = loom::parse_args(argc, argv, fashion_mnist::DataArguments{}, defaults);
    loom::check(args.logging_steps >= 2 && static_cast<int64_t>(args.logging_steps) % 2 == 0,
                "custom_loop alternates two tasks: --logging_steps must be an even number of steps, got {}",
                args.logging_steps);
    run(args, opts);
    return 0;
  });
}
