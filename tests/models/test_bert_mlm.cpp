// Masked-LM pretraining pieces against transformers (tests/models/hf_bert_mlm.py): loom's
// BertForMaskedLM reads transformers' BertForMaskedLM and BertForPreTraining folders with the
// same logits and loss, and what it saves opens in transformers; data/mlm.hpp's masking rule
// draws exactly what DataCollatorForLanguageModeling draws from a generator of the same seed,
// with its proportions; MaskedLMDataset masks a batch the same way at the same place.

#include <loom/checkpoint/safetensors.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/mlm.hpp>
#include <loom/data/padding.hpp>
#include <loom/models/bert.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <doctest/doctest.h>

#include "peer_support.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bert_mlm_test {

namespace fs = std::filesystem;
using loom::models::BertConfig;
using loom::models::BertForMaskedLM;

inline std::string script() { return (loom_test::source_dir() / "tests/models/hf_bert_mlm.py").string(); }

// The folders hf_bert_mlm.py makes, once per run (nullptr: no Python).
inline const fs::path* made() {
  return loom_test::peer_made("hf_bert_mlm.py", "hf_bert_mlm", "made bert mlm",
                              "the comparison with transformers' masked LM");
}

using loom_test::named;

inline double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

TEST_CASE("BertForMaskedLM: transformers' folders (tied, untied, BertForPreTraining) give its logits and loss, "
          "and what loom saves opens in transformers") {
  const auto* dir = made();
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  loom::data::SequenceBatch batch{named(expected, "input_ids"), named(expected, "attention_mask"),
                                  named(expected, "labels")};
  for (const std::string name : {"mlm", "mlm_untied", "pretraining"}) {
    CAPTURE(name);
    auto model = BertForMaskedLM::from_pretrained(*dir / name);
    model->eval();
    torch::NoGradGuard no_grad;
    const auto out = model->forward(batch);
    const double logits = relative(out.logits, named(expected, name + "_logits"));
    const double loss = relative(out.loss.reshape({1}), named(expected, name + "_loss"));
    MESSAGE(name << ": logits " << logits << ", loss " << loss << " relative");
    CHECK(logits <= 1e-5);
    CHECK(loss <= 1e-5);
    CHECK(model->config().tie_word_embeddings == (name != "mlm_untied"));
    // HF's skipped heads are not kept, and the pooler is not built.
    CHECK(model->bert->pooler.is_empty());

    const auto saved = loom_test::fresh_dir("models/hf_bert_mlm_saved_" + name);
    model->save_pretrained(saved);
    auto with_logits = expected;
    with_logits.emplace_back("loom_logits", out.logits.contiguous());
    loom::checkpoint::save_safetensors(with_logits, saved / "inputs.safetensors");
    const auto check = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " check " +
                                              saved.string() + " " + (saved / "inputs.safetensors").string() +
                                              " 2>&1; echo exit=$?");
    INFO(check);
    CHECK(check.find("exit=0") != std::string::npos);
  }
}

TEST_CASE("BertForMaskedLM refuses a classifier's folder and labels of the wrong shape") {
  const auto* dir = made();
  if (dir == nullptr) return;
  // A sequence classifier's folder has classifier.weight and no cls.predictions.
  BertConfig c;
  c.vocab_size = 120, c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 48, c.max_position_embeddings = 64;
  const auto classifier_dir = loom_test::fresh_dir("models/bert_mlm_classifier");
  loom::models::BertForSequenceClassification(c)->save_pretrained(classifier_dir);
  const auto err = loom_test::error_of([&] { (void)BertForMaskedLM::from_pretrained(classifier_dir); });
  CHECK(err.find("no cls.predictions.bias in the weights") != std::string::npos);

  BertForMaskedLM model(c);
  const auto ids = torch::randint(5, 120, {2, 6}, torch::kLong);
  const auto bad = loom_test::error_of([&] { (void)model->forward({ids, {}, torch::zeros({2}, torch::kLong)}); });
  CHECK(bad.find("BertForMaskedLM takes integer token labels [batch, seq]") != std::string::npos);
}

TEST_CASE("mask_tokens draws what DataCollatorForLanguageModeling draws from a generator of the same seed") {
  const auto* dir = made();
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  // hf_bert_mlm.py's SETTINGS and SEED; its tokenizer's special ids are 0..4 ([MASK] = 4).
  const std::vector<std::tuple<double, double, double>> settings{{0.15, 0.8, 0.1}, {0.5, 0.6, 0.3}, {0.3, 1.0, 0.0}};
  for (std::size_t k = 0; k < settings.size(); ++k) {
    CAPTURE(k);
    const auto [p, mask_p, random_p] = settings[k];
    const loom::data::MaskedLMOptions options{.mlm_probability = p,
                                              .mask_replace_prob = mask_p,
                                              .random_replace_prob = random_p,
                                              .mask_token_id = 4,
                                              .vocab_size = 120,
                                              .special_token_ids = {0, 1, 2, 3, 4}};
    loom::data::validate(options);
    const auto ids = named(expected, "collator_input_ids_" + std::to_string(k));
    const auto never = loom::data::never_masked(ids, {}, options.special_token_ids);
    const auto got = loom::data::mask_tokens(ids, never, options, at::make_generator<at::CPUGeneratorImpl>(1234));
    const auto want_ids = named(expected, "collator_masked_" + std::to_string(k));
    const auto want_labels = named(expected, "collator_labels_" + std::to_string(k));
    CHECK(torch::equal(got.labels, want_labels));
    CHECK(torch::equal(got.input_ids, want_ids));
    CHECK(want_labels.ne(-100).sum().item<int64_t>() > 0);  // the comparison covers selected tokens
  }
}

TEST_CASE("masked-LM masking: proportions, special tokens and padding never selected, one mask per place") {
  const int64_t vocab = 1000, rows = 64, seq = 512;
  const loom::data::MaskedLMOptions options{.mask_token_id = 3, .vocab_size = vocab, .special_token_ids = {0, 1, 2, 3},
                                            .seed = 5};
  auto ids = torch::randint(4, vocab, {rows, seq}, torch::kLong);
  auto attention = torch::ones({rows, seq}, torch::kLong);
  ids.select(1, 0).fill_(1);  // [CLS]
  ids.narrow(1, 400, 112).fill_(0);  // padding
  attention.narrow(1, 400, 112).fill_(0);
  ids.select(1, 399).fill_(2);  // [SEP]
  const loom::data::SequenceBatch batch{ids, attention, {}};
  const auto masked = loom::data::mask_batch(batch, options, {.epoch = 0, .index = 7});

  const auto selected = masked.labels.ne(-100);
  const auto text = attention.eq(1) & ids.ge(4);
  const double n_text = static_cast<double>(text.sum().item<int64_t>());
  const double n_sel = static_cast<double>(selected.sum().item<int64_t>());
  CHECK(selected.logical_and(text.logical_not()).sum().item<int64_t>() == 0);  // never special, never padding
  CHECK(torch::equal(masked.labels.masked_select(selected), ids.masked_select(selected)));
  CHECK(torch::equal(masked.input_ids.masked_select(selected.logical_not()), ids.masked_select(selected.logical_not())));
  // Shares within 5 standard deviations of their binomial expectations.
  const auto near = [](double count, double n, double p) {
    const double sd = std::sqrt(n * p * (1 - p));
    INFO("count " << count << " of " << n << ", expected share " << p);
    CHECK(std::abs(count - n * p) <= 5 * sd);
  };
  near(n_sel, n_text, 0.15);
  const auto sel_in = masked.input_ids.masked_select(selected);
  const auto sel_orig = ids.masked_select(selected);
  const double as_mask = static_cast<double>(sel_in.eq(3).sum().item<int64_t>());
  const double kept = static_cast<double>(sel_in.eq(sel_orig).sum().item<int64_t>());
  near(as_mask, n_sel, 0.8 + 0.1 / vocab);
  near(kept, n_sel, 0.1 + 0.1 / vocab);

  // The same place masks the same; another batch index or epoch masks anew.
  CHECK(torch::equal(loom::data::mask_batch(batch, options, {0, 7}).input_ids, masked.input_ids));
  CHECK(!torch::equal(loom::data::mask_batch(batch, options, {0, 8}).labels, masked.labels));
  CHECK(!torch::equal(loom::data::mask_batch(batch, options, {1, 7}).labels, masked.labels));
}

// Ragged token examples ([CLS] ... [SEP]), padded by DataCollatorWithPadding.
struct Sentences {
  std::vector<std::vector<int64_t>> rows;
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(rows.size()); }
  [[nodiscard]] loom::data::TokenSequence get(int64_t i) const {
    return {torch::tensor(rows[static_cast<std::size_t>(i)], torch::kLong), {}};
  }
};

TEST_CASE("MaskedLMDataset: a DataLoader's batch is masked by its place, whatever was read before it") {
  Sentences sentences;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int i = 0; i < 40; ++i) {
    const int64_t n = 5 + (i * 7) % 30;
    auto ids = at::randint(5, 200, {n}, gen, torch::TensorOptions().dtype(torch::kLong));
    std::vector<int64_t> row{2};
    for (int64_t j = 0; j < n; ++j) row.push_back(ids[j].item<int64_t>());
    row.push_back(3);
    sentences.rows.push_back(row);
  }
  const loom::data::MaskedLMOptions options{.mlm_probability = 0.3, .mask_token_id = 4, .vocab_size = 200,
                                            .special_token_ids = {0, 1, 2, 3, 4}, .seed = 9};
  const auto padded = loom::data::with_collator(sentences, loom::data::DataCollatorWithPadding{});  // pads with 0
  const loom::data::AnyDataset<loom::data::SequenceBatch> data(loom::data::MaskedLMDataset(padded, options));
  loom::data::DataLoader<loom::data::SequenceBatch> a(data, 8, false, loom::data::RandomSampler{.seed = 1});
  loom::data::DataLoader<loom::data::SequenceBatch> b(data, 8, false, loom::data::RandomSampler{.seed = 1});
  a.set_epoch(2);
  b.set_epoch(2);
  for (int64_t i = 0; i < a.size(); ++i) (void)a.batch(i);  // a has read every batch before; b reads batch 3 first
  const auto from_b = b.batch(3);
  const auto from_a = a.batch(3);
  CHECK(torch::equal(from_a.input_ids, from_b.input_ids));
  CHECK(torch::equal(from_a.labels, from_b.labels));
  CHECK(from_a.labels.ne(-100).sum().item<int64_t>() > 0);
  b.set_epoch(3);  // another epoch masks anew (and orders anew)
  CHECK(!torch::equal(b.batch(3).labels, from_a.labels));

  const auto err = loom_test::error_of([&] {
    (void)loom::data::MaskedLMDataset(padded, loom::data::MaskedLMOptions{.mask_replace_prob = 0.9,
                                                                              .random_replace_prob = 0.2,
                                                                              .mask_token_id = 4,
                                                                              .vocab_size = 200,
                                                                              .special_token_ids = {}});
  });
  CHECK(err.find("mask_replace_prob (0.9) and random_replace_prob (0.2) add up to more than 1") != std::string::npos);
  CHECK(loom_test::error_of([&] {
          loom::data::validate({.mask_token_id = 200, .vocab_size = 200, .special_token_ids = {}});
        }).find("mask_token_id (200) must be a token of the vocabulary [0, 200)") != std::string::npos);
}

}  // namespace bert_mlm_test
