// loom's side of the comparison with transformers.Trainer (tests/hf/compare.py): a small
// classifier whose parameter names, order and arithmetic are those of the Python model in
// compare.py, trained from the same safetensors weights on the same data, with every
// command-line flag a TrainingArguments flag (the same command line runs HF's side).
//
//   build/tests/hf_peer --data_file data.safetensors --model_name_or_path init/
//       --weights_out final.safetensors --output_dir out/ [HF flags...]   (one line)
//
// --sharding ddp / full_shard (under torchrun) runs that engine; anything else one process.
// --model gpt2 / bert trains loom's GPT2LMHeadModel / BertForSequenceClassification
// (loom/models/) from the HF folder --model_name_or_path instead of the small classifier,
// on the batches data/text.hpp defines, through the Trainer's default compute_loss.
// LoRA's flags (loom::peft::LoraArguments: --use_peft, --lora_adapter ...) put an adapter on
// the llama model; --weights_out then receives the adapter file (adapter_model.safetensors).

#include <loom/loom.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

namespace {

/// Flags of this program, beside every TrainingArguments flag.
struct PeerArguments {
  std::string data_file;    ///< safetensors with train_x, train_labels, eval_x, eval_labels
  std::string weights_out;  ///< where rank 0 writes the final weights (safetensors)
  int64_t hidden = 16;      ///< width of the hidden layer
  std::string model = "net";  ///< net (the classifier below), gpt2, llama or bert (an HF folder)
};

struct Batch {
  torch::Tensor x;       ///< float [N, features]
  torch::Tensor labels;  ///< int64 [N]
};

// fc1 -> LayerNorm -> ReLU -> fc2: decay (weights) and no-decay (biases, the norm) parameters
// interleave in module order, so the clipping order is visible in the results.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t features, int64_t hidden, int64_t classes)
      : fc1(register_module("fc1", torch::nn::Linear(features, hidden))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, classes))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(norm(fc1(x)))); }
  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Net);

loom::Metrics accuracy(const loom::EvalPrediction& p) {
  const auto correct = p.predictions.argmax(-1).eq(p.label_ids).sum().item<int64_t>();
  loom::Metrics m;
  m.set("accuracy", static_cast<double>(correct) / static_cast<double>(p.label_ids.size(0)));
  return m;
}

template <class Sharding>
struct PeerTrainer : loom::Trainer<PeerTrainer<Sharding>, Net, Sharding> {
  using PeerTrainer::Trainer::Trainer;
  loom::ModelOutput compute_loss(Net& model, Batch& batch) {
    auto logits = model->forward(batch.x);
    return {torch::nn::functional::cross_entropy(logits, batch.labels), logits};
  }
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return accuracy(p); }
};

// An HF model on the default compute_loss (the model's forward(batch) returns loss and
// logits); the classifier reports accuracy as compare.py's HF side does.
template <class Model, class Sharding>
struct ModelTrainer : loom::Trainer<ModelTrainer<Model, Sharding>, Model, Sharding> {
  using ModelTrainer::Trainer::Trainer;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) {
    if constexpr (std::is_same_v<Model, loom::models::BertForSequenceClassification>) return accuracy(p);
    else return {};
  }
};

// The tensor called `name`; undefined when the file has none and it is not `required` (a
// batch field the data leaves out, such as position_ids).
torch::Tensor tensor_named(const std::vector<std::pair<std::string, torch::Tensor>>& all, const std::string& name,
                           bool required = true) {
  for (const auto& [key, t] : all)
    if (key == name) return t;
  if (!required) return {};
  throw loom::Error("loom: hf_peer: the data file has no tensor " + name);
}

// train(), evaluate() into eval_results.json, and the final weights for compare.py.
template <class T>
int train_evaluate_save(T& trainer, const PeerArguments& peer) {
  trainer.train();
  const auto metrics = trainer.evaluate();
  trainer.save_metrics("eval", metrics);
  if (peer.weights_out.empty()) return 0;
  // save_model gathers what a sharding policy (FullShard) keeps sharded; every rank calls it.
  const std::filesystem::path dir = peer.weights_out + ".model";
  trainer.save_model(dir.string());
  // A model training a LoRA adapter saves PEFT's adapter file in place of model.safetensors.
  const bool adapter = std::filesystem::exists(dir / loom::peft::adapter_weights_file);
  if (trainer.state().is_world_process_zero)
    std::filesystem::rename(dir / (adapter ? loom::peft::adapter_weights_file : "model.safetensors"), peer.weights_out);
  return 0;
}

// Trains `model` on the data file's train_* / eval_* tensors (the fields of Batch, by name).
template <class Model, class Batch, class Sharding>
int run_model(const PeerArguments& peer, const loom::TrainingArguments& args, Model model) {
  const auto data = loom::checkpoint::load_safetensors(peer.data_file);
  auto split = [&](const std::string& prefix) {
    Batch b;
    boost::pfr::for_each_field(b, [&](torch::Tensor& field, std::size_t i) {
      field = tensor_named(data, prefix + std::string(boost::pfr::names_as_array<Batch>()[i]), /*required=*/i < 2);
    });
    return loom::data::TensorDataset<Batch>(b);
  };
  ModelTrainer<Model, Sharding> trainer(args, std::move(model), split("train_"), split("eval_"));
  return train_evaluate_save(trainer, peer);
}

template <class Sharding>
int run(const PeerArguments& peer, const loom::peft::LoraArguments& lora, const loom::TrainingArguments& args) {
  if (peer.model != "net") {
    loom::check(args.model_name_or_path.has_value(), "hf_peer --model {} needs --model_name_or_path", peer.model);
    if (peer.model == "gpt2")
      return run_model<loom::models::GPT2LMHeadModel, loom::data::CausalLMBatch, Sharding>(
          peer, args, loom::models::GPT2LMHeadModel::from_pretrained(*args.model_name_or_path));
    if (peer.model == "llama") {
      auto model = loom::models::LlamaForCausalLM::from_pretrained(*args.model_name_or_path);
      (void)loom::peft::prepare_lora(*model, lora, model->config().model_type, args.model_name_or_path);
      return run_model<loom::models::LlamaForCausalLM, loom::data::CausalLMBatch, Sharding>(peer, args, model);
    }
    loom::check(!loom::peft::lora_config_from_args(lora, peer.model), "hf_peer: LoRA's flags need --model llama");
    loom::check(peer.model == "bert", "hf_peer --model is net, gpt2, llama or bert, got {}", peer.model);
    return run_model<loom::models::BertForSequenceClassification, loom::data::SequenceBatch, Sharding>(
        peer, args, loom::models::BertForSequenceClassification::from_pretrained(*args.model_name_or_path));
  }
  const auto data = loom::checkpoint::load_safetensors(peer.data_file);
  loom::data::TensorDataset<Batch> train({tensor_named(data, "train_x"), tensor_named(data, "train_labels")});
  loom::data::TensorDataset<Batch> eval({tensor_named(data, "eval_x"), tensor_named(data, "eval_labels")});
  const int64_t features = tensor_named(data, "train_x").size(1);
  const int64_t classes = tensor_named(data, "train_labels").max().item<int64_t>() + 1;
  PeerTrainer<Sharding> trainer(args, Net(features, peer.hidden, classes), train, eval);
  return train_evaluate_save(trainer, peer);
}

}  // namespace

int main(int argc, char** argv) {
  return loom::run_main([&] {
    auto [peer, lora, args] =
        loom::parse_args(argc, argv, PeerArguments{}, loom::peft::LoraArguments{}, loom::TrainingArguments{});
    loom::check(!peer.data_file.empty(), "hf_peer needs --data_file");
    const std::string sharding = loom::resolved_sharding(args);
    if (sharding == "ddp") return run<loom::sharding::DDP>(peer, lora, args);
    if (sharding == "full_shard") return run<loom::sharding::FullShard>(peer, lora, args);
    loom::check(sharding == "no", "hf_peer runs --sharding no, ddp or full_shard, got {}", sharding);
    return run<loom::sharding::NoShard>(peer, lora, args);
  });
}
