// Text data as people prepare it: build/examples/kjv_text and examples/text_data/kjv.py (through
// prepare.py, Hugging Face's `tokenizers`) write token files; TokenFileDataset and TokenSequenceDataset
// read them back exactly as numpy does, in HF run_clm's group_texts windows, and the padding
// collator's batches equal transformers' DataCollatorWithPadding /
// DataCollatorForTokenClassification on the same examples (tests/data/text_peer.py). Bad
// files end in `loom:` errors naming them. The pipeline runs once per process on 3000
// verses with a 1024-token vocabulary (~2 s).
#include <loom/config/json.hpp>
#include <loom/data/dataloader.hpp>
#include <loom/data/dataset.hpp>
#include <loom/data/padding.hpp>
#include <loom/data/token_file.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include "text_support.hpp"

#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using loom::data::DataCollatorWithPadding;
using loom::data::PaddingSide;
using loom::data::PaddingStrategy;
using loom::data::TokenSequence;
using loom_test::error_of;
using loom_test::run_capture;

constexpr int64_t kLimit = 3000;  // verses kjv.py keeps

/// The folder kjv.py wrote (empty when Python, kjv_text or the KJV data is missing) and the Python.
struct Prepared {
  fs::path dir;
  std::string py;
};

/// Runs `cmd` (stderr too) and REQUIREs exit status 0; returns what it printed.
std::string run_ok(const std::string& cmd) {
  const std::string out = run_capture(cmd + " 2>&1; echo \"<rc=$?>\"");
  INFO(cmd << "\n" << out);
  REQUIRE(out.find("<rc=0>") != std::string::npos);
  return out.substr(0, out.rfind("<rc="));
}

/// kjv_text then kjv.py into tmp/data/text, once per process.
const Prepared& prepared() {
  static const Prepared p = [] {
    Prepared out;
    const fs::path exe = loom_test::tmp_root().parent_path().parent_path() / "examples" / "kjv_text";
    const char* py = std::getenv("LOOM_PYTHON");
    if (py == nullptr || !fs::exists(py) || !fs::exists(exe) || !fs::exists("/usr/lib/bible.data")) return out;
    const fs::path dir = loom_test::fresh_dir("data/text");
    run_ok(exe.string() + " --output " + (dir / "kjv.txt").string());
    run_ok(std::string(py) + " " + (loom_test::source_dir() / "examples/text_data/kjv.py").string() + " --input " +
           (dir / "kjv.txt").string() + " --out " + dir.string() + " --limit " + std::to_string(kLimit) +
           " --vocab_size 1024");
    out.dir = dir;
    out.py = py;
    return out;
  }();
  if (p.dir.empty())
    MESSAGE("LOOM_PYTHON, build/examples/kjv_text or /usr/lib/bible.data missing: the text pipeline check is skipped");
  return p;
}

/// `python text_peer.py <args>`.
std::string peer(const Prepared& p, const std::string& args) {
  return run_ok(p.py + " " + (loom_test::source_dir() / "tests/data/text_peer.py").string() + " " + args);
}

/// The int64 values of a file numpy wrote with tofile().
torch::Tensor read_i64(const fs::path& path) {
  const std::string bytes = loom_test::read_bytes(path);
  return torch::from_blob(const_cast<char*>(bytes.data()), {static_cast<int64_t>(bytes.size() / 8)}, torch::kLong)
      .clone();
}

/// A JSON array of arrays of integers as an int64 [rows, cols] tensor.
torch::Tensor matrix(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows)
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  const auto n = static_cast<int64_t>(rows.size());
  return torch::tensor(flat, torch::kLong).view({n, n == 0 ? 0 : static_cast<int64_t>(flat.size()) / n});
}

std::vector<int64_t> ids_of(const torch::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

// Options set field by field (GCC 12 warns about the fields a designated initializer leaves out).

/// Windows of `block` ids of a `dtype` file.
loom::data::TokenFileOptions flat(int64_t block, loom::data::TokenDtype dtype = loom::data::TokenDtype::uint16,
                                  std::optional<int64_t> stride = {}, std::optional<int64_t> vocab_size = {}) {
  loom::data::TokenFileOptions o;
  o.dtype = dtype;
  o.block_size = block;
  o.stride = stride;
  o.vocab_size = vocab_size;
  return o;
}

/// A collator padding with `pad` on `side`, to a multiple of `multiple`, to `max_length` when given.
DataCollatorWithPadding padder(int64_t pad, PaddingSide side, std::optional<int64_t> multiple = {},
                               std::optional<int64_t> max_length = {}) {
  DataCollatorWithPadding c;
  c.pad_token_id = pad;
  c.padding_side = side;
  c.pad_to_multiple_of = multiple;
  if (max_length) c.padding = PaddingStrategy::max_length;
  c.max_length = max_length;
  return c;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  return idx;
}

}  // namespace

TEST_CASE("kjv_text writes the 31102 verses of the KJV, one a line, with their references") {
  const Prepared& p = prepared();
  if (p.dir.empty()) return;
  std::ifstream in(p.dir / "kjv.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 31102);
  CHECK(lines.front() == "Ge1:1 In the beginning God created the heaven and the earth.");
  CHECK(lines.back().rfind("Rev22:21 The grace of our Lord Jesus Christ be with you all.", 0) == 0);
}

TEST_CASE("TokenFileDataset serves the ids numpy reads, in group_texts windows and strided windows") {
  const Prepared& p = prepared();
  if (p.dir.empty()) return;
  const auto meta = loom::data::read_token_meta(p.dir / "meta.json");
  CHECK(meta.dtype == loom::data::TokenDtype::uint16);
  CHECK(meta.vocab_size == 1024);
  CHECK(meta.eos_token_id == 0);
  CHECK(meta.pad_token_id == 1);
  CHECK(meta.label_names.size() == 7);
  CHECK(fs::exists(meta.tokenizer_file));

  constexpr int64_t block = 64, stride = 48;
  const loom::data::TokenFileDataset windows(meta.lm_file("train"), meta.lm_options(block));
  auto strided_options = meta.lm_options(block);
  strided_options.stride = stride;
  const loom::data::TokenFileDataset strided(meta.lm_file("train"), strided_options);
  std::istringstream counts(peer(p, "windows " + p.dir.string() + " 64 48 " + (p.dir / "expect").string()));
  int64_t tokens = 0, groups = 0, starts = 0;
  counts >> tokens >> groups >> starts;
  REQUIRE(tokens > 0);
  CHECK(windows.file().size() == tokens);
  CHECK(windows.size() == groups);
  CHECK(groups == tokens / block);
  CHECK(strided.size() == starts);

  const auto all = all_indices(windows.size());
  const auto batch = windows.get_batch(all);
  CHECK(batch.input_ids.sizes() == torch::IntArrayRef{groups, block});
  CHECK(torch::equal(batch.input_ids, read_i64(p.dir / "expect.group_texts").view({groups, block})));
  CHECK(torch::equal(batch.labels, batch.input_ids));  // the model shifts, as HF's *ForCausalLM
  CHECK(batch.labels.data_ptr() != batch.input_ids.data_ptr());
  const auto strided_all = all_indices(strided.size());
  CHECK(torch::equal(strided.get_batch(strided_all).input_ids,
                     read_i64(p.dir / "expect.strided").view({starts, block})));
  // Any order of windows, as a sampler gives them.
  const std::vector<int64_t> some{5, 0, groups - 1, 5};
  const auto picked = windows.get_batch(some);
  for (std::size_t r = 0; r < some.size(); ++r)
    CHECK(torch::equal(picked.input_ids[static_cast<int64_t>(r)], batch.input_ids[some[r]]));

  // The counts in meta.json: tokens, and one <|endoftext|> after each document.
  const auto j = loom::json::read_file(p.dir / "meta.json");
  CHECK(j["lm"]["train"]["tokens"].get<int64_t>() == tokens);
  const auto ids = windows.file().slice(0, tokens);
  CHECK(ids.eq(*meta.eos_token_id).sum().item<int64_t>() == j["lm"]["train"]["documents"].get<int64_t>());
  CHECK(ids[-1].item<int64_t>() == *meta.eos_token_id);
}

TEST_CASE("tokenizer.json decodes the first window back to the start of the text") {
  const Prepared& p = prepared();
  if (p.dir.empty()) return;
  const auto meta = loom::data::read_token_meta(p.dir / "meta.json");
  const loom::data::TokenFileDataset windows(meta.lm_file("train"), meta.lm_options(64));
  const std::vector<int64_t> first{0};
  std::string ids;
  for (int64_t id : ids_of(windows.get_batch(first).input_ids)) {
    ids += ' ';
    ids += std::to_string(id);
  }
  const std::string decoded = peer(p, "decode " + p.dir.string() + ids);

  // The text kjv.py tokenized: the kept verses (every 31102/3000-th) of Genesis, one a line.
  std::ifstream in(p.dir / "kjv.txt");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string text;
  for (int64_t i = 0; i < 40; ++i) {
    const std::string& line = lines[static_cast<std::size_t>(i * static_cast<int64_t>(lines.size()) / kLimit)];
    if (i > 0) text += '\n';
    text.append(line, line.find(' ') + 1);
  }
  INFO(decoded);
  CHECK(decoded.size() > 150);
  CHECK(text.rfind(decoded, 0) == 0);
}

TEST_CASE("TokenSequenceDataset reads the ragged classification files as numpy does") {
  const Prepared& p = prepared();
  if (p.dir.empty()) return;
  const auto meta = loom::data::read_token_meta(p.dir / "meta.json");
  const loom::data::TokenSequenceDataset val(meta.classification_files("val"), meta.sequence_options());
  peer(p, "ragged " + p.dir.string() + " val " + (p.dir / "val.json").string());
  const auto expected = loom::json::read_file(p.dir / "val.json");
  REQUIRE(val.size() == static_cast<int64_t>(expected["labels"].size()));
  CHECK(val.size() == 300);  // 10% of 3000
  for (int64_t i = 0; i < val.size(); ++i) {
    const TokenSequence e = val.get(i);
    CHECK(ids_of(e.input_ids) == expected["input_ids"][static_cast<std::size_t>(i)].get<std::vector<int64_t>>());
    CHECK(e.labels.dim() == 0);
    CHECK(e.labels.item<int64_t>() == expected["labels"][static_cast<std::size_t>(i)].get<int64_t>());
    CHECK(e.input_ids[0].item<int64_t>() == *meta.cls_token_id);
    CHECK(e.input_ids[-1].item<int64_t>() == *meta.sep_token_id);
  }
  // Truncation keeps the first max_length ids.
  const loom::data::TokenSequenceDataset cut(meta.classification_files("val"), meta.sequence_options(8));
  CHECK(cut.lengths().max().item<int64_t>() == 8);
  CHECK(torch::equal(cut.get(0).input_ids, val.get(0).input_ids.narrow(0, 0, std::min<int64_t>(8, val.length(0)))));
}

TEST_CASE("the padding collator equals transformers' DataCollatorWithPadding and DataCollatorForTokenClassification") {
  const Prepared& p = prepared();
  if (p.dir.empty()) return;
  const auto meta = loom::data::read_token_meta(p.dir / "meta.json");
  const loom::data::TokenSequenceDataset val(meta.classification_files("val"), meta.sequence_options());
  std::vector<TokenSequence> examples, token_examples;
  nlohmann::json features{{"input_ids", nlohmann::json::array()}, {"labels", nlohmann::json::array()},
                          {"token_labels", nlohmann::json::array()}, {"max_length", 128}};
  for (int64_t i : {0, 3, 7, 12, 20, 33}) {
    examples.push_back(val.get(i));
    const auto ids = ids_of(examples.back().input_ids);
    features["input_ids"].push_back(ids);
    features["labels"].push_back(examples.back().labels.item<int64_t>());
    auto token_labels = examples.back().input_ids.remainder(7);  // any per-token labels
    features["token_labels"].push_back(ids_of(token_labels));
    token_examples.push_back({examples.back().input_ids, token_labels});
  }
  loom_test::write_bytes(p.dir / "features.json", features.dump());
  peer(p, "collate " + p.dir.string() + " " + (p.dir / "features.json").string() + " " +
              (p.dir / "collated.json").string());
  const auto hf = loom::json::read_file(p.dir / "collated.json");

  const int64_t pad = *meta.pad_token_id;
  for (const auto side : {PaddingSide::right, PaddingSide::left}) {
    const std::string s = side == PaddingSide::right ? "right/" : "left/";
    const std::vector<std::pair<std::string, DataCollatorWithPadding>> cases{
        {"longest", padder(pad, side)},
        {"multiple_of_8", padder(pad, side, 8)},
        {"max_length", padder(pad, side, {}, 128)},
        {"max_length_multiple_of_24", padder(pad, side, 24, 128)},
        {"token_labels", padder(pad, side, 4)},
    };
    for (const auto& [name, collator] : cases) {
      INFO(s << name);
      const auto& want = hf.at(s + name);
      const auto got = collator(name == "token_labels" ? token_examples : examples);
      CHECK(torch::equal(got.input_ids, matrix(want["input_ids"])));
      CHECK(torch::equal(got.attention_mask, matrix(want["attention_mask"])));
      if (name == "token_labels") {
        CHECK(torch::equal(got.labels, matrix(want["labels"])));
      } else {
        CHECK(ids_of(got.labels) == want["labels"].get<std::vector<int64_t>>());
      }
    }
  }
}

TEST_CASE("prepare.py's folders of plain text, JSONL text and instruction data open with read_token_meta") {
  const char* py = loom_test::python("prepare.py's folders");
  if (py == nullptr) return;
  const auto dir = loom_test::fresh_dir("data/prepare");
  loom_test::write_bytes(dir / "a.txt", "In the beginning was the word.\nAnd the word was short.\n");
  loom_test::write_bytes(dir / "b.txt", "A second document, with more words.\n");
  loom_test::write_bytes(dir / "c.txt", "The third.");
  loom_test::write_bytes(dir / "docs.jsonl", "{\"text\": \"one\"}\n{\"text\": \"two and three\"}\n\n{\"text\": \"four\"}\n");
  loom_test::write_bytes(dir / "pairs.jsonl", "{\"prompt\": \"Genesis 1:1\\n\", \"completion\": \"In the beginning\"}\n"
                                              "{\"prompt\": \"Genesis 1:2\\n\", \"completion\": \"And the earth\"}\n");
  const std::string tool = std::string(py) + " " + (loom_test::source_dir() / "examples/text_data/prepare.py").string();
  const std::vector<std::pair<std::string, int64_t>> runs{
      {"--text " + (dir / "a.txt").string() + " " + (dir / "b.txt").string() + " " + (dir / "c.txt").string(), 3},
      {"--text " + (dir / "a.txt").string() + " --one_document_per_line", 2},
      {"--jsonl " + (dir / "docs.jsonl").string(), 3}};
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const fs::path out = dir / ("lm" + std::to_string(r));
    run_ok(tool + " " + runs[r].first + " --out " + out.string() + " --vocab_size 300 --val_fraction 0.3");
    const auto meta = loom::data::read_token_meta(out / "meta.json");
    CHECK(meta.vocab_size > 256);  // bytes + special tokens + merges; these texts allow fewer than 300
    CHECK(meta.vocab_size <= 300);
    CHECK(meta.eos_token_id == 0);
    CHECK(meta.pad_token_id == 1);
    CHECK(fs::exists(meta.tokenizer_file));
    const auto j = loom::json::read_file(out / "meta.json");
    int64_t documents = 0;
    for (const char* split : {"train", "val"}) {
      CAPTURE(runs[r].first);
      CAPTURE(split);
      const loom::data::TokenFileDataset lm(meta.lm_file(split), meta.lm_options(1));  // ids checked below vocab_size
      const int64_t tokens = lm.file().size();
      CHECK(tokens == j["lm"][split]["tokens"].get<int64_t>());
      const auto ids = lm.file().slice(0, tokens);
      CHECK(ids.eq(*meta.eos_token_id).sum().item<int64_t>() == j["lm"][split]["documents"].get<int64_t>());
      CHECK(ids[-1].item<int64_t>() == *meta.eos_token_id);
      documents += j["lm"][split]["documents"].get<int64_t>();
    }
    CHECK(documents == runs[r].second);
  }
  // An instruction folder's meta.json reads too: it has "sft" and no "lm".
  run_ok(tool + " --sft " + (dir / "pairs.jsonl").string() + " --out " + (dir / "sft").string() + " --vocab_size 300");
  const auto sft = loom::data::read_token_meta(dir / "sft" / "meta.json");
  CHECK(sft.vocab_size <= 300);
  CHECK(sft.pad_token_id == 1);
  CHECK(sft.lm.empty());
  const auto j = loom::json::read_file(dir / "sft" / "meta.json");
  CHECK(j["sft"]["format"] == "prompt_completion");
  CHECK(j["sft"]["train"]["examples"].get<int64_t>() + j["sft"]["val"]["examples"].get<int64_t>() == 2);
}

TEST_CASE("token datasets batch through fetch, AnyDataset, with_collator and per-rank DataLoaders") {
  const auto dir = loom_test::fresh_dir("data/ragged");
  const std::vector<std::vector<int64_t>> seqs{{5, 6, 7}, {8}, {9, 10, 11, 12, 13}, {}, {14, 15}, {16, 17, 18, 19}};
  const auto files = loom_test::write_ragged(dir, "set", seqs, {0, 1, 2, 0, 1, 2});
  loom::data::TokenSequenceOptions options;
  options.max_length = 4;
  options.vocab_size = 20;
  options.collator.pad_token_id = 3;
  const loom::data::TokenSequenceDataset ds(files, options);
  static_assert(loom::data::CollatingDataset<loom::data::TokenSequenceDataset>);
  static_assert(std::is_same_v<loom::data::batch_t<loom::data::TokenSequenceDataset>, loom::data::SequenceBatch>);
  REQUIRE(ds.size() == 6);
  CHECK(ids_of(ds.lengths()) == std::vector<int64_t>{3, 1, 4, 0, 2, 4});

  // fetch pads with the dataset's collator: right side, the longest in the batch.
  const std::vector<int64_t> idx{1, 2, 3};
  const auto b = loom::data::fetch(ds, idx);
  CHECK(ids_of(b.input_ids) == std::vector<int64_t>{8, 3, 3, 3, 9, 10, 11, 12, 3, 3, 3, 3});
  CHECK(ids_of(b.attention_mask) == std::vector<int64_t>{1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0});
  CHECK(ids_of(b.labels) == std::vector<int64_t>{1, 2, 0});
  const std::vector<int64_t> only_empty{3};
  CHECK(error_of([&] { (void)loom::data::fetch(ds, only_empty); }) ==
        "loom: DataCollatorWithPadding: every example of this batch of 1 is empty; a batch needs a token (empty "
        "examples can only be padded beside others)");

  // with_collator replaces it (left padding); AnyDataset erases the type.
  const auto left = loom::data::with_collator(
      ds, padder(0, PaddingSide::left));
  const loom::data::AnyDataset<loom::data::SequenceBatch> any(left);
  const auto l = any.get_batch(idx);
  CHECK(ids_of(l.input_ids) == std::vector<int64_t>{0, 0, 0, 8, 9, 10, 11, 12, 0, 0, 0, 0});
  CHECK(ids_of(l.attention_mask) == std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0});

  // Two ranks read disjoint halves of each step's examples, each padded to its own longest.
  std::vector<int64_t> seen;
  for (int64_t rank : {0, 1}) {
    loom::data::DataLoader<loom::data::SequenceBatch> loader(loom::data::AnyDataset<loom::data::SequenceBatch>(ds), 2,
                                                             false, loom::data::SequentialSampler{}, {rank, 2});
    loader.set_epoch(0);
    REQUIRE(loader.size() == 2);
    for (int64_t i = 0; i < loader.size(); ++i) {
      const auto batch = loader.batch(i);
      const auto labels = ids_of(batch.labels);
      seen.insert(seen.end(), labels.begin(), labels.end());
      CHECK(batch.input_ids.size(1) == batch.attention_mask.sum(1).max().item<int64_t>());
    }
  }
  CHECK(seen == std::vector<int64_t>{0, 1, 1, 2, 2, 0, 0, 1});  // rank 0: examples 0,1 then 4,5; rank 1: 2,3 then 0,1

  // Per-token labels come truncated with their ids, padded with -100.
  const auto token_files = loom_test::write_ragged(dir, "tokens", seqs, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
  loom::data::TokenSequenceOptions token_options;
  token_options.labels_per_token = true;
  token_options.max_length = 4;
  const loom::data::TokenSequenceDataset tokens(token_files, token_options);
  const auto t = loom::data::fetch(tokens, idx);
  CHECK(ids_of(t.labels) == std::vector<int64_t>{4, -100, -100, -100, 5, 6, 7, 8, -100, -100, -100, -100});
}

TEST_CASE("a TokenFileDataset over a small file: windows, stride, and a shared mapping") {
  const auto dir = loom_test::fresh_dir("data/flat");
  std::vector<int64_t> ids(103);
  std::iota(ids.begin(), ids.end(), 0);
  loom_test::write_bytes(dir / "ids.bin", loom_test::le_bytes<uint32_t>(ids));
  const loom::data::TokenFileDataset ds(dir / "ids.bin", flat(10, loom::data::TokenDtype::uint32));
  CHECK(ds.size() == 10);  // 103 // 10, the remainder dropped
  const std::vector<int64_t> idx{9, 0};
  const auto b = ds.get_batch(idx);
  CHECK(b.input_ids[0][0].item<int64_t>() == 90);
  CHECK(b.input_ids[1][9].item<int64_t>() == 9);
  const loom::data::TokenFileDataset over(dir / "ids.bin", flat(10, loom::data::TokenDtype::uint32, 3, 103));
  CHECK(over.size() == 32);  // starts 0, 3, ..., 93
  const std::vector<int64_t> last{31};
  CHECK(over.get_batch(last).input_ids[0][0].item<int64_t>() == 93);
  const auto copy = ds;  // copies share the mapping
  CHECK(&copy.file() == &ds.file());
}

TEST_CASE("bad token files and bad batches give loom: errors naming the file") {
  using loom::data::TokenDtype;
  const auto dir = loom_test::fresh_dir("data/bad_tokens");
  const auto expect = [](const std::string& message, const std::string& part) {
    INFO(message);
    CHECK(message.rfind("loom: ", 0) == 0);
    CHECK(message.find(part) != std::string::npos);
  };
  const auto open_flat = [](const fs::path& path, loom::data::TokenFileOptions o) {
    return error_of([&] { loom::data::TokenFileDataset d(path, o); });
  };
  expect(open_flat(dir / "missing.bin", {}), "missing.bin does not exist");
  expect(open_flat(dir, {}), "bad_tokens is a folder, not a file");
  loom_test::write_bytes(dir / "odd.bin", std::string(7, '\1'));
  expect(open_flat(dir / "odd.bin", flat(2)), "odd.bin: 7 bytes is not a whole number of uint16 token ids");
  expect(open_flat(dir / "odd.bin", flat(1, TokenDtype::uint32)), "uint32");
  loom_test::write_bytes(dir / "short.bin", loom_test::le_bytes<uint16_t>(std::vector<int64_t>{1, 2, 3}));
  expect(open_flat(dir / "short.bin", flat(4)), "short.bin: 3 tokens, fewer than one block of 4");
  loom_test::write_bytes(dir / "empty.bin", "");
  expect(open_flat(dir / "empty.bin", flat(1)), "empty.bin: 0 tokens");
  loom_test::write_bytes(dir / "big.bin", loom_test::le_bytes<uint16_t>(std::vector<int64_t>{1, 2, 3, 60000, 4}));
  expect(open_flat(dir / "big.bin", flat(2, TokenDtype::uint16, {}, 1024)),
         "big.bin: token id 60000 at position 3 is not below the vocabulary size 1024");
  expect(open_flat(dir / "big.bin", flat(0)), "block_size must be positive");
  expect(open_flat(dir / "big.bin", flat(2, TokenDtype::uint16, 0)), "stride must be positive");
  const loom::data::TokenFileDataset ok(dir / "big.bin", flat(2));
  const std::vector<int64_t> out_of_range{2};
  expect(error_of([&] { (void)ok.get_batch(out_of_range); }), "big.bin: window 2 out of range [0, 2)");

  // Ragged files.
  const std::vector<std::vector<int64_t>> seqs{{1, 2}, {3}};
  auto files = loom_test::write_ragged(dir, "r", seqs, {0, 1});
  const auto seq = [](const loom::data::RaggedTokenFiles& f, loom::data::TokenSequenceOptions o = {}) {
    return error_of([&] { loom::data::TokenSequenceDataset d(f, o); });
  };
  loom_test::write_bytes(dir / "bad.offsets", loom_test::le_bytes<uint64_t>(std::vector<int64_t>{1, 2, 3}));
  expect(seq({files.ids, dir / "bad.offsets", {}}), "bad.offsets: the first offset must be 0, got 1");
  loom_test::write_bytes(dir / "bad.offsets", loom_test::le_bytes<uint64_t>(std::vector<int64_t>{0, 2, 1}));
  expect(seq({files.ids, dir / "bad.offsets", {}}), "bad.offsets: offset 2 (1) is smaller than offset 1 (2)");
  // Only empty examples: refused where they are read, not at the model's reshape.
  loom_test::write_bytes(dir / "none.bin", "");
  loom_test::write_bytes(dir / "none.offsets", loom_test::le_bytes<uint64_t>(std::vector<int64_t>{0, 0, 0}));
  expect(seq({dir / "none.bin", dir / "none.offsets", {}}),
         "none.offsets: all 2 examples are empty (every offset is 0); an example needs a token");
  loom_test::write_bytes(dir / "bad.offsets", loom_test::le_bytes<uint64_t>(std::vector<int64_t>{0, 2, 4}));
  expect(seq({files.ids, dir / "bad.offsets", {}}), "bad.offsets: the last offset is 4 but");
  loom_test::write_bytes(dir / "bad.offsets", std::string(12, '\0'));
  expect(seq({files.ids, dir / "bad.offsets", {}}), "bad.offsets: 12 bytes is not a list of uint64 offsets");
  loom_test::write_bytes(dir / "bad.labels", loom_test::le_bytes<int64_t>(std::vector<int64_t>{0, 1, 2}));
  expect(seq({files.ids, files.offsets, dir / "bad.labels"}), "bad.labels: 24 bytes, expected 2 int64 labels");
  loom::data::TokenSequenceOptions small_vocab;
  small_vocab.vocab_size = 3;
  expect(seq(files, small_vocab), "r.bin: token id 3 at position 2 is not below the vocabulary size 3");
  loom::data::TokenSequenceOptions per_token;
  per_token.labels_per_token = true;
  expect(seq({files.ids, files.offsets, {}}, per_token), "labels_per_token without a labels file");
  const loom::data::TokenSequenceDataset r(files, {});
  expect(error_of([&] { (void)r.get(2); }), "r.bin: example 2 out of range [0, 2)");

  // Labels against the model's label count: each example's, then per token (where -100 is ignored).
  loom::data::TokenSequenceOptions two_labels;
  two_labels.num_labels = 2;
  CHECK(error_of([&] { loom::data::TokenSequenceDataset d(files, two_labels); }) == "<no loom::Error>");
  for (const int64_t bad : {int64_t{-1}, int64_t{2}, int64_t{1} << 40}) {
    const auto labels = loom_test::write_ragged(dir, "l", seqs, {0, bad});
    expect(seq(labels, two_labels), "l.labels: example 1 has label " + std::to_string(bad) +
                                        ", outside [0, 2) (the model's num_labels)");
  }
  two_labels.labels_per_token = true;
  CHECK(error_of([&] {
          loom::data::TokenSequenceDataset d(loom_test::write_ragged(dir, "t", seqs, {0, -100, 1}), two_labels);
        }) == "<no loom::Error>");
  expect(seq(loom_test::write_ragged(dir, "t", seqs, {0, 1, -3}), two_labels),
         "t.labels: example 1 has label -3 at id 2, neither -100 (ignored) nor in [0, 2)");
  two_labels.labels_per_token = false;
  two_labels.num_labels = 0;
  expect(seq(files, two_labels), "r.labels: num_labels must be positive, got 0");

  // meta.json.
  loom_test::write_bytes(dir / "meta.json", R"({"dtype": "int8", "vocab_size": 10})");
  expect(error_of([&] { (void)loom::data::read_token_meta(dir / "meta.json"); }),
         "meta.json: field 'dtype' must be \"uint16\" or \"uint32\", got \"int8\"");
  loom_test::write_bytes(dir / "meta.json", R"({"dtype": "uint16", "vocab_size": 70000})");
  expect(error_of([&] { (void)loom::data::read_token_meta(dir / "meta.json"); }), "field 'vocab_size'");
  // Special tokens inside the vocabulary (an eos_token_id beyond it was copied into config.json).
  for (const char* key : {"eos_token_id", "pad_token_id", "cls_token_id", "sep_token_id"}) {
    CAPTURE(key);
    loom_test::write_bytes(dir / "meta.json",
                           std::string(R"({"dtype": "uint16", "vocab_size": 100, ")") + key + R"(": 100})");
    expect(error_of([&] { (void)loom::data::read_token_meta(dir / "meta.json"); }), std::string("field '") + key + "'");
  }
  loom_test::write_bytes(dir / "meta.json", R"({"dtype": "uint16", "vocab_size": 100, "eos_token_id": 99})");
  CHECK(loom::data::read_token_meta(dir / "meta.json").eos_token_id == 99);
  loom_test::write_bytes(dir / "meta.json", R"({"dtype": "uint16", "vocab_size": 100, "lm": {"train": {"file": "t.bin"}}})");
  const auto meta = loom::data::read_token_meta(dir / "meta.json");
  CHECK(meta.lm_file("train") == dir / "t.bin");
  expect(error_of([&] { (void)meta.lm_file("val"); }), "no causal-LM split 'val' (there are: train)");
  expect(error_of([&] { (void)meta.classification_files("train"); }), "no classification split 'train' (there are: none)");

  // The collator.
  const DataCollatorWithPadding collator;
  const std::vector<TokenSequence> mixed{{torch::tensor({1, 2}), torch::tensor(1)}, {torch::tensor({3}), {}}};
  expect(error_of([&] { (void)collator(mixed); }), "labels are set in 1 of 2 examples");
  const std::vector<TokenSequence> mismatched{{torch::tensor({1, 2}), torch::tensor({1})}};
  expect(error_of([&] { (void)collator(mismatched); }), "example 0 of the batch has 2 tokens but 1 per-token labels");
  const std::vector<TokenSequence> floats{{torch::ones({2}), {}}};
  expect(error_of([&] { (void)collator(floats); }), "input_ids must be a 1-D integer tensor");
  const DataCollatorWithPadding short_max = padder(0, PaddingSide::right, {}, 1);
  const std::vector<TokenSequence> two{{torch::tensor({1, 2}), {}}};
  expect(error_of([&] { (void)short_max(two); }), "a sequence of 2 tokens is longer than max_length 1");
  expect(error_of([&] { (void)collator(std::vector<TokenSequence>{}); }), "needs at least one example");
}
