// --dataloader_num_workers on a dataset whose reads cost CPU time: the Trainer's training
// time with 0, 1 and 2 worker threads, the settings interleaved round by round so machine
// load hits each alike. The dataset stands for a decoding or augmenting pipeline: each
// example's features are computed on read (`--read_us` of arithmetic per batch, measured
// once at start-up and printed), then an MLP trains on them with one torch thread.
//
//   build/benchmarks/dataloader [--steps 150] [--rounds 3] [--read_us 3000] [--hidden 512]
//
// The last line is the figure: the median training time per setting and the speed-up of
// each against 0 workers.

#include <loom/loom.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <span>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct BenchArguments {
  int64_t steps = 150;     ///< optimizer steps per run
  int64_t rounds = 3;      ///< runs of each setting, interleaved
  int64_t batch = 32;      ///< rows per batch
  int64_t features = 256;  ///< input width
  int64_t hidden = 512;    ///< MLP width
  double read_us = 3000;   ///< CPU time one batch read should cost, in microseconds
};

struct Batch {
  torch::Tensor x, labels;
};

// Rows computed on read: `rounds_per_row` passes of a recurrence per row, the cost of a decoder.
struct CostlyDataset {
  int64_t n = 4096, features = 256, rounds_per_row = 1;
  [[nodiscard]] int64_t size() const { return n; }
  [[nodiscard]] Batch get_batch(std::span<const int64_t> idx) const {
    auto x = torch::empty({static_cast<int64_t>(idx.size()), features});
    auto labels = torch::empty({static_cast<int64_t>(idx.size())}, torch::kLong);
    float* px = x.data_ptr<float>();
    int64_t* pl = labels.data_ptr<int64_t>();
    for (std::size_t r = 0; r < idx.size(); ++r) {
      double v = static_cast<double>(idx[r] % 997) / 997.0;
      for (int64_t k = 0; k < rounds_per_row; ++k) v = std::fmod(3.9 * v * (1.0 - v) + 1e-3, 1.0);
      for (int64_t f = 0; f < features; ++f) px[r * features + f] = static_cast<float>(std::sin(v * (f + 1)));
      pl[r] = idx[r] % 10;
    }
    return {x, labels};
  }
};

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t hidden)
      : a(register_module("a", torch::nn::Linear(in, hidden))), b(register_module("b", torch::nn::Linear(hidden, hidden))),
        c(register_module("c", torch::nn::Linear(hidden, 10))) {}
  torch::Tensor forward(const torch::Tensor& x) { return c->forward(torch::relu(b->forward(torch::relu(a->forward(x))))); }
  torch::nn::Linear a, b, c;
};
TORCH_MODULE(Mlp);

struct BenchTrainer : loom::Trainer<BenchTrainer, Mlp> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(Mlp& model, Batch& batch) { return torch::cross_entropy_loss(model->forward(batch.x), batch.labels); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto bench = loom::parse_args<BenchArguments>(argc, argv);
    at::set_num_threads(1);
    // Calibrate the read cost: rounds_per_row such that one batch read takes about read_us.
    CostlyDataset data{.n = 4096, .features = bench.features, .rounds_per_row = 100000};
    std::vector<int64_t> idx(static_cast<std::size_t>(bench.batch));
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
    auto t0 = Clock::now();
    (void)data.get_batch(idx);
    const double us_per_100k = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    data.rounds_per_row = std::max<int64_t>(1, static_cast<int64_t>(1e5 * bench.read_us / us_per_100k));
    t0 = Clock::now();
    for (int i = 0; i < 5; ++i) (void)data.get_batch(idx);
    const double read_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / 5;
    fmt::print("one batch read: {:.2f} ms ({} rows of {} features); torch intra-op threads: 1\n", read_ms, bench.batch,
               bench.features);

    std::map<int64_t, std::vector<double>> seconds;
    const std::vector<int64_t> settings{0, 1, 2};
    for (int64_t round = 0; round < bench.rounds; ++round)
      for (int64_t workers : settings) {
        loom::TrainingArguments args;
        args.output_dir = "/tmp/loom_bench_dataloader";
        args.disable_tqdm = true;
        args.save_strategy = "no";
        args.logging_strategy = "no";
        args.use_cpu = true;
        args.max_steps = bench.steps;
        args.per_device_train_batch_size = bench.batch;
        args.learning_rate = 1e-3;
        args.dataloader_num_workers = workers;
        torch::manual_seed(1);
        BenchTrainer trainer(args, Mlp(bench.features, bench.hidden), data);
        const auto start = Clock::now();
        trainer.train();
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        seconds[workers].push_back(s);
        fmt::print("round {} workers {}: {:.2f} s ({:.2f} ms/step)\n", round, workers, s, 1e3 * s / bench.steps);
      }
    const double base = median(seconds[0]);
    for (int64_t workers : settings)
      fmt::print("dataloader_num_workers {}: median {:.2f} s, {:.2f} ms/step, speed-up x{:.2f}\n", workers,
                 median(seconds[workers]), 1e3 * median(seconds[workers]) / bench.steps, base / median(seconds[workers]));
    return 0;
  });
}
