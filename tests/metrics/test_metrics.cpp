// loom::metrics (metrics/classification.hpp, metrics/regression.hpp) against scikit-learn,
// SciPy, transformers and HF evaluate's formula on the same seeded inputs
// (tests/metrics/metrics_peer.py): precision / recall / F1 under each `average` and
// zero_division, accuracy, token-level inputs with -100, multi-label indicators, regression
// errors, perplexity and exact match; the zero_division warning where sklearn warns; and the
// `loom:` errors of bad input.
#include <loom/core/error.hpp>
#include <loom/metrics/classification.hpp>
#include <loom/metrics/regression.hpp>
#include <loom/metrics/text.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../support.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace metrics_test {

namespace fs = std::filesystem;
using loom::metrics::ClassificationOptions;

/// A tensor as nested JSON lists (doubles or integers).
nlohmann::json nested(const torch::Tensor& t) {
  if (t.dim() == 0) {
    if (t.is_floating_point()) return t.item<double>();
    return t.item<int64_t>();
  }
  auto out = nlohmann::json::array();
  for (int64_t i = 0; i < t.size(0); ++i) out.push_back(nested(t[i]));
  return out;
}

/// What `f` writes to stderr (fd 2) while it runs.
std::string stderr_of(const std::function<void()>& f) {
  const fs::path file = loom_test::fresh_dir("metrics/stderr") / "stderr.txt";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::dup2(fd, 2);
  ::close(fd);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  return loom_test::read_bytes(file);
}

/// Both NaN, or within 1e-12 of each other (the JSON null of the peer is NaN).
bool same(double got, const nlohmann::json& want) {
  if (want.is_null()) return std::isnan(got);
  const double w = want.get<double>();
  return std::abs(got - w) <= 1e-12 * std::max(1.0, std::abs(w));
}

struct MetricCase {
  std::string name, kind;
  torch::Tensor predictions, labels;
  nlohmann::json options = nlohmann::json::object();
};

/// Options with `average`, and one more field set by `set`.
template <class F = void (*)(ClassificationOptions&)>
ClassificationOptions with(std::string average, F set = [](ClassificationOptions&) {}) {
  ClassificationOptions o;
  o.average = std::move(average);
  set(o);
  return o;
}

ClassificationOptions options_of(const nlohmann::json& o) {
  ClassificationOptions c;
  c.average = o.value("average", "binary");
  c.pos_label = o.value("pos_label", int64_t{1});
  if (o.contains("num_labels")) c.num_labels = o["num_labels"].get<int64_t>();
  if (o.contains("zero_division")) {
    c.zero_division = o["zero_division"] == "nan" ? std::nan("") : o["zero_division"].get<double>();
  }
  c.multi_label = o.value("multi_label", false);
  return c;
}

}  // namespace metrics_test

using namespace metrics_test;

TEST_CASE("precision, recall, F1, accuracy and the regression errors equal scikit-learn's on the same inputs") {
  const char* py = loom_test::python("the metrics check against scikit-learn");
  if (py == nullptr) return;
  torch::manual_seed(7);
  std::vector<MetricCase> cases;
  // Single-label, 5 classes, logits (argmax) and ids; every average; 7 labels: two never seen.
  const auto labels5 = torch::randint(0, 5, {40}, torch::kLong);
  const auto logits5 = torch::randn({40, 5}, torch::kDouble) + torch::one_hot(labels5, 5).to(torch::kDouble);
  for (const std::string average : {"micro", "macro", "weighted"}) {
    cases.push_back({"logits_" + average, "prf", logits5, labels5, {{"average", average}}});
    cases.push_back({"ids_" + average, "prf", logits5.argmax(-1), labels5, {{"average", average}}});
    for (const nlohmann::json& zero : {nlohmann::json("warn"), nlohmann::json(0.0), nlohmann::json(1.0),
                                      nlohmann::json("nan")}) {
      nlohmann::json o{{"average", average}, {"num_labels", 7}};
      if (zero != "warn") o["zero_division"] = zero;
      cases.push_back({"absent_" + average + "_" + zero.dump(), "prf", logits5, labels5, o});
    }
  }
  // A class predicted but never true, one true but never predicted (macro sees both).
  const auto skew_labels = torch::tensor({0, 0, 1, 1, 2, 2, 2, 0}, torch::kLong);
  const auto skew_pred = torch::tensor({0, 3, 1, 1, 0, 0, 0, 3}, torch::kLong);
  for (const std::string average : {"micro", "macro", "weighted"})
    cases.push_back({"skew_" + average, "prf", skew_pred, skew_labels, {{"average", average}}});
  // Binary: pos_label 1 and 0; and a run where the positive class is never predicted.
  const auto bin_labels = torch::randint(0, 2, {30}, torch::kLong);
  const auto bin_pred = torch::where(torch::rand({30}).lt(0.7), bin_labels, 1 - bin_labels);
  cases.push_back({"binary_1", "prf", bin_pred, bin_labels, {{"average", "binary"}}});
  cases.push_back({"binary_0", "prf", bin_pred, bin_labels, {{"average", "binary"}, {"pos_label", 0}}});
  cases.push_back({"binary_none_predicted", "prf", torch::zeros({30}, torch::kLong), bin_labels, {{"average", "binary"}}});
  cases.push_back({"binary_float_ids", "prf", bin_pred.to(torch::kFloat), bin_labels.to(torch::kFloat),
                   {{"average", "binary"}}});
  // Token level: labels [6, 9] with -100, logits [6, 9, 4].
  auto token_labels = torch::randint(0, 4, {6, 9}, torch::kLong);
  token_labels.masked_fill_(torch::rand({6, 9}).lt(0.3), -100);
  const auto token_logits = torch::randn({6, 9, 4}, torch::kDouble);
  for (const std::string average : {"micro", "macro", "weighted"})
    cases.push_back({"tokens_" + average, "prf", token_logits, token_labels, {{"average", average}}});
  // Multi-label: [30, 4] indicators (float, as the data gives them), logits; column 3 never set
  // nor predicted (zero_division).
  auto ml_labels = torch::rand({30, 4}).lt(0.4).to(torch::kFloat);
  ml_labels.select(1, 3).zero_();
  auto ml_logits = torch::randn({30, 4}, torch::kDouble) + 2 * ml_labels.to(torch::kDouble) - 1;
  ml_logits.select(1, 3).fill_(-5.0);
  for (const std::string average : {"micro", "macro", "weighted"}) {
    cases.push_back({"multi_" + average, "prf", ml_logits, ml_labels, {{"average", average}, {"multi_label", true}}});
    cases.push_back({"multi_" + average + "_one", "prf", ml_logits, ml_labels,
                     {{"average", average}, {"multi_label", true}, {"zero_division", 1.0}}});
  }
  // Regression: one output and three.
  const auto y1 = torch::randn({50}, torch::kDouble);
  cases.push_back({"regression_1", "regression", y1 + 0.3 * torch::randn({50}, torch::kDouble), y1});
  const auto y3 = torch::randn({50, 3}, torch::kDouble) * torch::tensor({1.0, 5.0, 0.2}, torch::kDouble);
  cases.push_back({"regression_3", "regression", y3 + torch::randn({50, 3}, torch::kDouble), y3});

  const fs::path dir = loom_test::fresh_dir("metrics/sklearn");
  auto list = nlohmann::json::array();
  for (const auto& c : cases)
    list.push_back({{"name", c.name}, {"kind", c.kind}, {"predictions", nested(c.predictions)},
                    {"labels", nested(c.labels)}, {"options", c.options}});
  loom_test::write_bytes(dir / "cases.json", list.dump());
  const std::string cmd = std::string(py) + " " + (loom_test::source_dir() / "tests/metrics/metrics_peer.py").string() +
                          " " + (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1";
  const std::string printed = loom_test::run_capture(cmd);
  INFO(printed);
  REQUIRE(fs::exists(dir / "out.json"));
  const auto want = nlohmann::json::parse(loom_test::read_bytes(dir / "out.json"));
  int64_t warned_cases = 0;
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const auto& w = want.at(c.name);
    if (c.kind == "prf") {
      const auto o = options_of(c.options);
      const auto predictions = o.multi_label ? loom::metrics::multi_label_predictions(c.predictions) : c.predictions;
      loom::metrics::PrecisionRecallF1 got;
      const std::string log = stderr_of([&] { got = loom::metrics::precision_recall_f1(predictions, c.labels, o); });
      CHECK(same(got.precision, w[0]));
      CHECK(same(got.recall, w[1]));
      CHECK(same(got.f1, w[2]));
      CHECK(same(loom::metrics::accuracy(predictions, c.labels, o), w[3]));
      // sklearn warns (UndefinedMetricWarning) exactly where loom logs its warning.
      CHECK((log.find("ill-defined") != std::string::npos) == w[4].get<bool>());
      warned_cases += w[4].get<bool>();
      CHECK(loom::metrics::precision(predictions, c.labels, o) == got.precision);
      CHECK(loom::metrics::recall(predictions, c.labels, o) == got.recall);
      CHECK(loom::metrics::f1(predictions, c.labels, o) == got.f1);
    } else {
      CHECK(same(loom::metrics::mean_squared_error(c.predictions, c.labels), w[0]));
      CHECK(same(loom::metrics::root_mean_squared_error(c.predictions, c.labels), w[1]));
      CHECK(same(loom::metrics::mean_absolute_error(c.predictions, c.labels), w[2]));
      CHECK(same(loom::metrics::r2_score(c.predictions, c.labels), w[3]));
      if (c.labels.dim() == 1) CHECK(same(loom::metrics::pearson(c.predictions, c.labels), w[4]));
    }
  }
  CHECK(warned_cases > 0);  // the zero_division cases reached the warning
}

TEST_CASE("exact match and perplexity equal HF evaluate's formula and transformers' causal-LM shift") {
  const char* py = loom_test::python("the exact match and perplexity check");
  if (py == nullptr) return;
  torch::manual_seed(11);
  std::vector<MetricCase> cases;
  // Sequences: labels [8, 6] with -100 (a row all -100: left out), logits that get some rows right.
  auto seq_labels = torch::randint(0, 5, {8, 6}, torch::kLong);
  seq_labels.masked_fill_(torch::rand({8, 6}).lt(0.3), -100);
  seq_labels[2].fill_(-100);
  auto seq_logits = torch::randn({8, 6, 5}, torch::kDouble);
  for (const int64_t row : {0, 3, 5}) seq_logits[row] += 10 * torch::one_hot(seq_labels[row].clamp_min(0), 5);
  cases.push_back({"sequences", "sequence_exact", seq_logits, seq_labels});
  // Perplexity: a causal LM's logits [3, 7, 11] (shifted) and token logits without shift.
  auto lm_labels = torch::randint(0, 11, {3, 7}, torch::kLong);
  lm_labels.masked_fill_(torch::rand({3, 7}).lt(0.2), -100);
  const auto lm_logits = torch::randn({3, 7, 11}, torch::kDouble);
  cases.push_back({"perplexity_shift", "perplexity", lm_logits, lm_labels, {{"shift", true}}});
  cases.push_back({"perplexity", "perplexity", lm_logits, lm_labels, {{"shift", false}}});

  const std::vector<std::string> predicted{"The cat.", "the cat", "42 dogs!", "Dogs", "in the beginning"};
  const std::vector<std::string> references{"the cat", "The Cat", "7 dogs", "dogs", "In the beginning."};
  const auto strings = [](const std::vector<std::string>& v) { return nlohmann::json(v); };
  const fs::path dir = loom_test::fresh_dir("metrics/exact");
  auto list = nlohmann::json::array();
  for (const auto& c : cases)
    list.push_back({{"name", c.name}, {"kind", c.kind}, {"predictions", nested(c.predictions)},
                    {"labels", nested(c.labels)}, {"options", c.options}});
  std::vector<loom::metrics::ExactMatchOptions> variants;
  for (int bits = 0; bits < 8; ++bits) {
    loom::metrics::ExactMatchOptions o;
    o.ignore_case = (bits & 1) != 0;
    o.ignore_punctuation = (bits & 2) != 0;
    o.ignore_numbers = (bits & 4) != 0;
    variants.push_back(o);
    list.push_back({{"name", "exact_" + std::to_string(bits)}, {"kind", "exact_match"},
                    {"predictions", strings(predicted)}, {"labels", strings(references)},
                    {"options", {{"ignore_case", o.ignore_case}, {"ignore_punctuation", o.ignore_punctuation},
                                 {"ignore_numbers", o.ignore_numbers}}}});
  }
  loom_test::write_bytes(dir / "cases.json", list.dump());
  const std::string printed = loom_test::run_capture(
      std::string(py) + " " + (loom_test::source_dir() / "tests/metrics/metrics_peer.py").string() + " " +
      (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1");
  INFO(printed);
  REQUIRE(fs::exists(dir / "out.json"));
  const auto want = nlohmann::json::parse(loom_test::read_bytes(dir / "out.json"));
  const double seq = loom::metrics::sequence_exact_match(seq_logits, seq_labels);
  CHECK(same(seq, want["sequences"]));
  CHECK(seq >= 3.0 / 7.0);  // the three rows made right are counted (row 2 is left out)
  CHECK(same(loom::metrics::perplexity(lm_logits, lm_labels, true), want["perplexity_shift"]));
  CHECK(same(loom::metrics::perplexity(lm_logits, lm_labels), want["perplexity"]));
  CHECK(loom::metrics::perplexity(std::log(12.5)) == doctest::Approx(12.5).epsilon(1e-14));
  CHECK(std::isinf(loom::metrics::perplexity(1000.0)));  // run_clm's OverflowError -> inf
  for (std::size_t v = 0; v < variants.size(); ++v) {
    CAPTURE(v);
    CHECK(same(loom::metrics::exact_match(predicted, references, variants[v]), want["exact_" + std::to_string(v)]));
  }
}

TEST_CASE("metrics: bad input gives loom: errors") {
  using loom_test::error_of;
  const auto ids = torch::tensor({0, 1, 2, 1}, torch::kLong);
  const auto expect = [](const std::string& message, const std::string& part) {
    CAPTURE(message);
    CHECK(message.rfind("loom: ", 0) == 0);
    CHECK(message.find(part) != std::string::npos);
  };
  expect(error_of([&] { (void)loom::metrics::f1(ids, ids); }), "average \"binary\" takes two classes, got 3");
  expect(error_of([&] { (void)loom::metrics::f1(ids, ids, with("samples")); }), "average is \"binary\"");
  expect(error_of([&] { (void)loom::metrics::f1(torch::zeros({4, 3, 2}), ids, with("macro")); }),
         "fit neither labels of shape [4]");
  expect(error_of([&] { (void)loom::metrics::accuracy(torch::tensor({0.5, 1.0, 2.0, 1.0}), ids); }),
         "not class ids");
  expect(error_of([&] { (void)loom::metrics::f1(ids, ids, with("macro", [](auto& o) { o.num_labels = 2; })); }),
         "outside [0, num_labels 2)");
  expect(error_of([&] { (void)loom::metrics::f1(ids, ids, with("macro", [](auto& o) { o.zero_division = 0.5; })); }),
         "zero_division is 0, 1 or NaN");
  const auto two = torch::tensor({0, 1, 1, 0}, torch::kLong);
  expect(error_of([&] { (void)loom::metrics::f1(two, two, with("binary", [](auto& o) { o.pos_label = 2; })); }), "pos_label 2 is not one of");
  const auto hot = torch::tensor({{0, 1}, {1, 1}}, torch::kLong);
  expect(error_of([&] { (void)loom::metrics::f1(hot, hot, with("binary", [](auto& o) { o.multi_label = true; })); }), "not \"binary\"");
  expect(error_of([&] { (void)loom::metrics::accuracy(hot * 2, hot, with("binary", [](auto& o) { o.multi_label = true; })); }), "must be 0 or 1");
  expect(error_of([&] { (void)loom::metrics::mean_squared_error(torch::zeros({3}), torch::zeros({4})); }),
         "one shape");
  expect(error_of([&] { (void)loom::metrics::pearson(torch::zeros({3, 2}), torch::zeros({3, 2})); }),
         "one output");
  expect(error_of([&] {
           (void)loom::metrics::mean_absolute_error(torch::tensor({1.0, std::nan("")}), torch::tensor({1.0, 2.0}));
         }), "finite");
  const std::vector<std::string> a{"x"}, b{"x", "y"};
  expect(error_of([&] { (void)loom::metrics::exact_match(a, b); }), "1 predictions and 2 references");
  expect(error_of([&] { (void)loom::metrics::rouge_l(a, b); }), "rouge_l got 1 predictions and 2 references");
  expect(error_of([&] { (void)loom::metrics::corpus_bleu(a, {b}); }),
         "corpus_bleu's reference stream 0 holds 2 references for 1 hypotheses");
  expect(error_of([&] { (void)loom::metrics::rouge_tokens("caf\xC3"); }), "rouge's text is not valid UTF-8 (byte 4 of 4)");
  expect(error_of([&] { (void)loom::metrics::bleu_tokenize_13a("\xED\xA0\x80 surrogate"); }),
         "BLEU's text is not valid UTF-8 (byte 1 of 13)");
  expect(error_of([&] { (void)loom::metrics::rouge_n("a", "a", 0); }), "rouge_n takes n >= 1, got 0");
}

TEST_CASE("ROUGE and BLEU equal rouge-score's and sacrebleu's on adversarial text and a random corpus") {
  const char* py = loom_test::python("the ROUGE and BLEU check");
  if (py == nullptr) return;
  // Hand-written hard cases: Unicode spacing Python splits on, emoji, CJK, combining marks,
  // the two characters whose lowercase is ASCII, 13a's HTML entities and <skipped>, numbers
  // with points, commas and dashes, empty and punctuation-only texts.
  std::vector<std::string> predictions{
      "The cat sat on the mat.",
      "the the the the",
      "",
      "!!! ... ,,,",
      "\u0130stanbul \u212Aelvin caf\u00E9 na\u00EFve",
      "3.14, 1,000 and 5-4 = 1; a.b,c 7.-8 x-9",
      "Tom &amp;quot;Jerry&quot; &lt;b&gt; <skipped> hy-\nphen\nnext",
      "\u4F60\u597D\u4E16\u754C hello \u3000world\u00A0ok\u2003em\u0085nel\u001Cfs",
      "e\u0301te\u0301 \U0001F468\u200D\U0001F469\u200D\U0001F467 family \U0001F600!",
      "trailing spaces   \t\n",
      "In the beginning God created the heaven and the earth.",
      "word",
  };
  std::vector<std::string> references{
      "The cat is on the mat",
      "the cat",
      "something",
      "",
      "istanbul kelvin cafe naive",
      "3.14 , 1,000 and 5 - 4 = 1 ; a . b , c",
      "Tom \"Jerry\" <b> hyphen next",
      "\u4F60\u597D hello world ok em nel fs",
      "ete family !",
      "trailing spaces",
      "In the beginning God created the heaven, and the earth.",
      "word",
  };
  // A seeded corpus of sentences drawn from words, numbers and punctuation.
  const std::vector<std::string> pieces{"And", "the", "earth", "was", "without", "form", ",", ".", "void", ";", "God",
                                        "said", "Let", "there", "be", "light", ":", "3.5", "10,000", "2-3", "(", ")",
                                        "'s", "\"", "don't", "e.g.", "\u00E9t\u00E9", "\u4E2D\u6587", "!", "?", "-"};
  std::mt19937 rng(7);
  const auto sentence = [&] {
    std::string out;
    const int words = static_cast<int>(rng() % 14);
    for (int w = 0; w < words; ++w) out += (rng() % 3 == 0 ? "" : " ") + pieces[rng() % pieces.size()];
    return out;
  };
  for (int i = 0; i < 60; ++i) {
    predictions.push_back(sentence());
    references.push_back(rng() % 4 == 0 ? predictions.back() : sentence());
  }
  std::vector<std::string> second;  // a second reference stream
  for (std::size_t i = 0; i < predictions.size(); ++i) second.push_back(i % 5 == 0 ? predictions[i] : sentence());

  const fs::path dir = loom_test::fresh_dir("metrics/text");
  loom_test::write_bytes(dir / "cases.json",
                         nlohmann::json{{"predictions", predictions}, {"references", {references, second}}}.dump());
  const std::string printed = loom_test::run_capture(
      std::string(py) + " " + (loom_test::source_dir() / "tests/metrics/text_peer.py").string() + " " +
      (dir / "cases.json").string() + " " + (dir / "out.json").string() + " 2>&1");
  INFO(printed);
  REQUIRE(fs::exists(dir / "out.json"));
  const auto want = nlohmann::json::parse(loom_test::read_bytes(dir / "out.json"));

  std::vector<std::string> texts = predictions;
  texts.insert(texts.end(), references.begin(), references.end());
  texts.insert(texts.end(), second.begin(), second.end());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    CAPTURE(texts[i]);
    CHECK(loom::metrics::rouge_tokens(texts[i]) == want["rouge_tokens"][i].get<std::vector<std::string>>());
    CHECK(loom::metrics::bleu_tokenize_13a([&] {
            std::string t = texts[i];  // the peer tokenizes t.rstrip(), as corpus_bleu does
            while (!t.empty() && (t.back() == ' ' || t.back() == '\t' || t.back() == '\n')) t.pop_back();
            return t;
          }()) == want["bleu_tokens"][i].get<std::string>());
  }
  double mean_l = 0, mean_1 = 0;
  for (std::size_t i = 0; i < predictions.size(); ++i) {
    CAPTURE(predictions[i]);
    CAPTURE(references[i]);
    const auto& w = want["rouge"][i];
    for (const auto& [name, got] : {std::pair{"rouge1", loom::metrics::rouge_n(references[i], predictions[i], 1)},
                                    std::pair{"rouge2", loom::metrics::rouge_n(references[i], predictions[i], 2)},
                                    std::pair{"rougeL", loom::metrics::rouge_l(references[i], predictions[i])}}) {
      CAPTURE(name);
      CHECK(same(got.precision, w[name][0]));
      CHECK(same(got.recall, w[name][1]));
      CHECK(same(got.fmeasure, w[name][2]));
    }
    mean_l += w["rougeL"][2].get<double>();
    mean_1 += w["rouge1"][2].get<double>();
  }
  const auto n = static_cast<double>(predictions.size());
  CHECK(same(loom::metrics::rouge_l(predictions, references), mean_l / n));
  CHECK(same(loom::metrics::rouge_n(predictions, references, 1), mean_1 / n));
  using Streams = std::vector<std::vector<std::string>>;
  for (const auto& [key, streams] : {std::pair{"bleu_one", Streams{references}},
                                     std::pair{"bleu_all", Streams{references, second}}}) {
    CAPTURE(key);
    const auto got = loom::metrics::corpus_bleu(predictions, streams);
    const auto& w = want[key];
    CHECK(same(got.score, w["score"]));
    CHECK(same(got.brevity_penalty, w["bp"]));
    CHECK(got.hypothesis_length == w["sys_len"].get<int64_t>());
    CHECK(got.reference_length == w["ref_len"].get<int64_t>());
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(same(got.precisions[k], w["precisions"][k]));
      CHECK(got.correct[k] == w["counts"][k].get<int64_t>());
      CHECK(got.total[k] == w["totals"][k].get<int64_t>());
    }
    CHECK(got.score > 5);  // the corpus shares words: a score that could not be 0 by accident
  }
}
