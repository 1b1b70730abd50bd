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
//
// With --loss_tokens N it trains nothing and measures the LM loss alone, transformers' way
// (every position's float32 logits) against the chunked one (--chunked_lm_loss): the peak
// tensor bytes and time of one forward and backward each (benchmarks/sft/run.py reports them).

#include <loom/loom.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <nlohmann/json.hpp>

#include "../common/counting_allocator.hpp"
#include "../common/step_clock.hpp"

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace {

/// Flags of this program, beside LoraArguments and TrainingArguments.
struct BenchArguments {
  std::string data_file;    ///< safetensors with input_ids and labels, int64 [rows, seq] (run.py writes it)
  std::string result_file;  ///< where the figures go (JSON)
  int64_t threads = 1;      ///< torch intra-op threads
  int64_t loss_tokens = 0;  ///< > 0: no training; the LM loss alone over this many scored positions, unchunked and chunked (benchmarks/sft/run.py)
  int64_t loss_vocab = 128256;        ///< --loss_tokens: the vocabulary (Llama 3's)
  int64_t loss_hidden = 256;          ///< --loss_tokens: the hidden size
  int64_t loss_rounds = 2;            ///< --loss_tokens: timed rounds of the two, interleaved
  bool loss_trainable_head = false;   ///< --loss_tokens: the head's weight trains too (full fine-tuning; LoRA freezes it)
};

/// The step clock and the memory high-water marks, from on_train_begin to on_train_end.
struct Probe {
  bench::CountingAllocator* counting = nullptr;
  bench::StepClock clock;  ///< one lap per optimizer step
  int64_t live_at_begin = 0, peak_tensor_bytes = 0, rss_at_begin = 0, peak_rss_delta = 0;

  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM back to the current RSS
    rss_at_begin = loom::cpu_rss_bytes();
    counting->reset_peak();
    live_at_begin = counting->live();
    clock.start();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    clock.lap();
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

/// --loss_tokens: one forward and backward of the LM loss over `loss_tokens` scored positions
/// (hidden states [tokens, hidden] that require a gradient, a head [vocab, hidden]), computed
/// as transformers does (every position's float32 logits, then the cross-entropy) and chunked
/// (models::linear_cross_entropy), in rounds that alternate their order. Per way: the most CPU
/// tensor bytes alive at once above those alive before it (its inputs), and its wall time.
nlohmann::json measure_loss(const BenchArguments& bench, bench::CountingAllocator& counting) {
  torch::manual_seed(0);
  const auto hidden = torch::randn({bench.loss_tokens, bench.loss_hidden}).requires_grad_();
  const auto weight = (torch::randn({bench.loss_vocab, bench.loss_hidden}) * 0.02).requires_grad_(bench.loss_trainable_head);
  const auto targets = torch::randint(0, bench.loss_vocab, {bench.loss_tokens});
  // transformers' ForCausalLMLoss after its shift: the float32 logits, then the cross-entropy.
  const auto unchunked = [&] {
    return torch::nn::functional::cross_entropy(loom::models::lm_head_logits(hidden, weight, false).to(torch::kFloat),
                                                targets);
  };
  const auto chunked = [&] { return loom::models::linear_cross_entropy(hidden, weight, targets, false); };
  nlohmann::json out{{"tokens", bench.loss_tokens}, {"vocab", bench.loss_vocab}, {"hidden", bench.loss_hidden},
                     {"trainable_head", bench.loss_trainable_head}};
  std::map<std::string, torch::Tensor> d_hidden;
  for (int64_t round = 0; round < bench.loss_rounds; ++round) {
    for (int way = 0; way < 2; ++way) {
      const bool is_chunked = (way == 1) != (round % 2 == 1);
      const std::string name = is_chunked ? "chunked" : "unchunked";
      hidden.mutable_grad() = torch::Tensor();
      weight.mutable_grad() = torch::Tensor();
      const int64_t before = counting.live();
      counting.reset_peak();
      const auto start = std::chrono::steady_clock::now();
      const auto loss = is_chunked ? chunked() : unchunked();
      loss.backward();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      out[name + "_peak_bytes"].push_back(counting.peak() - before);
      out[name + "_seconds"].push_back(seconds);
      out[name + "_loss"] = loss.item<double>();
      d_hidden[name] = hidden.grad().clone();
    }
  }
  out["d_hidden_relative_difference"] = ((d_hidden["chunked"] - d_hidden["unchunked"]).abs().max() /
                                         d_hidden["unchunked"].abs().max())
                                            .item<double>();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto& counting = bench::CountingAllocator::install();  // before any tensor it should count
    auto [bench, lora, args] =
        loom::parse_args(argc, argv, BenchArguments{}, loom::peft::LoraArguments{}, loom::TrainingArguments{});
    loom::check(bench.threads > 0, "--threads must be positive, got {}", bench.threads);
    if (bench.loss_tokens > 0) {
      loom::check(!bench.result_file.empty() && bench.loss_vocab > 0 && bench.loss_hidden > 0 && bench.loss_rounds > 0,
                  "--loss_tokens needs --result_file and positive --loss_vocab, --loss_hidden and --loss_rounds");
      torch::set_num_threads(static_cast<int>(bench.threads));
      std::ofstream out(bench.result_file);
      loom::check(static_cast<bool>(out), "cannot write --result_file {}", bench.result_file);
      out << measure_loss(bench, counting).dump() << "\n";
      return 0;
    }
    loom::check(args.model_name_or_path.has_value(), "lora needs --model_name_or_path (an HF Llama folder)");
    loom::check(!bench.data_file.empty() && !bench.result_file.empty(), "lora needs --data_file and --result_file");
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
                          {"step_end", probe.clock.ends},
                          {"step_cpu_end", probe.clock.cpu_ends},
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
