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
  /// The memory plan's activation estimate (the Trainer asks a model that has one): the
  /// embedded tokens of one micro-batch, enough to check which sequence length it is given.
  [[nodiscard]] double activation_bytes(int64_t batch, int64_t seq, int64_t bytes_per_element, bool) const {
    return static_cast<double>(batch * seq * embedding->options.embedding_dim() * bytes_per_element);
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
  const auto train_set = majority_data(dir, "train", 512, 1);
  const int64_t longest = train_set.max_sequence_length();
  CHECK(longest == 12);  // 512 draws of 1..12 ids reach 12
  const auto lengths = train_set.lengths();
  CHECK(longest == lengths.max().item<int64_t>());
  TextClassifier trainer(args, BagOfEmbeddings(30, 16, 3), train_set, majority_data(dir, "eval", 256, 2));
  // The memory plan's activations: a ragged dataset states no block size, so the estimate
  // takes the longest row a padded batch can have.
  const auto& plan = trainer.memory_plan();
  REQUIRE(plan.has_value());
  REQUIRE(plan->activations.has_value());
  CHECK(*plan->activations == 16.0 * 12 * 16 * 4);
  CHECK(plan->activation_note == "batch 16 x sequence 12 (the longest a batch can have), 4-byte activations");
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

TEST_CASE("a ragged dataset's longest batch row follows its truncation and its collator's padding") {
  const auto dir = loom_test::fresh_dir("data/text_longest");
  const std::vector<std::vector<int64_t>> seqs{{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11}};
  const auto files = loom_test::write_ragged(dir, "train", seqs, std::vector<int64_t>{0, 1, 0});
  const auto longest = [&](const loom::data::TokenSequenceOptions& o) {
    return loom::data::TokenSequenceDataset(files, o).max_sequence_length();
  };
  loom::data::TokenSequenceOptions o;
  o.vocab_size = 30;
  CHECK(longest(o) == 7);
  o.collator.pad_to_multiple_of = 4;
  CHECK(longest(o) == 8);
  o.max_length = 5;  // truncated to 5, padded to 8
  CHECK(longest(o) == 8);
  o.collator.pad_to_multiple_of = std::nullopt;
  CHECK(longest(o) == 5);
  o.collator.padding = loom::data::PaddingStrategy::max_length, o.collator.max_length = 6;
  CHECK(longest(o) == 6);
  // What collate() makes of the longest example agrees.
  const loom::data::TokenSequenceDataset ds(files, o);
  CHECK(ds.collate({ds.get(1)}).input_ids.size(1) == ds.max_sequence_length());
  const auto length = loom::detail::train_sequence_length(ds);
  REQUIRE(length.has_value());
  CHECK(length->tokens == 6);
  CHECK(length->longest);
}

}  // namespace data_test_text_trainer
