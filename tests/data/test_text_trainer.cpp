// A TokenSequenceDataset with its padding collator trains through loom::Trainer unchanged:
// variable-length token sequences (a ragged token file written here), padded per batch, a
// bag-of-embeddings classifier that reads the attention mask, evaluated on padded batches.
#include "../trainer_support.hpp"
#include "text_support.hpp"

#include <doctest/doctest.h>

#include <random>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace data_test_text_trainer {

namespace {

using loom::data::SequenceBatch;

/// Embeddings of the tokens, averaged over the attention mask, then a linear layer.
struct BagOfEmbeddingsImpl : torch::nn::Module {
  torch::nn::Embedding embedding;
  torch::nn::Linear head;

  BagOfEmbeddingsImpl(int64_t vocab, int64_t width, int64_t classes)
      : embedding(register_module("embedding", torch::nn::Embedding(vocab, width))),
        head(register_module("head", torch::nn::Linear(width, classes))) {}
  /// Logits [batch, classes]; padding (attention_mask 0) does not count.
  torch::Tensor forward(const SequenceBatch& batch) {
    const auto mask = batch.attention_mask.unsqueeze(-1).to(torch::kFloat);
    const auto pooled = (embedding->forward(batch.input_ids) * mask).sum(1) / mask.sum(1).clamp_min(1.0);
    return head->forward(pooled);
  }
};
TORCH_MODULE(BagOfEmbeddings);

/// Cross-entropy on the padded batches; accuracy in evaluation.
struct TextClassifier : loom::Trainer<TextClassifier, BagOfEmbeddings> {
  using Trainer::Trainer;
  loom::Metrics compute_metrics(const loom::EvalPrediction& p) { return loom_test::accuracy(p); }
  loom::ModelOutput compute_loss(BagOfEmbeddings& model, SequenceBatch& batch) {
    const auto logits = model->forward(batch);
    return {torch::cross_entropy_loss(logits, batch.labels), logits};
  }
};

/// `n` sequences of 1..12 ids in [1, 30); the label says which third of the id range most ids fall in.
loom::data::TokenSequenceDataset majority_data(const std::filesystem::path& dir, const std::string& name, int64_t n,
                                               unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> length(1, 12), id(1, 29);
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> s(static_cast<std::size_t>(length(gen)));
    int64_t counts[3] = {0, 0, 0};
    for (auto& v : s) ++counts[(v = id(gen)) / 10];
    seqs.push_back(std::move(s));
    labels.push_back(std::max_element(counts, counts + 3) - counts);
  }
  loom::data::TokenSequenceOptions options;
  options.vocab_size = 30;
  options.collator.pad_token_id = 0;
  return {loom_test::write_ragged(dir, name, seqs, labels), options};
}

}  // namespace

TEST_CASE("a TokenSequenceDataset with the padding collator trains through loom::Trainer") {
  const auto dir = loom_test::fresh_dir("data/text_trainer_data");
  auto args = loom_test::quiet_args("data/text_trainer");
  args.per_device_train_batch_size = 16;
  args.per_device_eval_batch_size = 32;
  args.num_train_epochs = 4;
  args.learning_rate = 3e-2;
  args.logging_steps = 16;
  torch::manual_seed(3);
  TextClassifier trainer(args, BagOfEmbeddings(30, 16, 3), majority_data(dir, "train", 512, 1),
                         majority_data(dir, "eval", 256, 2));
  const double before = trainer.evaluate().get("eval_accuracy").value();
  const auto result = trainer.train();
  const auto after = trainer.evaluate();
  MESSAGE("eval accuracy " << before << " -> " << after.get("eval_accuracy").value() << ", train loss "
                           << result.training_loss);
  CHECK(result.global_step == 128);
  CHECK(after.get("eval_accuracy").value() > 0.8);
  CHECK(after.get("eval_loss").value() < 0.6);
  CHECK(before < 0.6);
}

}  // namespace data_test_text_trainer
