// benchmarks/eval_memory: peak memory of evaluate() on a causal LM as the evaluation set grows,
// keeping the full logits, keeping their argmax (preprocess_logits_for_metrics), or keeping
// nothing (--batch_eval_metrics), on the CPU.
//
//   build/benchmarks/eval_memory                        # GPT-2, 2 layers, n_embd 64, vocab 50257
//   build/benchmarks/eval_memory --sizes 16,32 --block 16
//
// GPT-2's vocabulary of 50,257 makes a batch's logits [batch, block, 50257] floats (25.7 MB for
// 4 x 32): kept for compute_metrics, they grow with the set; their argmax is [batch, block]
// ids. The model is small and random (few layers, small n_embd), so the logits dominate.
// Every (mode, size) runs in a process of its own (the program starts itself once per
// configuration, so no run inherits another's heap), with one intra-op thread unless
// --threads says otherwise. Peak memory is read two ways during evaluate():
//   * tensor bytes: a counting wrapper around the CPU allocator (benchmarks/common) records
//     the most bytes of CPU tensors alive at once, above those alive when evaluate() began
//     (the model, the data), exactly: no allocator slack;
//   * process RSS: HF's eval_mem_cpu_peaked_delta + eval_mem_cpu_alloc_delta (the kernel's
//     high-water mark, VmHWM, above its value when evaluate() began; loom's MemoryTracker).
//     glibc serves blocks below its mmap threshold from its heap, and raises that threshold
//     to the size of each mmapped block freed (up to 32 MB), so a 25.7 MB logits block, once
//     freed, comes back from the heap, which fragments and keeps freed pages resident: RSS
//     then varies from run to run and can grow with the set where the live tensors do not
//     (docs/building.md). The threshold is fixed at --mmap_threshold_mb (mallopt) so that RSS
//     follows the live blocks; 0 keeps glibc's dynamic default.
// The metric columns are the same in every mode, each computed from what that mode kept:
// HF run_clm's accuracy (the prediction at t against the token at t + 1; near 0 for a random
// model) and the mean predicted id over those tokens.

#include <loom/loom.hpp>
#include <loom/models/gpt2.hpp>

#include <fmt/format.h>

#include "../common/counting_allocator.hpp"
#include "../common/gpt2_run.hpp"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct BenchArguments {
  int64_t layers = 2;                ///< GPT-2 blocks
  int64_t n_embd = 64;               ///< hidden size (one head of 64)
  int64_t vocab = 50257;             ///< GPT-2's vocabulary
  int64_t block = 32;                ///< tokens per sequence
  int64_t batch = 4;                 ///< sequences per evaluation batch
  std::string sizes = "16,32,64,128";  ///< evaluation set sizes (sequences), comma-separated
  int64_t threads = 1;               ///< torch intra-op threads
  int64_t mmap_threshold_mb = 1;     ///< glibc's mmap threshold (mallopt M_MMAP_THRESHOLD); 0: glibc's dynamic default
  std::string mode = "";             ///< (internal) run one mode, full, argmax or batched, in this process
  int64_t examples = 0;              ///< (internal) ... on this many sequences
  std::string result = "";           ///< (internal) where that run writes its figures
};

// HF run_clm's accuracy, counted per call: compute_metrics(prediction, compute_result) serves
// the whole-set call (once, compute_result true) and --batch_eval_metrics (once per batch).
struct LmTrainer : loom::Trainer<LmTrainer, loom::models::GPT2LMHeadModel> {
  using Trainer::Trainer;
  double correct = 0, total = 0, id_sum = 0;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p, bool compute_result) {
    const auto ids = p.predictions.dim() == 3 ? p.predictions.argmax(-1) : p.predictions;
    const auto pred = ids.narrow(1, 0, ids.size(1) - 1);
    const auto labels = p.label_ids.narrow(1, 1, p.label_ids.size(1) - 1);
    const auto mask = labels.ne(-100);
    correct += pred.eq(labels).logical_and(mask).sum().item<double>();
    total += mask.sum().item<double>();
    id_sum += pred.masked_select(mask).to(torch::kDouble).sum().item<double>();
    if (!compute_result) return {};
    return {{"accuracy", correct / total}, {"mean_predicted_id", id_sum / total}};
  }
};

// One configuration in this process: writes "tensor_peak rss_peak accuracy mean_id seconds" to b.result.
void run_mode(const BenchArguments& b, loom::TrainingArguments args) {
  if (b.mmap_threshold_mb > 0) mallopt(M_MMAP_THRESHOLD, static_cast<int>(b.mmap_threshold_mb << 20));
  auto& counting = bench::CountingAllocator::install();
  at::set_num_threads(static_cast<int>(b.threads));
  const auto c = bench::gpt2_config(b.vocab, b.block, b.n_embd, b.layers);
  torch::manual_seed(1);
  loom::models::GPT2LMHeadModel model(c);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const auto ids = torch::randint(c.vocab_size, {b.examples, b.block}, gen);
  args.batch_eval_metrics = b.mode == "batched";
  LmTrainer trainer(args, model, loom::no_train_dataset,
                    loom::data::TensorDataset<loom::data::CausalLMBatch>({ids, ids}));
  if (b.mode == "argmax")
    trainer.set_preprocess_logits_for_metrics(
        [](const torch::Tensor& logits, const torch::Tensor&) { return logits.argmax(-1); });
  counting.reset_peak();
  const int64_t before = counting.live();
  const auto m = trainer.evaluate();
  const double rss = m.get("eval_mem_cpu_peaked_delta").value_or(0) + m.get("eval_mem_cpu_alloc_delta").value_or(0);
  std::ofstream(b.result) << counting.peak() - before << ' ' << rss << ' ' << m.get("eval_accuracy").value_or(-1)
                          << ' ' << m.get("eval_mean_predicted_id").value_or(-1) << ' '
                          << m.get("eval_runtime").value_or(0) << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    loom::TrainingArguments defaults;
    defaults.use_cpu = true;
    defaults.disable_tqdm = true;
    defaults.save_strategy = "no";
    defaults.skip_memory_metrics = false;
    defaults.output_dir = "output/bench_eval_memory";
    auto [b, args] = loom::parse_args(argc, argv, BenchArguments{}, defaults);
    args.per_device_eval_batch_size = b.batch;
    if (!b.mode.empty()) {
      run_mode(b, args);
      return 0;
    }
    std::vector<int64_t> sizes;
    for (const auto& s : loom::detail::split_list(b.sizes)) sizes.push_back(std::stoll(s));
    const double logits_mb = static_cast<double>(b.batch * b.block * b.vocab * 4) / 1e6;
    fmt::print("GPT-2: {} layers, n_embd {}, vocab {}, block {}, eval batch {} (logits {:.1f} MB a batch), {} thread(s), "
               "mmap threshold {}\n",
               b.layers, b.n_embd, b.vocab, b.block, b.batch, logits_mb, b.threads,
               b.mmap_threshold_mb > 0 ? fmt::format("{} MB", b.mmap_threshold_mb) : std::string("glibc's"));
    fmt::print("{:<8} {:>9} {:>16} {:>16} {:>10} {:>10} {:>9}\n", "mode", "examples", "peak tensors MB", "peak RSS MB",
               "accuracy", "mean id", "seconds");
    std::filesystem::create_directories(args.output_dir);
    for (const std::string mode : {"full", "argmax", "batched"}) {
      for (const int64_t n : sizes) {
        const auto f = bench::run_in_own_process(argc, argv, fmt::format("--mode {} --examples {}", mode, n),
                                                 fmt::format("{}/{}_{}.txt", args.output_dir, mode, n), 5,
                                                 fmt::format("{} on {} examples", mode, n));
        fmt::print("{:<8} {:>9} {:>16.1f} {:>16.1f} {:>10.6f} {:>10.2f} {:>9.2f}\n", mode, n, f[0] / 1e6, f[1] / 1e6,
                   f[2], f[3], f[4]);
      }
    }
    return 0;
  });
}
