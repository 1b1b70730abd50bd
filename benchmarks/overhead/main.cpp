// Overhead of the loom Trainer against a hand-written libtorch loop that uses the same
// kernels (index_select batches, the same CNN, cross-entropy, _foreach_norm clipping,
// at::_fused_adamw_, a linear schedule), on Fashion-MNIST at batch 64 on the CPU.
//
// The two run interleaved in rounds (trainer block, then hand block, repeated) so drift in
// machine load hits both alike; step times are medians over every measured step. The last
// line is the figure: `trainer/handwritten step time: <ratio>`.
//
//   build/benchmarks/overhead [--steps 200] [--rounds 5] [--batch 64] [--threads 0]

#include <loom/loom.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchArguments {
  int64_t steps = 200;   ///< measured steps per block
  int64_t rounds = 5;    ///< trainer/hand-written block pairs
  int64_t batch = 64;    ///< batch size
  int64_t warmup = 20;   ///< unmeasured steps at the start of each block
  int64_t threads = 0;   ///< torch intra-op threads (0: torch's default)
  std::string data_dir = "/usr/share/datasets/fashion-mnist";  ///< Fashion-MNIST IDX folder
};

struct Batch {
  torch::Tensor images, labels;
};

// The CNN of examples/fashion_mnist.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    h = torch::max_pool2d(torch::relu(conv2->forward(h)), 2);
    return fc2->forward(torch::relu(fc1->forward(h.flatten(1))));
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

// Records the time between consecutive optimizer steps.
struct StepTimer {
  std::vector<double>* out = nullptr;
  int64_t skip = 0;
  Clock::time_point last{};
  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) { last = Clock::now(); }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&) {
    const auto now = Clock::now();
    if (s.global_step > skip) out->push_back(std::chrono::duration<double, std::micro>(now - last).count());
    last = now;
  }
};

struct BenchTrainer : loom::Trainer<BenchTrainer, Net, loom::schedule::Linear, loom::Callbacks<StepTimer>> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(Net& model, Batch& b) { return torch::cross_entropy_loss(model->forward(b.images), b.labels); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// The hand-written loop: what a libtorch user writes without loom, with the same kernels.
void hand_written(const Batch& data, int64_t steps, int64_t warmup, int64_t batch, uint64_t seed, double lr_peak,
                  std::vector<double>& times, std::vector<double>& fetch_times) {
  torch::manual_seed(seed);
  Net model;
  model->train();
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->named_parameters())
    (p.key().find("bias") == std::string::npos ? decay : no_decay).push_back(p.value());
  struct State {
    std::vector<torch::Tensor> params, m, v, step;
    double wd;
  };
  std::vector<State> groups{{decay, {}, {}, {}, 0.0}, {no_decay, {}, {}, {}, 0.0}};
  for (auto& g : groups)
    for (auto& p : g.params) {
      g.m.push_back(torch::zeros_like(p));
      g.v.push_back(torch::zeros_like(p));
      g.step.push_back(torch::zeros({}, torch::kFloat));
    }
  std::vector<torch::Tensor> all = model->parameters();
  const int64_t n = data.images.size(0);
  const int64_t per_epoch = n / batch + (n % batch ? 1 : 0);
  const int64_t total = steps + warmup;
  auto order = loom::data::seeded_permutation(n, 42, 0);
  auto running = torch::zeros({});
  for (int64_t s = 0; s < total; ++s) {
    const auto t0 = Clock::now();
    const int64_t b = s % per_epoch;
    const int64_t begin = b * batch, len = std::min(batch, n - begin);
    auto idx = order.narrow(0, begin, len);
    Batch mb{data.images.index_select(0, idx), data.labels.index_select(0, idx)};
    const auto t1 = Clock::now();
    auto loss = torch::cross_entropy_loss(model->forward(mb.images), mb.labels);
    loss.backward();
    {
      torch::NoGradGuard ng;
      running += loss.detach();
      std::vector<torch::Tensor> grads;
      for (auto& p : all) grads.push_back(p.grad());
      auto norm = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2);
      at::_foreach_mul_(grads, torch::clamp_max(1.0 / (norm + 1e-6), 1.0));
      const double lr = lr_peak * std::max(0.0, double(total - s) / double(total));
      for (auto& g : groups) {
        std::vector<torch::Tensor> ps, gs;
        for (auto& p : g.params) ps.push_back(p.detach()), gs.push_back(p.grad());
        at::_foreach_add_(g.step, 1.0);
        at::_fused_adamw_(ps, gs, g.m, g.v, {}, g.step, lr, 0.9, 0.999, g.wd, 1e-8, false, false, std::nullopt,
                          std::nullopt);
      }
      for (auto& p : all) p.mutable_grad() = torch::Tensor();
    }
    const auto t2 = Clock::now();
    if (s >= warmup) {
      times.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
      fetch_times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
  }
  (void)running.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto bench = loom::parse_args<BenchArguments>(argc, argv);
    if (bench.threads > 0) torch::set_num_threads(static_cast<int>(bench.threads));
    const std::filesystem::path dir(bench.data_dir);
    auto images = loom::data::read_idx(dir / "train-images-idx3-ubyte.gz");
    auto labels = loom::data::read_idx(dir / "train-labels-idx1-ubyte.gz");
    Batch data{((images.to(torch::kFloat) / 255.0 - 0.2860) / 0.3530).unsqueeze(1).contiguous(),
               labels.to(torch::kLong)};
    fmt::print("overhead: {} images, batch {}, {} rounds x {} steps, {} torch threads\n", data.images.size(0),
               bench.batch, bench.rounds, bench.steps, torch::get_num_threads());

    std::vector<double> trainer_times, hand_times, fetch_times;
    for (int64_t r = 0; r < bench.rounds; ++r) {
      std::vector<double> t_round, h_round, f_round;
      {
        loom::TrainingArguments args;
        args.output_dir = "output/bench_overhead";
        args.max_steps = bench.steps + bench.warmup;
        args.per_device_train_batch_size = bench.batch;
        args.learning_rate = 1e-3;
        args.weight_decay = 0.0;
        args.logging_steps = static_cast<double>(args.max_steps + 1);  // no logging sync inside the block
        args.save_strategy = "no";
        args.disable_tqdm = true;
        args.use_cpu = true;
        args.seed = 100 + r;
        BenchTrainer trainer(args, Net{}, loom::data::TensorDataset<Batch>(data));
        trainer.callback<StepTimer>().out = &t_round;
        trainer.callback<StepTimer>().skip = bench.warmup;
        trainer.train();
      }
      hand_written(data, bench.steps, bench.warmup, bench.batch, 100 + r, 1e-3, h_round, f_round);
      fmt::print("round {}: trainer {:.1f} us/step, hand-written {:.1f} us/step, ratio {:.4f}\n", r, median(t_round),
                 median(h_round), median(t_round) / median(h_round));
      trainer_times.insert(trainer_times.end(), t_round.begin(), t_round.end());
      hand_times.insert(hand_times.end(), h_round.begin(), h_round.end());
      fetch_times.insert(fetch_times.end(), f_round.begin(), f_round.end());
    }
    const double t = median(trainer_times), h = median(hand_times), f = median(fetch_times);
    fmt::print("median step: trainer {:.1f} us, hand-written {:.1f} us ({} steps each)\n", t, h, trainer_times.size());
    fmt::print("data loading (gather one batch): {:.1f} us = {:.2f}% of a hand-written step\n", f, 100.0 * f / h);
    fmt::print("trainer/handwritten step time: {:.4f}\n", t / h);
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 2;
  }
}
