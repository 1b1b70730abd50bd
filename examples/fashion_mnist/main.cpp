// The default example: a small CNN trained on Fashion-MNIST (Debian's dataset-fashion-mnist),
// evaluated on the 10k test images with accuracy as the metric.
//
//   build/examples/fashion_mnist                      # the defaults below
//   build/examples/fashion_mnist --max_steps 50 --learning_rate 3e-4 --output_dir /tmp/run
//   build/examples/fashion_mnist --help               # every flag, with its description
//   build/examples/fashion_mnist args.json --seed 1   # settings from a JSON file, then flags
//   .venv/bin/torchrun --nproc_per_node=2 --no-python build/examples/fashion_mnist --sharding zero2
//
// The model has no batch-dependent layer (no BatchNorm) and no dropout, so runs whose
// batches are split differently (accumulation, ranks) stay exactly comparable.

#include <loom/loom.hpp>

#include "../common/fashion_mnist_data.hpp"
#include "../common/hf_example.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>

/// One batch (and, row by row, one example).
struct Batch {
  torch::Tensor images;  ///< float32 [N, 1, 28, 28], normalized
  torch::Tensor labels;  ///< int64 [N]
};

/// Two conv blocks and two linear layers: about 0.9 test accuracy after three epochs. Each
/// layer is a FullShard unit (gathered only around its own forward and backward under
/// --sharding full_shard; a plain layer otherwise, with the same parameter names).
struct NetImpl : torch::nn::Module {
  template <class M>
  using Unit = loom::dist::FullShardUnit<M>;
  NetImpl()
      : conv1(register_module("conv1", Unit<torch::nn::Conv2d>(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1))))),
        conv2(register_module("conv2", Unit<torch::nn::Conv2d>(torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1))))),
        fc1(register_module("fc1", Unit<torch::nn::Linear>(torch::nn::Linear(32 * 7 * 7, 128)))),
        fc2(register_module("fc2", Unit<torch::nn::Linear>(torch::nn::Linear(128, 10)))) {}

  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(conv1->forward(x)), 2);
    h = torch::max_pool2d(torch::relu(conv2->forward(h)), 2);
    return fc2->forward(torch::relu(fc1->forward(h.flatten(1))));
  }

  Unit<torch::nn::Conv2d> conv1, conv2;
  Unit<torch::nn::Linear> fc1, fc2;
};
TORCH_MODULE(Net);

// The sharding and precision policies are the ones --sharding and --bf16 / --fp16 name when
// the run starts (sharding::FromArgs, precision::FromArgs): one Trainer type for all of them.
struct FashionTrainer : loom::Trainer<FashionTrainer, Net, loom::sharding::FromArgs, loom::precision::FromArgs> {
  using Trainer::Trainer;

  loom::ModelOutput compute_loss(Net& model, Batch& batch) {
    auto logits = model->forward(batch.images);
    return {torch::cross_entropy_loss(logits, batch.labels), logits};
  }

  // sklearn's accuracy_score of the logits' argmax (loom/metrics/classification.hpp).
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    return {{"accuracy", loom::metrics::accuracy(p.predictions, p.label_ids)}};
  }
};

// One split as a dataset of batches (examples/common/fashion_mnist_data.hpp reads it).
static loom::data::TensorDataset<Batch> load_split(const std::filesystem::path& dir, const std::string& prefix,
                                                   std::optional<int64_t> limit) {
  auto [images, labels] = fashion_mnist::load_split(dir, prefix, limit);
  return loom::data::TensorDataset<Batch>({images, labels});
}

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults; any flag on the command line overrides them.
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/fashion_mnist";
    defaults.learning_rate = 1e-3;
    defaults.per_device_train_batch_size = 64;
    defaults.per_device_eval_batch_size = 256;
    defaults.logging_steps = 100;
    defaults.eval_strategy = "epoch";
    defaults.save_strategy = "no";
    auto [example, args] = loom::parse_args(argc, argv, fashion_mnist::DataArguments{}, defaults);
    // HF's scripts: bad flags reported before any data is read; given none of --do_train /
    // --do_eval / --do_predict, this example trains and evaluates; given one, an output folder
    // with checkpoints resumes from the last one (unless --overwrite_output_dir).
    hf_example::apply_script_rules(args, "fashion_mnist");

    const bool main_process = hf_example::is_main_process();
    loom::set_seed(args.seed);
    const std::filesystem::path dir(example.data_dir);
    auto train_set = load_split(dir, "train", example.max_train_samples);
    auto test_set = load_split(dir, "t10k", example.max_eval_samples);
    if (main_process)
      fmt::print("fashion_mnist: {} training and {} test images from {}\n", train_set.size(), test_set.size(),
                 dir.string());

    // As HF's example scripts: train, save the model, report, evaluate, report, predict.
    {
      FashionTrainer trainer(args, Net{}, train_set, test_set);
      if (args.do_train) {
        auto train_output = trainer.train();
        trainer.save_model();  // output_dir/model.safetensors + training_args.json
        trainer.log_metrics("train", train_output.metrics);
      }
      if (args.do_eval) {
        auto eval_metrics = trainer.evaluate();
        trainer.log_metrics("eval", eval_metrics);
        trainer.save_metrics("eval", eval_metrics);
      }
      if (args.do_predict) {
        // The test images (Fashion-MNIST has no separate validation split): predict_results.txt
        // holds one predicted class a line, as HF's run_glue writes.
        auto result = trainer.predict(test_set, "predict");
        trainer.log_metrics("predict", result.metrics);
        trainer.save_metrics("predict", result.metrics);
        if (trainer.is_world_process_zero()) {
          const auto classes = result.predictions.argmax(1);
          std::filesystem::create_directories(args.output_dir);
          std::FILE* f = std::fopen((std::filesystem::path(args.output_dir) / "predict_results.txt").c_str(), "w");
          loom::check(f != nullptr, "cannot write {}/predict_results.txt", args.output_dir);
          std::fputs("index\tprediction\n", f);
          for (int64_t i = 0; i < classes.size(0); ++i) std::fprintf(f, "%ld\t%ld\n", static_cast<long>(i),
                                                                      static_cast<long>(classes[i].template item<int64_t>()));
          std::fclose(f);
        }
      }
    }
    if (main_process) fmt::print("outputs in {}\n", args.output_dir);
    return 0;
  });
}
