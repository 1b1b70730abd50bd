// Overhead of the loom Trainer against a hand-written libtorch loop that uses the same
// kernels (index_select batches, the same CNN, cross-entropy, _foreach_norm clipping,
// at::_fused_adamw_, a linear schedule), on Fashion-MNIST at batch 64 on the CPU.
//
// Both start from the same weights and read the same batches in the same order, so they run
// the same kernels on the same values (each round prints both mean losses). The two run
// interleaved step by step (each Trainer step is followed by one hand-written step, run from
// on_step_end), in rounds of fresh models, so drift in machine load hits both alike. The last line is the figure: `trainer/handwritten step
// time: <ratio>`, the median over all steps of (trainer step / the hand-written step run
// right after it).
//
//   build/benchmarks/overhead [--steps 200] [--rounds 5] [--batch 64] [--threads 0] [--count_ops]

#include <loom/loom.hpp>

#include <fmt/format.h>

#include <ATen/record_function.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
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
  bool count_ops = false;  ///< count the ATen ops of each loop's steps (RecordFunction) and list what the Trainer adds; the timings then include the counting
};

// Where the ATen ops recorded now are counted (--count_ops): the Trainer's map, or the
// hand-written loop's while its step runs inside on_step_end.
std::map<std::string, int64_t>* g_ops = nullptr;
// The time spent inside top-level ATen ops, in the same loop's account (--count_ops).
double* g_op_us = nullptr;
std::map<std::string, double>* g_op_time = nullptr;  // the same per top-level op name
thread_local int g_depth = 0;
thread_local Clock::time_point g_op_start{};
thread_local std::string g_op_name;

struct Batch {
  torch::Tensor images, labels;
};

// Minor page faults of this thread so far: a step that maps fresh memory pays for each page
// inside the kernels' time.
double minor_faults() {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  return static_cast<double>(u.ru_minflt);
}

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

// The hand-written loop: what a libtorch user writes without loom, with the same kernels.
// One call of step() is one optimizer step; it times itself.
class HandLoop {
 public:
  // Starts from a copy of `start`'s weights and draws the batches in the order the Trainer's
  // sampler draws them under `seed`, so both loops run the same kernels on the same values (the
  // max-pool kernel's time depends on the values it compares).
  HandLoop(const Batch& data, int64_t batch, int64_t seed, int64_t total_steps, double lr_peak, Net& start)
      : data_(data), batch_(batch), total_(total_steps), lr_peak_(lr_peak) {
    model_ = Net();
    {
      torch::NoGradGuard ng;
      auto from = start->named_parameters();
      for (auto& p : model_->named_parameters()) p.value().copy_(from[p.key()]);
    }
    model_->train();
    for (const auto& p : model_->named_parameters())
      (p.key().find("bias") == std::string::npos ? groups_[0] : groups_[1]).params.push_back(p.value());
    for (auto& g : groups_)
      for (auto& p : g.params) {
        g.m.push_back(torch::zeros_like(p));
        g.v.push_back(torch::zeros_like(p));
        g.step.push_back(torch::zeros({}, torch::kFloat));
      }
    all_ = model_->parameters();
    order_ = loom::data::seeded_permutation(data_.images.size(0), seed, 0);
    running_ = torch::zeros({});
  }

  /// The mean loss of the steps taken.
  [[nodiscard]] double mean_loss() const { return running_.item<double>() / static_cast<double>(s_); }

  /// One step; returns (step, gather) times in microseconds.
  std::pair<double, double> step() {
    const auto t0 = Clock::now();
    const int64_t n = data_.images.size(0);
    const int64_t per_epoch = n / batch_ + (n % batch_ ? 1 : 0);
    const int64_t begin = (s_ % per_epoch) * batch_, len = std::min(batch_, n - begin);
    auto idx = order_.narrow(0, begin, len);
    Batch mb{data_.images.index_select(0, idx), data_.labels.index_select(0, idx)};
    const auto t1 = Clock::now();
    auto loss = torch::cross_entropy_loss(model_->forward(mb.images), mb.labels);
    loss.backward();
    {
      torch::NoGradGuard ng;
      running_ += loss.detach();
      std::vector<torch::Tensor> grads;
      for (auto& p : all_) grads.push_back(p.grad());
      auto norm = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2);
      at::_foreach_mul_(grads, torch::clamp_max(1.0 / (norm + 1e-6), 1.0));
      const double lr = lr_peak_ * std::max(0.0, double(total_ - s_) / double(total_));
      for (auto& g : groups_) {
        std::vector<torch::Tensor> ps, gs;
        for (auto& p : g.params) ps.push_back(p.detach()), gs.push_back(p.grad());
        at::_foreach_add_(g.step, 1.0);
        at::_fused_adamw_(ps, gs, g.m, g.v, {}, g.step, lr, 0.9, 0.999, 0.0, 1e-8, false, false, std::nullopt,
                          std::nullopt);
      }
      for (auto& p : all_) p.mutable_grad() = torch::Tensor();
    }
    ++s_;
    const auto t2 = Clock::now();
    return {std::chrono::duration<double, std::micro>(t2 - t0).count(),
            std::chrono::duration<double, std::micro>(t1 - t0).count()};
  }

 private:
  struct Group {
    std::vector<torch::Tensor> params, m, v, step;
  };
  Batch data_;
  int64_t batch_, total_, s_ = 0;
  double lr_peak_;
  Net model_{nullptr};
  Group groups_[2];
  std::vector<torch::Tensor> all_;
  torch::Tensor order_, running_;
};

// Interleaves the two loops step by step: after each Trainer step it runs one hand-written
// step, so both see the same machine conditions. Trainer step time = time between two
// on_step_end calls, minus the hand-written step run inside the callback.
struct Interleave {
  HandLoop* hand = nullptr;
  int64_t skip = 0;
  std::vector<double> trainer, handwritten, gather;
  std::vector<double> trainer_faults, hand_faults;  // minor page faults per measured step
  Clock::time_point last{};
  double last_faults = 0;
  bool count_ops = false;
  std::map<std::string, int64_t> trainer_ops, hand_ops;  // --count_ops, over the measured steps
  double trainer_op_us = 0, hand_op_us = 0;               // time inside top-level ATen ops
  std::map<std::string, double> trainer_op_time, hand_op_time;  // ... per op
  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    last = Clock::now();
    last_faults = minor_faults();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState& s, loom::TrainerControl&) {
    const double t = std::chrono::duration<double, std::micro>(Clock::now() - last).count();
    const double f0 = minor_faults();
    const bool measured = s.global_step > skip;
    if (count_ops)
      g_ops = measured ? &hand_ops : nullptr, g_op_us = measured ? &hand_op_us : nullptr,
      g_op_time = measured ? &hand_op_time : nullptr;
    const auto [h, g] = hand->step();
    const double f1 = minor_faults();
    if (count_ops)
      g_ops = s.global_step >= skip ? &trainer_ops : nullptr,
      g_op_us = s.global_step >= skip ? &trainer_op_us : nullptr,
      g_op_time = s.global_step >= skip ? &trainer_op_time : nullptr;
    if (s.global_step > skip) {
      trainer.push_back(t);
      handwritten.push_back(h);
      gather.push_back(g);
      trainer_faults.push_back(f0 - last_faults);
      hand_faults.push_back(f1 - f0);
    }
    last_faults = minor_faults();
    last = Clock::now();
  }
};

struct BenchTrainer : loom::Trainer<BenchTrainer, Net, loom::schedule::Linear, loom::Callbacks<Interleave>> {
  using Trainer::Trainer;
  torch::Tensor compute_loss(Net& model, Batch& b) { return torch::cross_entropy_loss(model->forward(b.images), b.labels); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
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
    double trainer_faults = 0, hand_faults = 0;
    std::map<std::string, int64_t> trainer_ops, hand_ops;
    double trainer_op_us = 0, hand_op_us = 0;
    std::map<std::string, double> trainer_op_time, hand_op_time;
    std::optional<at::CallbackHandle> counter;
    if (bench.count_ops)
      counter = at::addGlobalCallback(
          at::RecordFunctionCallback(
              [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                if (g_ops != nullptr) ++(*g_ops)[fn.name()];
                if (g_depth++ == 0) {
                  g_op_start = Clock::now();
                  g_op_name = fn.name();
                }
                return nullptr;
              },
              [](const at::RecordFunction&, at::ObserverContext*) {
                if (--g_depth != 0 || g_op_us == nullptr) return;
                const double us = std::chrono::duration<double, std::micro>(Clock::now() - g_op_start).count();
                *g_op_us += us;
                (*g_op_time)[g_op_name] += us;
              })
              .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
    for (int64_t r = 0; r < bench.rounds; ++r) {
      loom::TrainingArguments args;
      args.output_dir = "output/bench_overhead";
      args.max_steps = bench.steps + bench.warmup;
      args.per_device_train_batch_size = bench.batch;
      args.learning_rate = 1e-3;
      args.weight_decay = 0.0;
      args.logging_steps = static_cast<double>(args.max_steps + 1);  // no logging sync inside the run
      args.save_strategy = "no";
      args.disable_tqdm = true;
      args.use_cpu = true;
      args.seed = 100 + r;
      torch::manual_seed(static_cast<uint64_t>(args.seed));
      BenchTrainer trainer(args, Net{}, loom::data::TensorDataset<Batch>(data));
      HandLoop hand(data, bench.batch, args.seed, args.max_steps, args.learning_rate, trainer.model());
      auto& probe = trainer.callback<Interleave>();
      probe.hand = &hand;
      probe.skip = bench.warmup;
      probe.count_ops = bench.count_ops;
      const double trainer_loss = trainer.train().training_loss;
      g_ops = nullptr;
      g_op_us = nullptr;
      g_op_time = nullptr;
      for (const auto& [name, us] : probe.trainer_op_time) trainer_op_time[name] += us;
      for (const auto& [name, us] : probe.hand_op_time) hand_op_time[name] += us;
      trainer_op_us += probe.trainer_op_us;
      hand_op_us += probe.hand_op_us;
      for (const auto& [name, n] : probe.trainer_ops) trainer_ops[name] += n;
      for (const auto& [name, n] : probe.hand_ops) hand_ops[name] += n;
      fmt::print("round {}: trainer {:.1f} us/step, hand-written {:.1f} us/step, ratio {:.4f}; mean loss trainer {:.6f}, "
                 "hand-written {:.6f}\n", r, median(probe.trainer), median(probe.handwritten),
                 median(probe.trainer) / median(probe.handwritten), trainer_loss, hand.mean_loss());
      trainer_times.insert(trainer_times.end(), probe.trainer.begin(), probe.trainer.end());
      hand_times.insert(hand_times.end(), probe.handwritten.begin(), probe.handwritten.end());
      fetch_times.insert(fetch_times.end(), probe.gather.begin(), probe.gather.end());
      trainer_faults = std::accumulate(probe.trainer_faults.begin(), probe.trainer_faults.end(), trainer_faults);
      hand_faults = std::accumulate(probe.hand_faults.begin(), probe.hand_faults.end(), hand_faults);
    }
    const double t = median(trainer_times), h = median(hand_times), f = median(fetch_times);
    // Each trainer step and the hand-written step right after it ran under the same machine
    // conditions: the median of their ratios cancels drift between rounds.
    std::vector<double> paired;
    for (std::size_t i = 0; i < trainer_times.size(); ++i) paired.push_back(trainer_times[i] / hand_times[i]);
    fmt::print("median step: trainer {:.1f} us, hand-written {:.1f} us ({} steps each)\n", t, h, trainer_times.size());
    fmt::print("data loading (gather one batch): {:.1f} us = {:.2f}% of a hand-written step\n", f, 100.0 * f / h);
    fmt::print("ratio of pooled medians: {:.4f}\n", t / h);
    fmt::print("minor page faults per step: trainer {:.1f}, hand-written {:.1f}\n",
               trainer_faults / static_cast<double>(trainer_times.size()),
               hand_faults / static_cast<double>(hand_times.size()));
    fmt::print("trainer/handwritten step time: {:.4f}\n", median(paired));
    if (counter) {
      at::removeCallback(*counter);
      // Per measured step: every op whose count differs between the loops.
      const double steps = static_cast<double>(trainer_times.size());
      double trainer_total = 0, hand_total = 0;
      for (const auto& [name, n] : trainer_ops) trainer_total += static_cast<double>(n) / steps;
      for (const auto& [name, n] : hand_ops) hand_total += static_cast<double>(n) / steps;
      fmt::print("time inside ATen ops per step: trainer {:.1f} us, hand-written {:.1f} us; outside them: trainer {:.1f} "
                 "us, hand-written {:.1f} us\n", trainer_op_us / steps, hand_op_us / steps,
                 std::accumulate(trainer_times.begin(), trainer_times.end(), 0.0) / steps - trainer_op_us / steps,
                 std::accumulate(hand_times.begin(), hand_times.end(), 0.0) / steps - hand_op_us / steps);
      std::vector<std::pair<double, std::string>> slower;
      for (const auto& [name, us] : trainer_op_time) slower.emplace_back(us / steps - hand_op_time[name] / steps, name);
      std::sort(slower.rbegin(), slower.rend());
      fmt::print("top-level ops the Trainer spends more time in (us per step, trainer - hand-written):\n");
      for (std::size_t i = 0; i < std::min<std::size_t>(6, slower.size()); ++i)
        fmt::print("  {:<40} {:+8.1f}  (trainer {:.1f})\n", slower[i].second, slower[i].first,
                   trainer_op_time[slower[i].second] / steps);
      fmt::print("ATen ops per step: trainer {:.1f}, hand-written {:.1f}; the ops whose counts differ:\n", trainer_total,
                 hand_total);
      std::map<std::string, int64_t> names = trainer_ops;
      names.insert(hand_ops.begin(), hand_ops.end());
      for (const auto& [name, unused] : names) {
        const double a = static_cast<double>(trainer_ops[name]) / steps, b = static_cast<double>(hand_ops[name]) / steps;
        if (std::abs(a - b) >= 0.01) fmt::print("  {:<40} trainer {:6.2f}  hand-written {:6.2f}\n", name, a, b);
      }
    }
    return 0;
  });
}
