// loom's side of the DPO benchmark (benchmarks/dpo/run.py runs it against TRL's DPOTrainer and
// reports): a Llama from an HF folder with a PEFT adapter to start from (--lora_adapter), trained
// by loom's DPOTrainer (NoShard, FP32) on the preference pairs of --data_file, the reference as
// --reference says:
//   adapter_off  the base with the adapter off (DPOTrainer's choice for an adapted policy)
//   copy         a second model read from the same folder (a ReferenceModel)
//   precompute   the reference's log-probabilities computed once before training
// What it measures goes to --result_file (JSON):
//   * step_end, step_cpu_end: seconds from on_train_begin to each on_step_end, on the wall clock
//     and in the process's CPU time;
//   * live_at_begin: bytes of CPU tensors alive at on_train_begin (the models, the reference's
//     copy or its precomputed log-probabilities, the optimizer's state not yet);
//   * peak_tensor_bytes: the most bytes of CPU tensors alive at once between on_train_begin and
//     on_train_end, counted by bench::CountingAllocator (installed before the model is read);
//   * peak_rss: VmHWM at on_train_end (the process's high-water mark, set-up included).
//
//   build/benchmarks/dpo --model_name_or_path init/ --lora_adapter adapter/ --data_file pairs.safetensors
//       --result_file loom.json --reference adapter_off [TrainingArguments and DPOArguments flags...]

#include <loom/loom.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/metrics/memory.hpp>
#include <loom/methods/dpo.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora.hpp>

#include <nlohmann/json.hpp>

#include "../common/counting_allocator.hpp"
#include "../common/step_clock.hpp"

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace {

/// Flags of this program, beside TrainingArguments and DPOArguments.
struct BenchArguments {
  std::string data_file;             ///< safetensors with the pairs' chosen_* / rejected_* tensors (run.py writes it)
  std::string result_file;           ///< where the figures go (JSON)
  std::string lora_adapter;          ///< a PEFT adapter folder to start from (the policy)
  std::string reference = "adapter_off";  ///< adapter_off, copy or precompute
  int64_t threads = 1;               ///< torch intra-op threads
};

/// The step clock and the memory marks, from on_train_begin to on_train_end.
struct Probe {
  bench::CountingAllocator* counting = nullptr;
  bench::StepClock clock;  ///< one lap per optimizer step
  int64_t live_at_begin = 0, peak_tensor_bytes = 0, peak_rss = 0;

  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    counting->reset_peak();
    live_at_begin = counting->live();
    clock.start();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    clock.lap();
  }
  void on_train_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    peak_tensor_bytes = counting->peak();
    peak_rss = loom::detail::proc_status_bytes("VmHWM").value_or(0);
  }
};

using Model = loom::models::LlamaForCausalLM;
using Pairs = loom::data::TensorDataset<loom::data::PreferenceBatch>;

Pairs read_pairs(const std::string& file) {
  loom::data::PreferenceBatch b;
  for (auto& [name, t] : loom::checkpoint::load_safetensors(file)) {
    if (name == "chosen_input_ids") b.chosen_input_ids = t;
    if (name == "chosen_attention_mask") b.chosen_attention_mask = t;
    if (name == "chosen_labels") b.chosen_labels = t;
    if (name == "rejected_input_ids") b.rejected_input_ids = t;
    if (name == "rejected_attention_mask") b.rejected_attention_mask = t;
    if (name == "rejected_labels") b.rejected_labels = t;
  }
  loom::check(b.chosen_input_ids.defined() && b.chosen_labels.defined() && b.rejected_input_ids.defined() &&
                  b.rejected_labels.defined(),
              "--data_file {} must hold chosen_/rejected_ input_ids, attention_mask and labels", file);
  return Pairs(b);
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto& counting = bench::CountingAllocator::install();  // before any tensor it should count
    auto [bench, dpo, args] =
        loom::parse_args(argc, argv, BenchArguments{}, loom::methods::DPOArguments{}, loom::TrainingArguments{});
    loom::check(bench.threads > 0, "--threads must be positive, got {}", bench.threads);
    loom::check(bench.reference == "adapter_off" || bench.reference == "copy" || bench.reference == "precompute",
                "--reference must be adapter_off, copy or precompute, got '{}'", bench.reference);
    loom::check(args.model_name_or_path.has_value() && !bench.lora_adapter.empty(),
                "dpo needs --model_name_or_path (an HF Llama folder) and --lora_adapter (a PEFT folder)");
    loom::check(!bench.data_file.empty() && !bench.result_file.empty(), "dpo needs --data_file and --result_file");
    loom::validate(args);
    loom::finalize(args);
    torch::set_num_threads(static_cast<int>(bench.threads));
    loom::set_seed(args.seed);
    const std::string folder = *args.model_name_or_path;
    args.model_name_or_path.reset();  // read here; the Trainer must not read it again
    auto model = Model::from_pretrained(folder);
    loom::peft::load_adapter(*model, bench.lora_adapter);
    if (bench.reference == "precompute") dpo.precompute_ref_log_probs = true;
    using Trainer = loom::methods::DPOTrainer<Model, loom::Callbacks<Probe>>;
    std::optional<Trainer> trainer;
    if (bench.reference == "copy")
      trainer.emplace(dpo, loom::methods::ReferenceModel<Model>{Model::from_pretrained(folder)}, args, model,
                      read_pairs(bench.data_file));
    else
      trainer.emplace(dpo, args, model, read_pairs(bench.data_file));
    trainer->callback<Probe>().counting = &counting;
    const auto result = trainer->train();
    const auto& probe = trainer->callback<Probe>();
    std::ofstream out(bench.result_file);
    loom::check(static_cast<bool>(out), "cannot write --result_file {}", bench.result_file);
    out << nlohmann::json{{"side", "loom"},
                          {"reference", bench.reference},
                          {"step_end", probe.clock.ends},
                          {"step_cpu_end", probe.clock.cpu_ends},
                          {"train_loss", result.training_loss},
                          {"live_at_begin", probe.live_at_begin},
                          {"peak_tensor_bytes", probe.peak_tensor_bytes},
                          {"peak_rss", probe.peak_rss},
                          {"threads", torch::get_num_threads()}}
               .dump()
        << "\n";
    return 0;
  });
}
