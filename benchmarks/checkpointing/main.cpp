// benchmarks/checkpointing: peak memory and step time of GPT-2 trained by the Trainer with and
// without --gradient_checkpointing (activation recomputation of every block), on the CPU.
//
//   build/benchmarks/checkpointing                        # 8 layers, n_embd 256, block 512, batch 8
//   build/benchmarks/checkpointing --layers 4 --steps 3
//
// Peak memory is read two ways, each run in a process of its own (the program starts itself
// once per mode, so neither run inherits the other's heap):
//   * tensor bytes: a counting wrapper around the CPU allocator (installed before the model
//     exists) records the most bytes of CPU tensors alive at once during train(): parameters,
//     gradients, AdamW state, and the activations autograd keeps between forward and backward,
//     which is what recomputation removes. It counts requested bytes, exactly, with no allocator
//     slack and no libtorch code pages;
//   * process RSS: HF's train_mem_cpu_peaked_delta + train_mem_cpu_alloc_delta (the kernel's
//     high-water mark, VmHWM, above its value when train() began; loom's MemoryTracker).
// Step time: the median of the steps after the first (a callback timing on_step_begin to
// on_step_end), with one intra-op thread unless --threads says otherwise.

#include <loom/loom.hpp>
#include <loom/models/gpt2.hpp>

#include <fmt/format.h>

#include "../common/counting_allocator.hpp"
#include "../common/gpt2_run.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct BenchArguments {
  int64_t layers = 8;       ///< GPT-2 blocks
  int64_t n_embd = 256;     ///< hidden size (n_embd / 64 heads)
  int64_t block = 512;      ///< tokens per sequence
  int64_t batch = 8;        ///< sequences per step
  int64_t vocab = 2048;     ///< vocabulary (small, so the logits do not hide the blocks' activations)
  int64_t steps = 4;        ///< optimizer steps per mode (the first is not timed)
  int64_t threads = 1;      ///< torch intra-op threads
  std::string mode = "";    ///< (internal) run one mode, plain or recompute, in this process
  std::string result = "";  ///< (internal) where that run writes its figures
};

// Times each optimizer step.
struct StepTimer {
  std::chrono::steady_clock::time_point begin;
  std::vector<double> ms;
  void on_step_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    begin = std::chrono::steady_clock::now();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - begin).count());
  }
};

struct GptTrainer : loom::Trainer<GptTrainer, loom::models::GPT2LMHeadModel, loom::Callbacks<StepTimer>> {
  using Trainer::Trainer;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One mode in this process: writes "tensor_peak rss_peak step_ms loss" to b.result.
void run_mode(const BenchArguments& b, loom::TrainingArguments args) {
  auto& counting = bench::CountingAllocator::install();
  at::set_num_threads(static_cast<int>(b.threads));
  const auto c = bench::gpt2_config(b.vocab, b.block, b.n_embd, b.layers);
  torch::manual_seed(1);
  loom::models::GPT2LMHeadModel model(c);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const auto ids = torch::randint(c.vocab_size, {b.batch * b.steps, b.block}, gen);
  args.gradient_checkpointing = b.mode == "recompute";
  GptTrainer trainer(args, model, loom::data::TensorDataset<loom::data::CausalLMBatch>({ids, ids}));
  counting.reset_peak();
  const auto out = trainer.train();
  const auto& times = trainer.callback<StepTimer>().ms;
  const double rss = out.metrics.get("train_mem_cpu_peaked_delta").value_or(0) +
                     out.metrics.get("train_mem_cpu_alloc_delta").value_or(0);
  std::ofstream(b.result) << counting.peak() << ' ' << rss << ' '
                          << median(std::vector<double>(times.begin() + (times.size() > 1 ? 1 : 0), times.end()))
                          << ' ' << out.training_loss << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    loom::TrainingArguments defaults;
    defaults.use_cpu = true;
    defaults.disable_tqdm = true;
    defaults.save_strategy = "no";
    defaults.logging_steps = 1000;
    defaults.learning_rate = 1e-4;
    defaults.skip_memory_metrics = false;
    defaults.output_dir = "output/bench_checkpointing";
    auto [b, args] = loom::parse_args(argc, argv, BenchArguments{}, defaults);
    args.max_steps = b.steps;
    args.per_device_train_batch_size = b.batch;
    if (!b.mode.empty()) {
      run_mode(b, args);
      return 0;
    }
    fmt::print("GPT-2: {} layers, n_embd {}, block {}, batch {}, vocab {}; {} steps per mode, {} thread(s)\n", b.layers,
               b.n_embd, b.block, b.batch, b.vocab, b.steps, b.threads);
    fmt::print("{:<10} {:>16} {:>16} {:>12} {:>10}\n", "mode", "peak tensors MB", "peak RSS MB", "step ms", "loss");
    double first[4] = {0, 0, 0, 0};
    for (const std::string mode : {"plain", "recompute"}) {
      std::filesystem::create_directories(args.output_dir);
      const auto f = bench::run_in_own_process(argc, argv, "--mode " + mode, args.output_dir + "/" + mode + ".txt", 4, mode);
      fmt::print("{:<10} {:>16.1f} {:>16.1f} {:>12.1f} {:>10.6f}\n", mode, f[0] / 1e6, f[1] / 1e6, f[2], f[3]);
      if (mode == "plain") std::copy(f.begin(), f.end(), first);
      else
        fmt::print("recompute/plain: tensors {:.3f}, RSS {:.3f}, step time {:.3f}\n", f[0] / first[0], f[1] / first[1],
                   f[2] / first[2]);
    }
    return 0;
  });
}
