#pragma once
// A token-level task whose batches differ in length, shared by the recipe tests
// (tests/trainer/test_recipes.cpp) and the multi-process ones (tests/dist/main.cpp): each
// batch is padded to its own longest sequence, so token-level logits and labels are ragged
// across batches, as a padding collator makes them.

#include <loom/loom.hpp>

#include <cstdint>
#include <vector>

namespace loom_test {

/// input_ids and labels padded to the batch's longest sequence (labels with -100), and the
/// attention mask; the field names HF's models take.
struct TokenBatch {
  torch::Tensor input_ids;       ///< int64 [B, L_batch], padded with 0
  torch::Tensor attention_mask;  ///< int64 [B, L_batch]: 1 on tokens
  torch::Tensor labels;          ///< int64 [B, L_batch], -100 on padding
};

/// `n` sequences of 2..8 tokens from a vocabulary of `vocab` (own generator, seeded); the
/// label of each token is (token * 3 + 1) % vocab. get_batch pads to the batch's longest.
struct RaggedTokens {
  std::vector<torch::Tensor> seqs;
  int64_t vocab = 11;

  RaggedTokens(int64_t n, uint64_t seed, int64_t vocab_size = 11) : vocab(vocab_size) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t len = 2 + torch::randint(7, {1}, gen).item<int64_t>();
      seqs.push_back(torch::randint(vocab, {len}, gen));
    }
  }
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(seqs.size()); }
  /// Each sequence's length.
  [[nodiscard]] std::vector<int64_t> lengths() const {
    std::vector<int64_t> out;
    for (const auto& s : seqs) out.push_back(s.size(0));
    return out;
  }
  [[nodiscard]] TokenBatch get_batch(std::span<const int64_t> idx) const {
    int64_t longest = 0;
    for (int64_t i : idx) longest = std::max(longest, seqs[static_cast<std::size_t>(i)].size(0));
    const auto b = static_cast<int64_t>(idx.size());
    auto ids = torch::zeros({b, longest}, torch::kLong);
    auto mask = torch::zeros({b, longest}, torch::kLong);
    auto labels = torch::full({b, longest}, -100, torch::kLong);
    for (int64_t r = 0; r < b; ++r) {
      const auto& s = seqs[static_cast<std::size_t>(idx[static_cast<std::size_t>(r)])];
      const int64_t len = s.size(0);
      ids[r].narrow(0, 0, len).copy_(s);
      mask[r].narrow(0, 0, len).fill_(1);
      labels[r].narrow(0, 0, len).copy_((s * 3 + 1) % vocab);
    }
    return {ids, mask, labels};
  }
};

/// Embedding -> tanh -> Linear over the vocabulary: token-level logits [B, L, vocab]. The
/// loss (cross-entropy over the tokens whose label is not -100) only when labels are given.
struct TokenTaggerImpl : torch::nn::Module {
  explicit TokenTaggerImpl(int64_t vocab = 11, int64_t width = 16)
      : emb(register_module("emb", torch::nn::Embedding(vocab, width))),
        head(register_module("head", torch::nn::Linear(width, vocab))) {}
  loom::ModelOutput forward(const TokenBatch& b) {
    auto logits = head->forward(torch::tanh(emb->forward(b.input_ids)));
    loom::ModelOutput out;
    out.logits = logits;
    if (b.labels.defined())
      out.loss = torch::nn::functional::cross_entropy(
          logits.reshape({-1, logits.size(-1)}), b.labels.reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    return out;
  }
  torch::nn::Embedding emb;
  torch::nn::Linear head;
};
TORCH_MODULE(TokenTagger);

/// The same tagger in a causal-LM role: HF's label smoother shifts the labels for it.
struct CausalTaggerImpl : TokenTaggerImpl {
  static constexpr bool is_causal_lm = true;
  using TokenTaggerImpl::TokenTaggerImpl;
};
TORCH_MODULE(CausalTagger);

/// The same TokenTagger every call (seed 5).
inline TokenTagger fresh_tagger() {
  torch::manual_seed(5);
  return TokenTagger(11, 16);
}

}  // namespace loom_test
