// Labels of every problem type, from text to loss: examples/text_data/prepare.py --classify
// writes single-label (int64 class ids), multi-label (float32 multi-hot rows) and regression
// (float32 targets) folders from JSON Lines (tests/data/labels_peer.py makes them);
// read_token_meta and TokenSequenceDataset read them into SequenceBatch labels of HF's shapes
// and dtypes, and BertForSequenceClassification's loss on a batch equals transformers' on the
// same examples batched by its DataCollatorWithPadding. Bad label files, meta.json fields and
// JSONL labels end in `loom:` errors (prepare.py: one line naming FILE:LINE).
#include <loom/config/json.hpp>
#include <loom/data/token_file.hpp>
#include <loom/models/bert.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include "text_support.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

namespace labels_test {

namespace fs = std::filesystem;
using loom::data::LabelKind;

/// Runs `cmd` with stderr; returns {exit status 0, what it printed}.
std::pair<bool, std::string> run(const std::string& cmd) {
  const std::string out = loom_test::run_capture(cmd + " 2>&1; echo \"<rc=$?>\"");
  return {out.find("<rc=0>") != std::string::npos, out.substr(0, out.rfind("<rc="))};
}

/// The little-endian float32 bytes of `values`.
std::string f32_bytes(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (const float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return loom_test::le_bytes<uint32_t>(bits);
}

}  // namespace labels_test

using namespace labels_test;

TEST_CASE("prepare.py --classify folders of each problem type batch into HF's labels, and BERT's loss equals transformers'") {
  const char* py = loom_test::python("the labels pipeline check");
  if (py == nullptr) return;
  const fs::path dir = loom_test::fresh_dir("data/labels");
  const std::string peer = std::string(py) + " " + (loom_test::source_dir() / "tests/data/labels_peer.py").string();
  const std::string tool = std::string(py) + " " + (loom_test::source_dir() / "examples/text_data/prepare.py").string();
  {
    const auto [ok, out] = run(peer + " jsonl " + dir.string());
    INFO(out);
    REQUIRE(ok);
  }
  struct Task {
    std::string name, flags, problem_type;
    LabelKind kind;
    int64_t num_labels;
  };
  const std::vector<Task> tasks{
      {"single", "", "single_label_classification", LabelKind::class_id, 3},
      {"multi", "", "multi_label_classification", LabelKind::multi_hot, 3},
      {"regression", "", "regression", LabelKind::regression, 1},
      {"targets", "--label_type regression", "regression", LabelKind::regression, 2}};
  constexpr int64_t kBatch = 8;
  for (const auto& task : tasks) {
    CAPTURE(task.name);
    const fs::path data = dir / task.name;
    const auto [ok, out] = run(tool + " --classify " + (dir / (task.name + ".jsonl")).string() + " " + task.flags +
                               " --out " + data.string() + " --vocab_size 300 --max_length 12");
    INFO(out);
    REQUIRE(ok);
    const auto meta = loom::data::read_token_meta(data / "meta.json");
    CHECK((meta.label_kind == task.kind));
    CHECK(static_cast<int64_t>(meta.label_names.size()) == task.num_labels);
    const auto j = loom::json::read_file(data / "meta.json");
    CHECK(j["classification"]["problem_type"] == task.problem_type);
    const loom::data::TokenSequenceDataset train(meta.classification_files("train"), meta.sequence_options());
    std::vector<loom::data::TokenSequence> examples;
    for (int64_t i = 0; i < kBatch; ++i) examples.push_back(train.get(i));
    const auto batch = train.collate(examples);
    CHECK(batch.input_ids.size(1) <= 12);  // --max_length truncates, [CLS] and [SEP] kept
    // HF's label shapes and dtypes: int64 [B]; float [B] (one target); float [B, num_labels].
    if (task.kind == LabelKind::class_id) {
      CHECK((batch.labels.scalar_type() == torch::kLong));
      CHECK((batch.labels.sizes() == torch::IntArrayRef{kBatch}));
    } else if (task.num_labels == 1) {
      CHECK((batch.labels.scalar_type() == torch::kFloat));
      CHECK((batch.labels.sizes() == torch::IntArrayRef{kBatch}));
    } else {
      CHECK((batch.labels.scalar_type() == torch::kFloat));
      CHECK((batch.labels.sizes() == torch::IntArrayRef{kBatch, task.num_labels}));
    }

    loom::models::BertConfig config;
    config.vocab_size = meta.vocab_size;
    config.hidden_size = 16;
    config.num_hidden_layers = 1;
    config.num_attention_heads = 2;
    config.intermediate_size = 32;
    config.max_position_embeddings = 16;
    config.pad_token_id = meta.pad_token_id;
    config.problem_type = task.problem_type;
    for (int64_t i = 0; i < task.num_labels; ++i) config.id2label[i] = meta.label_names[static_cast<std::size_t>(i)];
    torch::manual_seed(3);
    loom::models::BertForSequenceClassification model(config);
    model->eval();
    model->save_pretrained(dir / (task.name + "_model"));
    torch::NoGradGuard no_grad;
    const auto got = model->forward(batch);
    const fs::path result = dir / (task.name + "_hf.json");
    const auto [hf_ok, hf_out] = run(peer + " loss " + (dir / (task.name + "_model")).string() + " " + data.string() +
                                     " " + std::to_string(kBatch) + " " + result.string());
    INFO(hf_out);
    REQUIRE(hf_ok);
    const auto hf = loom::json::read_file(result);
    CHECK(hf["problem_type"] == task.problem_type);
    CHECK(hf["labels_dtype"] == (task.kind == LabelKind::class_id ? "torch.int64" : "torch.float32"));
    // The same labels reached both models, and the same logits came out.
    std::vector<double> hf_labels;
    for (const auto& v : hf["labels"].flatten()) hf_labels.push_back(v.get<double>());
    const auto want_labels = torch::tensor(hf_labels, torch::kDouble).view(batch.labels.sizes());
    CHECK(torch::equal(batch.labels.to(torch::kDouble), want_labels));
    std::vector<double> hf_logits;
    for (const auto& row : hf["logits"])
      for (const auto& v : row) hf_logits.push_back(v.get<double>());
    CHECK(torch::allclose(got.logits.to(torch::kDouble),
                          torch::tensor(hf_logits, torch::kDouble).view(got.logits.sizes()), 1e-5, 1e-6));
    const double loss = got.loss.item<double>();
    const double want = hf["loss"].get<double>();
    CAPTURE(loss);
    CAPTURE(want);
    CHECK(std::abs(loss - want) <= 1e-6 * std::max(1.0, std::abs(want)));
  }
}

TEST_CASE("bad float label files, meta.json label fields and JSONL labels give loom: errors naming the file and example") {
  using loom_test::error_of;
  const fs::path dir = loom_test::fresh_dir("data/bad_labels");
  const auto files = loom_test::write_ragged(dir, "c", {{5, 6}, {7}, {8, 9, 10}}, {});
  const auto with_labels = [&](const std::vector<float>& values, LabelKind kind, std::optional<int64_t> num_labels) {
    auto f = files;
    f.labels = dir / "c.labels";
    loom_test::write_bytes(f.labels, f32_bytes(values));
    loom::data::TokenSequenceOptions o;
    o.label_kind = kind;
    o.num_labels = num_labels;
    return error_of([&] { loom::data::TokenSequenceDataset d(f, o); });
  };
  const std::string name = (dir / "c.labels").string();
  CHECK(with_labels({1, 0, 0, 1, 1, 0}, LabelKind::multi_hot, 2) == "<no loom::Error>");
  CHECK(with_labels({0.5f, -1.f, 2.f}, LabelKind::regression, 1) == "<no loom::Error>");
  CHECK(with_labels({1, 0, 0, 1, 1}, LabelKind::multi_hot, 2) ==
        "loom: " + name + ": 20 bytes, expected 6 float32 labels (multi_label_classification: 2 per example, 3 "
        "examples in " + (dir / "c.offsets").string() + ")");
  CHECK(with_labels({1, 0, 0, 0.5f, 1, 0}, LabelKind::multi_hot, 2) ==
        "loom: " + name + ": example 1 has label 0.5 at column 1; multi_label_classification labels are 0 or 1 "
        "(multi-hot)");
  CHECK(with_labels({1, std::nanf(""), 0}, LabelKind::regression, 1) ==
        "loom: " + name + ": example 1 has label nan at column 0; regression labels must be finite");
  CHECK(with_labels({1, 0, std::numeric_limits<float>::infinity(), 0, 0, 0}, LabelKind::regression, 2) ==
        "loom: " + name + ": example 1 has label inf at column 0; regression labels must be finite");
  CHECK(with_labels({1, 0, 1}, LabelKind::regression, std::nullopt) ==
        "loom: TokenSequenceDataset(" + name + "): regression labels need num_labels (the values per example), got none");
  {
    auto f = files;
    f.labels = dir / "c.labels";
    loom::data::TokenSequenceOptions o;
    o.label_kind = LabelKind::multi_hot;
    o.num_labels = 1;
    o.labels_per_token = true;
    CHECK(error_of([&] { loom::data::TokenSequenceDataset d(f, o); }) ==
          "loom: TokenSequenceDataset(" + name + "): multi_label_classification labels are one row per example, not "
          "per token");
  }
  CHECK(error_of([] { (void)loom::data::label_kind("multi_label"); }) ==
        "loom: a problem_type is \"single_label_classification\", \"multi_label_classification\" or \"regression\" "
        "(HF's names), got \"multi_label\"");

  // meta.json: problem_type, label_dtype and label_names.
  const auto meta_error = [&](const std::string& classification) {
    loom_test::write_bytes(dir / "meta.json", "{\"dtype\": \"uint16\", \"vocab_size\": 300, \"classification\": " +
                                                  classification + "}");
    return error_of([&] { (void)loom::data::read_token_meta(dir / "meta.json"); });
  };
  const std::string where = "loom: " + (dir / "meta.json").string() + ": classification: field ";
  CHECK(meta_error("{\"problem_type\": \"regression\", \"label_names\": [\"y\"]}") == "<no loom::Error>");
  CHECK(meta_error("{\"problem_type\": \"multi_label\", \"label_names\": [\"y\"]}") ==
        where + "'problem_type' must be \"single_label_classification\", \"multi_label_classification\" or "
                "\"regression\" (HF's names), got \"multi_label\"");
  CHECK(meta_error("{\"problem_type\": \"regression\", \"label_dtype\": \"int64\", \"label_names\": [\"y\"]}") ==
        where + "'label_dtype' is \"int64\" but problem_type regression stores labels as \"float32\"");
  CHECK(meta_error("{\"label_dtype\": \"float32\"}") ==
        where + "'label_dtype' is \"float32\" but problem_type single_label_classification stores labels as \"int64\"");
  CHECK(meta_error("{\"problem_type\": \"multi_label_classification\"}") ==
        where + "'label_names' must name the multi_label_classification labels (one per value of an example's "
                "label row)");

  // prepare.py: labels of no task, of two tasks, ambiguous lists, rows of two widths.
  const char* py = loom_test::python("prepare.py's label errors");
  if (py == nullptr) return;
  const std::string tool = std::string(py) + " " + (loom_test::source_dir() / "examples/text_data/prepare.py").string();
  const std::vector<std::pair<std::string, std::string>> bad{
      {"{\"text\": \"a b\", \"label\": [1, 0]}\n{\"text\": \"c\", \"label\": [0, 1]}\n",
       "x.jsonl:1: a list of numbers is a multi-hot row or regression targets; say which with --label_type"},
      {"{\"text\": \"a b\", \"label\": \"pos\"}\n{\"text\": \"c\", \"label\": 0.5}\n",
       "x.jsonl:2: a label of another form (number) than the one at"},
      {"{\"text\": \"a b\", \"label\": {\"x\": 1}}\n",
       "x.jsonl:1: field 'label' must be a class name, a number, or a list of names or of numbers"},
      {"{\"text\": \"a b\", \"label\": [1.5, 2]}\n{\"text\": \"c\", \"label\": [0.5]}\n",
       "x.jsonl:2: 1 label values, but"},
      {"{\"text\": \"a b\", \"label\": NaN}\n", "x.jsonl:1: field 'label' holds NaN or infinity"},
      {"{\"text\": \"a b\"}\n", "x.jsonl:1: missing field 'label'"}};
  for (std::size_t k = 0; k < bad.size(); ++k) {
    CAPTURE(k);
    loom_test::write_bytes(dir / "x.jsonl", bad[k].first);
    const auto [ok, out] = run(tool + " --classify " + (dir / "x.jsonl").string() +
                               (k == 3 ? " --label_type regression" : "") + " --out " + (dir / "out").string());
    CHECK_FALSE(ok);
    CHECK(out.find(bad[k].second) != std::string::npos);
  }
  loom_test::write_bytes(dir / "x.jsonl", "{\"text\": \"a\", \"label\": [1, 2]}\n{\"text\": \"b\", \"label\": [0, 1]}\n");
  const auto [ok, out] = run(tool + " --classify " + (dir / "x.jsonl").string() +
                             " --label_type multi_label_classification --out " + (dir / "out").string());
  CHECK_FALSE(ok);
  CHECK(out.find("x.jsonl:1: a multi-hot label holds 0 or 1, got [1, 2]") != std::string::npos);
}
