// loom's side of the LoRA benchmark (benchmarks/lora/run.py runs it against transformers.Trainer
// + PEFT and reports): a Llama from an HF folder, fully fine-tuned or with a LoRA adapter
// (the --use_peft / --lora_* flags, or --lora_adapter: a PEFT adapter folder to start from),
// trained by loom's Trainer (NoShard, FP32) on the token rows of --data_file. What it
// measures goes to --result_file (JSON):
//   * step_end, step_cpu_end: seconds from on_train_begin to each on_step_end, on the wall clock
//     and in the process's CPU time (which machine load inflates less);
//   * trainable / total parameters;
//   * state bytes after the first optimizer step: parameters, gradients, optimizer state
//     (trainer.model_state_bytes(): each tensor's nbytes);
//   * peak_tensor_bytes: the most bytes of CPU tensors alive at once between on_train_begin and
//     on_train_end, counted by bench::CountingAllocator (installed before the model is read);
//   * peak_rss_delta: VmHWM at on_train_end above VmRSS at on_train_begin, the high-water mark
//     reset there through /proc/self/clear_refs.
//
//   build/benchmarks/lora --model_name_or_path init/ --data_file data.safetensors
//       --result_file loom.json --threads 1 [--lora_adapter adapter/] [TrainingArguments flags...]

#include <loom/loom.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <nlohmann/json.hpp>

#include "../common/counting_allocator.hpp"

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace {

/// Flags of this program, beside LoraArguments and TrainingArguments.
struct BenchArguments {
  std::string data_file;    ///< safetensors with input_ids and labels, int64 [rows, seq] (run.py writes it)
  std::string result_file;  ///< where the figures go (JSON)
  int64_t threads = 1;      ///< torch intra-op threads
};

using Clock = std::chrono::steady_clock;

/// CPU time of this process, all threads (Python's time.process_time()).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// The step clock and the memory high-water marks, from on_train_begin to on_train_end.
struct Probe {
  bench::CountingAllocator* counting = nullptr;
  Clock::time_point start;
  double cpu_start = 0;
  std::vector<double> ends, cpu_ends;  ///< one per optimizer step
  int64_t live_at_begin = 0, peak_tensor_bytes = 0, rss_at_begin = 0, peak_rss_delta = 0;

  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM back to the current RSS
    rss_at_begin = loom::cpu_rss_bytes();
    counting->reset_peak();
    live_at_begin = counting->live();
    start = Clock::now();
    cpu_start = cpu_seconds();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    ends.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    cpu_ends.push_back(cpu_seconds() - cpu_start);
  }
  void on_train_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    peak_tensor_bytes = counting->peak();
    peak_rss_delta = loom::detail::proc_status_bytes("VmHWM").value_or(0) - rss_at_begin;
  }
};

using Model = loom::models::LlamaForCausalLM;
struct BenchTrainer : loom::Trainer<BenchTrainer, Model, loom::Callbacks<Probe>> {
  using Trainer::Trainer;
};

/// input_ids and labels of `file` as a dataset of causal-LM rows.
loom::data::TensorDataset<loom::data::CausalLMBatch> read_rows(const std::string& file) {
  torch::Tensor ids, labels;
  for (auto& [name, t] : loom::checkpoint::load_safetensors(file)) {
    if (name == "input_ids") ids = t;
    if (name == "labels") labels = t;
  }
  loom::check(ids.defined() && labels.defined(), "--data_file {} must hold input_ids and labels", file);
  return loom::data::TensorDataset<loom::data::CausalLMBatch>({ids, labels});
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto& counting = bench::CountingAllocator::install();  // before any tensor it should count
    auto [bench, lora, args] =
        loom::parse_args(argc, argv, BenchArguments{}, loom::peft::LoraArguments{}, loom::TrainingArguments{});
    loom::check(args.model_name_or_path.has_value(), "lora needs --model_name_or_path (an HF Llama folder)");
    loom::check(!bench.data_file.empty() && !bench.result_file.empty(), "lora needs --data_file and --result_file");
    loom::check(bench.threads > 0, "--threads must be positive, got {}", bench.threads);
    loom::validate(args);
    loom::finalize(args);
    torch::set_num_threads(static_cast<int>(bench.threads));
    loom::set_seed(args.seed);
    auto model = Model::from_pretrained(*args.model_name_or_path);
    args.model_name_or_path.reset();  // read above; the Trainer must not read it again
    const auto adapter = loom::peft::prepare_lora(*model, lora, "llama");
    int64_t trainable = 0, total = 0;
    for (const auto& p : model->parameters()) {
      total += p.numel();
      if (p.requires_grad()) trainable += p.numel();
    }
    BenchTrainer trainer(args, model, read_rows(bench.data_file));
    trainer.callback<Probe>().counting = &counting;
    const auto result = trainer.train();
    const auto& probe = trainer.callback<Probe>();
    const auto& state = trainer.model_state_bytes();
    std::ofstream out(bench.result_file);
    loom::check(static_cast<bool>(out), "cannot write --result_file {}", bench.result_file);
    out << nlohmann::json{{"side", "loom"},
                          {"lora", adapter.has_value()},
                          {"step_end", probe.ends},
                          {"step_cpu_end", probe.cpu_ends},
                          {"train_loss", result.training_loss},
                          {"trainable_params", trainable},
                          {"total_params", total},
                          {"param_bytes", state.params},
                          {"grad_bytes", state.grads},
                          {"optimizer_bytes", state.optimizer},
                          {"live_at_begin", probe.live_at_begin},
                          {"peak_tensor_bytes", probe.peak_tensor_bytes},
                          {"peak_rss_delta", probe.peak_rss_delta},
                          {"threads", torch::get_num_threads()}}
               .dump()
        << "\n";
    return 0;
  });
}
