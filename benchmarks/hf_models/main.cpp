// loom's side of the benchmark against transformers.Trainer (benchmarks/hf_models/run.py runs
// both and reports): GPT-2 or BERT from an HF folder, trained by loom's Trainer (NoShard,
// FP32) on the KJV token files of examples/text_data/prepare.py, with the same flags as the
// transformers side; each optimizer step's end time is written to --times_file.
//
//   build/benchmarks/hf_models --model gpt2 --model_name_or_path init/ --data_dir data/kjv
//       --times_file loom.json --threads 1 [TrainingArguments flags...]          (one line)
//
// The data, as run.py gives it to transformers: GPT-2 trains on train.bin's windows of
// --block_size tokens (TokenFileDataset); BERT on classify_train's verses truncated and
// padded to --max_seq_length ids (TokenSequenceDataset with a max_length collator), so every
// step of both sides computes on the same number of tokens.

#include <loom/loom.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>

#include "../../examples/common/hf_example.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace {

/// Flags of this program, beside every TrainingArguments flag.
struct BenchArguments {
  std::string model = "gpt2";         ///< gpt2 or bert (the HF folder --model_name_or_path holds)
  std::string data_dir = "data/kjv";  ///< prepare.py's folder
  int64_t block_size = 128;           ///< gpt2: tokens per window
  int64_t max_seq_length = 64;        ///< bert: ids per example, truncated and padded to it
  int64_t threads = 1;                ///< torch intra-op threads
  std::string times_file;             ///< where the step end times go (JSON)
};

using Clock = std::chrono::steady_clock;

/// Seconds from the start of training to the end of each optimizer step.
struct StepClock {
  Clock::time_point start;     ///< on_train_begin
  std::vector<double> ends;    ///< one per step

  void on_train_begin(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    start = Clock::now();
  }
  void on_step_end(const loom::TrainingArguments&, loom::TrainerState&, loom::TrainerControl&) {
    ends.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
};

/// The model's own loss (the default compute_loss), the step clock.
template <class Model>
struct BenchTrainer : loom::Trainer<BenchTrainer<Model>, Model, loom::Callbacks<StepClock>> {
  using BenchTrainer::Trainer::Trainer;
};

template <class Model, class Dataset>
void run(loom::TrainingArguments args, Model model, Dataset train, const BenchArguments& bench,
         int64_t tokens_per_step) {
  BenchTrainer<Model> trainer(args, std::move(model), std::move(train));
  const auto result = trainer.train();
  const auto& clock = trainer.template callback<StepClock>();
  std::ofstream out(bench.times_file);
  loom::check(static_cast<bool>(out), "cannot write --times_file {}", bench.times_file);
  out << nlohmann::json{{"side", "loom"},
                        {"step_end", clock.ends},
                        {"train_loss", result.training_loss},
                        {"tokens_per_step", tokens_per_step},
                        {"threads", torch::get_num_threads()}}
             .dump()
      << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto [bench, args] = loom::parse_args(argc, argv, BenchArguments{}, loom::TrainingArguments{});
    loom::check(bench.model == "gpt2" || bench.model == "bert", "--model is gpt2 or bert, got {}", bench.model);
    loom::check(args.model_name_or_path.has_value(), "hf_models needs --model_name_or_path (an HF folder)");
    loom::check(!bench.times_file.empty(), "hf_models needs --times_file");
    loom::check(bench.threads > 0, "--threads must be positive, got {}", bench.threads);
    loom::validate(args);
    loom::finalize(args);
    torch::set_num_threads(static_cast<int>(bench.threads));
    loom::set_seed(args.seed);
    const auto meta = hf_example::read_token_folder(bench.data_dir);
    const int64_t batch = args.per_device_train_batch_size;
    if (bench.model == "gpt2") {
      auto model = hf_example::pretrained_or_random<loom::models::GPT2LMHeadModel>(args, loom::models::GPT2Config{});
      loom::data::TokenFileDataset train(meta.lm_file("train"), meta.lm_options(bench.block_size));
      run(args, std::move(model), std::move(train), bench, batch * bench.block_size);
    } else {
      auto model = hf_example::pretrained_or_random<loom::models::BertForSequenceClassification>(
          args, loom::models::BertConfig{});
      auto options = meta.sequence_options(bench.max_seq_length);
      options.collator.padding = loom::data::PaddingStrategy::max_length;
      options.collator.max_length = bench.max_seq_length;
      loom::data::TokenSequenceDataset train(meta.classification_files("train"), options);
      run(args, std::move(model), std::move(train), bench, batch * bench.max_seq_length);
    }
    return 0;
  });
}
