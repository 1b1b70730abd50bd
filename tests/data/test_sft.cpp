// Instruction data (data/sft.hpp) and packed sequences: SftDataset's padded rows and packed
// windows carry the loss mask (prompt labelled -100) and restart position_ids at each
// example; the Llama architecture attends within each packed example, so a packed forward
// gives each example's own logits and packed and padded batches the same loss per completion
// token. The files are written here with known contents.
#include <loom/data/sft.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace sft_test {

namespace fs = std::filesystem;
using loom::data::SftDataset;
using loom::data::SftFiles;
using loom::data::SftOptions;

template <class T>
void write_file(const fs::path& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(T)));
}

// `lengths` examples of random ids in [2, 100) (own generator), each with a prompt of
// `prompt[i]` tokens (mask 0) then the completion (mask 1).
inline SftFiles write_examples(const fs::path& dir, const std::vector<int64_t>& lengths,
                               const std::vector<int64_t>& prompt) {
  fs::create_directories(dir);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<uint16_t> ids;
  std::vector<uint64_t> offsets{0};
  std::vector<uint8_t> mask;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const auto t = torch::randint(2, 100, {lengths[i]}, gen);
    for (int64_t k = 0; k < lengths[i]; ++k) {
      ids.push_back(static_cast<uint16_t>(t[k].item<int64_t>()));
      mask.push_back(k < prompt[i] ? 0 : 1);
    }
    offsets.push_back(ids.size());
  }
  const SftFiles files{dir / "sft.bin", dir / "sft.offsets", dir / "sft.mask"};
  write_file(files.ids, ids);
  write_file(files.offsets, offsets);
  write_file(files.mask, mask);
  return files;
}

inline loom::models::LlamaConfig tiny() {
  loom::models::LlamaConfig c;
  c.vocab_size = 100, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 64;
  return c;
}

// SftOptions with a vocabulary of 100, the pad id 0, and `packing` / `max_length` when given.
inline SftOptions options(std::optional<int64_t> packing = {}, std::optional<int64_t> max_length = {},
                          int64_t vocab_size = 100) {
  SftOptions o;
  o.vocab_size = vocab_size;
  o.pad_token_id = 0;
  o.packing = packing;
  o.max_length = max_length;
  return o;
}

inline std::vector<int64_t> all_rows(const SftDataset& d) {
  std::vector<int64_t> rows(static_cast<std::size_t>(d.size()));
  std::iota(rows.begin(), rows.end(), 0);
  return rows;
}

TEST_CASE("SftDataset: prompt tokens labelled -100, padded rows, packed windows with position_ids restarting") {
  const std::vector<int64_t> lengths{5, 9, 4, 12, 7}, prompt{2, 3, 1, 5, 7};
  const auto files = write_examples(loom_test::fresh_dir("data/sft_basic"), lengths, prompt);
  const SftDataset padded(files, options());
  CHECK(padded.size() == 5);
  CHECK_FALSE(padded.packed());
  // Counted: completion tokens, not the first of an example (nothing of its own predicts it).
  CHECK(padded.completion_tokens() == (5 - 2) + (9 - 3) + (4 - 1) + (12 - 5) + 0);
  const auto rows = std::vector<int64_t>{1, 4};
  const auto b = padded.get_batch(rows);
  CHECK(b.input_ids.sizes() == torch::IntArrayRef({2, 9}));
  CHECK_FALSE(b.position_ids.defined());
  CHECK(b.labels[0].slice(0, 0, 3).eq(-100).all().item<bool>());
  CHECK(torch::equal(b.labels[0].slice(0, 3), b.input_ids[0].slice(0, 3)));
  CHECK(b.labels[1].eq(-100).all().item<bool>());      // all prompt: nothing counted
  CHECK(b.input_ids[1].slice(0, 0, 7).ne(0).all().item<bool>());
  CHECK(b.input_ids[1].slice(0, 7, 9).eq(0).all().item<bool>());  // padded with the pad id
  // TRL's collator's attention_mask: 1 on the example's tokens, 0 on its padding.
  REQUIRE(b.attention_mask.defined());
  CHECK(torch::equal(b.attention_mask, torch::arange(9).unsqueeze(0).lt(torch::tensor({{9}, {7}})).to(torch::kLong)));
  CHECK_FALSE(padded.get_batch(std::vector<int64_t>{1}).attention_mask.defined());  // no padding, no mask

  const SftDataset packed(files, options(16));
  CHECK(packed.packed());
  CHECK(packed.size() == 3);  // first fit in order: [5, 9], [4, 12], [7]
  CHECK(packed.completion_tokens() == padded.completion_tokens());
  const auto w = packed.get_batch(all_rows(packed));
  CHECK(w.input_ids.sizes() == torch::IntArrayRef({3, 16}));
  CHECK_FALSE(w.attention_mask.defined());  // as TRL's padding-free batches
  const std::vector<int64_t> first{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1};  // 5 + 9 tokens, then padding
  CHECK(torch::equal(w.position_ids[0], torch::tensor(first)));
  CHECK(w.labels[0][5].item<int64_t>() == -100);  // the second example's first token
  CHECK(w.labels[0].slice(0, 14).eq(-100).all().item<bool>());
  CHECK(torch::equal(w.input_ids[0].slice(0, 5, 14), padded.get_batch(std::vector<int64_t>{1}).input_ids[0]));

  // Truncation: padded to max_length, packed to the block size.
  CHECK(SftDataset(files, options({}, 8)).truncated() == 2);
  CHECK(SftDataset(files, options(10)).truncated() == 1);

  // The memory plan's sequence length: the longest example, or the window.
  CHECK(padded.max_sequence_length() == 12);
  CHECK(SftDataset(files, options({}, 8)).max_sequence_length() == 8);
  CHECK(packed.max_sequence_length() == 16);
}

TEST_CASE("the Llama architecture attends within each packed example: its own logits, the padded loss per token") {
  torch::manual_seed(3);
  loom::models::LlamaForCausalLM model(tiny());
  model->eval();
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> lengths{6, 9, 5, 11, 8, 3, 10}, prompt{2, 4, 1, 3, 2, 1, 6};
  const auto files = write_examples(loom_test::fresh_dir("data/sft_model"), lengths, prompt);
  const SftDataset padded(files, options());
  const SftDataset packed(files, options(24));
  REQUIRE(packed.size() < padded.size());
  // A packed window's logits are each example's alone.
  const auto w = packed.get_batch(std::vector<int64_t>{0});
  const auto together = model->forward({w.input_ids, {}, w.position_ids}).logits;
  const auto a = padded.get_batch(std::vector<int64_t>{0}), b = padded.get_batch(std::vector<int64_t>{1});
  const auto alone_a = model->logits(a.input_ids), alone_b = model->logits(b.input_ids);
  const double diff_a = (together[0].slice(0, 0, 6) - alone_a[0]).abs().max().item<double>();
  const double diff_b = (together[0].slice(0, 6, 15) - alone_b[0]).abs().max().item<double>();
  MESSAGE("packed against alone: logits differ by " << diff_a << " and " << diff_b);
  CHECK(diff_a < 1e-5);
  CHECK(diff_b < 1e-5);
  // Without the position_ids the second example would see the first: the check can fail.
  const auto crossing = model->logits(w.input_ids);
  CHECK((crossing[0].slice(0, 6, 15) - alone_b[0]).abs().max().item<double>() > 1e-3);
  // The loss per completion token over the split, packed and padded (batches of 3 rows).
  const auto loss_per_token = [&](const SftDataset& d) {
    double sum = 0;
    int64_t count = 0;
    for (int64_t start = 0; start < d.size(); start += 3) {
      std::vector<int64_t> rows;
      for (int64_t i = start; i < std::min(d.size(), start + 3); ++i) rows.push_back(i);
      const auto batch = d.get_batch(rows);
      const int64_t n = batch.labels.slice(1, 1).ne(-100).sum().item<int64_t>();
      if (n == 0) continue;
      sum += model->forward(batch).loss.item<double>() * static_cast<double>(n);
      count += n;
    }
    CHECK(count == d.completion_tokens());
    return sum / static_cast<double>(count);
  };
  const double packed_loss = loss_per_token(packed), padded_loss = loss_per_token(padded);
  MESSAGE("loss per completion token: packed " << packed_loss << ", padded " << padded_loss);
  CHECK(std::abs(packed_loss - padded_loss) < 1e-5 * padded_loss);
}

TEST_CASE("SftDataset's bad files and GPT-2 with position_ids: one loom: line each") {
  const auto dir = loom_test::fresh_dir("data/sft_bad");
  auto files = write_examples(dir, {4, 6}, {1, 2});
  write_file(files.mask, std::vector<uint8_t>{0, 1, 1, 2, 0, 0, 1, 1, 1, 1});
  CHECK(loom_test::error_of([&] { SftDataset d(files, {}); }) ==
        "loom: " + files.mask.string() + ": byte 3 is 2, but a loss mask holds 0 or 1");
  write_file(files.mask, std::vector<uint8_t>{0, 1, 1});
  CHECK(loom_test::error_of([&] { SftDataset d(files, {}); }) ==
        "loom: " + files.mask.string() + ": 3 bytes, expected one mask byte per id of " + files.ids.string() + " (10)");
  files = write_examples(dir, {4, 6}, {1, 2});
  write_file(files.offsets, std::vector<uint64_t>{0, 4, 4, 10});
  CHECK(loom_test::error_of([&] { SftDataset d(files, {}); }) ==
        "loom: " + files.offsets.string() + ": example 1 is empty (offsets 1 and 2 are both 4); every example needs a token");
  files = write_examples(dir, {4, 6}, {1, 2});
  CHECK(loom_test::error_of([&] { SftDataset d(files, options({}, {}, 50)); }).find("is not below the vocabulary size 50") != std::string::npos);
  // Nothing to learn from: every mask 0, or every completion cut off by max_length.
  const auto silent = write_examples(dir / "silent", {4, 6}, {4, 6});
  CHECK(loom_test::error_of([&] { SftDataset d(silent, options()); }) ==
        "loom: " + silent.ids.string() + ": no example keeps a completion token (a loss-mask 1 after its first id), so "
        "every label is -100 and training would learn nothing; check " + silent.mask.string());
  const auto late = write_examples(dir / "late", {6, 8}, {4, 5});
  CHECK(loom_test::error_of([&] { SftDataset d(late, options({}, 3)); }) ==
        "loom: " + late.ids.string() + ": no example keeps a completion token (a loss-mask 1 after its first id) once 2 "
        "examples are cut to 3 tokens, so every label is -100 and training would learn nothing; check " +
        late.mask.string() + ", or raise the packing window / max_length");
  CHECK_NOTHROW(SftDataset(late, options({}, 5)));
  torch::manual_seed(0);
  loom::models::GPT2Config c;
  c.vocab_size = 100, c.n_positions = 32, c.n_embd = 32, c.n_layer = 1, c.n_head = 2;
  loom::models::GPT2LMHeadModel gpt2(c);
  const auto batch = SftDataset(files, options(12)).get_batch(std::vector<int64_t>{0});
  CHECK(loom_test::error_of([&] { (void)gpt2->forward(batch); })
            .starts_with("loom: GPT-2 takes no position_ids (packed sequences)"));
}

}  // namespace sft_test
