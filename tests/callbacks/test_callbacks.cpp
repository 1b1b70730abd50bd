// Built-in optional callbacks: JsonlLogger (log.jsonl equal to log_history), TensorBoardLogger
// (CRC-32C vectors, record framing and Event encoding checked in C++, then read back by the
// real Python tensorboard package), EarlyStopping (HF's counter, start-up errors, state).
// Each is called directly with hand-built arguments and also run through a real Trainer.
#include <loom/callbacks/early_stopping.hpp>
#include <loom/callbacks/jsonl_logger.hpp>
#include <loom/callbacks/tensorboard.hpp>
#include <loom/loom.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../trainer_support.hpp"

#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace callbacks_test_callbacks {

namespace {

using loom_test::Classifier;
using loom_test::fresh_model;
using loom_test::linear_data;
using loom_test::read_bytes;

std::filesystem::path tmp_dir(const std::string& name) { return loom_test::tmp_dir("callbacks/" + name); }
loom::TrainingArguments quiet_args(const std::string& name) { return loom_test::quiet_args("callbacks/" + name); }

// The arguments of a callback event, built by hand for calling a callback directly.
struct Direct {
  loom::TrainingArguments args;
  loom::TrainerState state;
  loom::TrainerControl control;
};
Direct direct(const std::string& name) {
  Direct d;
  d.args.output_dir = tmp_dir(name).string();
  return d;
}

std::vector<std::string> read_lines(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// ---- a minimal reader of event files, independent of the writer's helpers ---------------

uint64_t get_le(std::string_view s, std::size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

uint64_t get_varint(std::string_view s, std::size_t& at) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(at < s.size());
    const auto b = static_cast<uint8_t>(s[at++]);
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Splits TFRecords, checking both masked CRCs of each.
std::vector<std::string> read_records(const std::string& bytes) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const uint64_t len = get_le(bytes, at, 8);
    CHECK(get_le(bytes, at + 8, 4) == loom::tensorboard::masked_crc32c(std::string_view(bytes).substr(at, 8)));
    REQUIRE(at + 12 + len + 4 <= bytes.size());
    const std::string payload = bytes.substr(at + 12, len);
    CHECK(get_le(bytes, at + 12 + len, 4) == loom::tensorboard::masked_crc32c(payload));
    out.push_back(payload);
    at += 12 + len + 4;
  }
  return out;
}

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version, tag;
  float value = 0;
  bool has_value = false;
};

// Decodes the Event fields the logger writes; fails on any other field.
DecodedEvent decode_event(std::string_view s) {
  DecodedEvent e;
  std::size_t at = 0;
  auto length_delimited = [&](std::string_view buf, std::size_t& pos) {
    const uint64_t n = get_varint(buf, pos);
    REQUIRE(pos + n <= buf.size());
    auto sub = buf.substr(pos, n);
    pos += n;
    return sub;
  };
  while (at < s.size()) {
    const uint64_t key = get_varint(s, at);
    switch (key) {
      case (1 << 3) | 1: e.wall_time = std::bit_cast<double>(get_le(s, at, 8)); at += 8; break;
      case (2 << 3) | 0: e.step = static_cast<int64_t>(get_varint(s, at)); break;
      case (3 << 3) | 2: e.file_version = std::string(length_delimited(s, at)); break;
      case (5 << 3) | 2: {
        auto summary = length_delimited(s, at);
        std::size_t p = 0;
        REQUIRE(get_varint(summary, p) == ((1 << 3) | 2));
        auto value = length_delimited(summary, p);
        CHECK(p == summary.size());  // exactly one Summary.Value
        std::size_t q = 0;
        while (q < value.size()) {
          const uint64_t k = get_varint(value, q);
          if (k == ((1 << 3) | 2)) {
            e.tag = std::string(length_delimited(value, q));
          } else {
            REQUIRE(k == ((2 << 3) | 5));
            e.value = std::bit_cast<float>(static_cast<uint32_t>(get_le(value, q, 4)));
            e.has_value = true;
            q += 4;
          }
        }
        break;
      }
      default: FAIL("unexpected Event field key " << key);
    }
  }
  return e;
}

// Expected (tag -> [(step, value)]) from log_history, as HF's TensorBoardCallback would write.
std::map<std::string, std::vector<std::pair<int64_t, float>>> expected_scalars(
    const std::vector<nlohmann::ordered_json>& history) {
  std::map<std::string, std::vector<std::pair<int64_t, float>>> out;
  for (const auto& entry : history) {
    const int64_t step = entry["step"].get<int64_t>();
    for (auto it = entry.begin(); it != entry.end(); ++it) {
      if (it.key() == "step") continue;
      out[loom::tensorboard::tag_for(it.key())].emplace_back(step, static_cast<float>(it.value().get<double>()));
    }
  }
  return out;
}

// Reads an event file with the real tensorboard package; nullopt (and a MESSAGE) without LOOM_PYTHON.
std::optional<nlohmann::json> read_with_tensorboard(const std::filesystem::path& event_file) {
  const char* python = loom_test::python("the read-back by Python's tensorboard package");
  if (python == nullptr) return std::nullopt;
  const auto script = loom_test::tmp_root() / "callbacks" / "read_events.py";
  {
    std::ofstream py(script);
    py << "import json, sys\n"
          "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
          "ea = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})\n"
          "ea.Reload()\n"
          "out = {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()['scalars']}\n"
          "print(json.dumps(out))\n";
  }
  const std::string cmd =
      "\"" + std::string(python) + "\" \"" + script.string() + "\" \"" + event_file.string() + "\" 2>/dev/null";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe)) text.append(buf, n);
  const int rc = ::pclose(pipe);
  INFO("python output: " << text);
  REQUIRE(rc == 0);
  return nlohmann::json::parse(text);
}

// The scalars tensorboard read equal, tag by tag and point by point, those of log_history.
void check_same_scalars(const nlohmann::json& read,
                        const std::map<std::string, std::vector<std::pair<int64_t, float>>>& expected) {
  CHECK(read.size() == expected.size());
  for (const auto& [tag, points] : expected) {
    INFO("tag " << tag);
    REQUIRE(read.contains(tag));
    const auto& got = read[tag];
    REQUIRE(got.size() == points.size());
    for (std::size_t i = 0; i < points.size(); ++i) {
      CHECK(got[i][0].get<int64_t>() == points[i].first);
      CHECK(got[i][1].get<double>() == doctest::Approx(points[i].second).epsilon(1e-6));
    }
  }
}

}  // namespace

// ===================================== TensorBoard format =================================

TEST_CASE("CRC-32C matches the published check values and TFRecord masking") {
  using loom::tensorboard::crc32c;
  CHECK(crc32c("123456789") == 0xE3069283U);
  CHECK(crc32c("") == 0U);
  // RFC 3720 (iSCSI) B.4 vectors.
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAU);
  CHECK(crc32c(std::string(32, '\xff')) == 0x62A8AB43U);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(crc32c(ascending) == 0x46DD794EU);
  // Continuing a checksum equals checksumming the concatenation.
  CHECK(crc32c("6789", crc32c("12345")) == 0xE3069283U);
  const uint32_t c = 0xE3069283U;
  CHECK(loom::tensorboard::masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8U);
}

TEST_CASE("TFRecord framing and Event encoding decode back to what was written") {
  using namespace loom::tensorboard;
  const std::string ev = scalar_event(1700000000.25, 300, "train/loss", 0.75f);
  // Hand-checked prefix: key 0x09 + 8 bytes of wall_time, key 0x10 + varint 300 (0xac 0x02).
  REQUIRE(ev.size() > 12);
  CHECK(static_cast<uint8_t>(ev[0]) == 0x09);
  CHECK(static_cast<uint8_t>(ev[9]) == 0x10);
  CHECK(static_cast<uint8_t>(ev[10]) == 0xac);
  CHECK(static_cast<uint8_t>(ev[11]) == 0x02);
  CHECK(static_cast<uint8_t>(ev[12]) == 0x2a);
  const std::string bytes = frame_record(file_version_event(1.5)) + frame_record(ev);
  CHECK(get_le(bytes, 0, 8) == file_version_event(1.5).size());
  const auto records = read_records(bytes);
  REQUIRE(records.size() == 2);
  const auto first = decode_event(records[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK(first.wall_time == 1.5);
  const auto second = decode_event(records[1]);
  CHECK(second.wall_time == 1700000000.25);
  CHECK(second.step == 300);
  CHECK(second.tag == "train/loss");
  CHECK(second.value == 0.75f);
  // A flipped payload byte breaks the payload CRC.
  std::string corrupt = frame_record(ev);
  corrupt[20] ^= 0x01;
  CHECK(get_le(corrupt, 12 + ev.size(), 4) != masked_crc32c(std::string_view(corrupt).substr(12, ev.size())));
}

TEST_CASE("tags follow HF's rewrite_logs") {
  using loom::tensorboard::tag_for;
  CHECK(tag_for("loss") == "train/loss");
  CHECK(tag_for("learning_rate") == "train/learning_rate");
  CHECK(tag_for("eval_loss") == "eval/loss");
  CHECK(tag_for("eval_accuracy") == "eval/accuracy");
  CHECK(tag_for("test_f1") == "test/f1");
  CHECK(tag_for("train_runtime") == "train/train_runtime");
  CHECK(tag_for("evaluation") == "train/evaluation");
}

TEST_CASE("TensorBoardLogger called directly writes one file tensorboard reads back") {
  auto [args, state, control] = direct("tb_direct");
  loom::TensorBoardLogger tb;
  tb.on_train_begin(args, state, control);
  REQUIRE(tb.is_open());
  const auto file = tb.path();
  CHECK(file.parent_path() == std::filesystem::path(args.output_dir) / "runs");
  CHECK(file.filename().string().starts_with("events.out.tfevents."));
  std::vector<nlohmann::ordered_json> history;
  for (int64_t step : {5, 10}) {
    state.global_step = step;
    loom::Metrics logs{{"loss", 1.0 / static_cast<double>(step)}, {"learning_rate", 1e-3 * step}, {"epoch", 0.1 * step}};
    tb.on_log(args, state, control, logs);
    state.append_log(logs);
    history.push_back(state.log_history.back());
  }
  state.global_step = 10;
  loom::Metrics eval{{"eval_loss", 0.5}, {"eval_accuracy", 0.875}, {"test_f1", 0.25}};
  tb.on_log(args, state, control, eval);
  state.append_log(eval);
  history.push_back(state.log_history.back());
  tb.on_train_end(args, state, control);
  CHECK_FALSE(tb.is_open());

  // C++ side: first record is the file version, then one Event per metric.
  const auto records = read_records(read_bytes(file));
  REQUIRE(records.size() == 1 + 3 + 3 + 3);
  CHECK(decode_event(records[0]).file_version == "brain.Event:2");
  const auto e1 = decode_event(records[1]);
  CHECK(e1.tag == "train/loss");
  CHECK(e1.step == 5);
  CHECK(e1.value == 0.2f);
  CHECK(e1.wall_time > 1.6e9);
  const auto e9 = decode_event(records[9]);
  CHECK(e9.tag == "test/f1");
  CHECK(e9.step == 10);
  CHECK(e9.value == 0.25f);

  if (auto read = read_with_tensorboard(file)) check_same_scalars(*read, expected_scalars(history));

  // Other processes write nothing; logging_dir is honoured.
  args.logging_dir = (std::filesystem::path(args.output_dir) / "tb").string();
  loom::TensorBoardLogger other;
  state.is_world_process_zero = false;
  other.on_train_begin(args, state, control);
  other.on_log(args, state, control, eval);
  CHECK_FALSE(other.is_open());
  CHECK_FALSE(std::filesystem::exists(*args.logging_dir));
  state.is_world_process_zero = true;
  other.on_log(args, state, control, eval);  // opens lazily, as HF's callback
  CHECK(other.path().parent_path() == std::filesystem::path(*args.logging_dir));
  CHECK(read_records(read_bytes(other.path())).size() == 4);
}

TEST_CASE("TensorBoardLogger: an event file that cannot be created is a loom::Error naming it") {
  auto [args, state, control] = direct("tb_blocked");
  const std::filesystem::path dir(args.output_dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  args.logging_dir = (dir / "file" / "runs").string();  // below a regular file
  loom::TensorBoardLogger tb;
  CHECK_THROWS_WITH_AS(tb.on_train_begin(args, state, control),
                       doctest::Contains((dir / "file" / "runs").string().c_str()), loom::Error);
}

// ======================================== JSONL ==========================================

TEST_CASE("JsonlLogger called directly appends one line per log, main process only") {
  auto [args, state, control] = direct("jsonl_direct");
  loom::JsonlLogger j;
  j.on_train_begin(args, state, control);
  REQUIRE(j.is_open());
  CHECK(j.path() == std::filesystem::path(args.output_dir) / "log.jsonl");
  state.global_step = 3;
  j.on_log(args, state, control, {{"loss", 0.125}, {"epoch", 0.5}});
  // Flushed line by line: readable before on_train_end.
  auto lines = read_lines(j.path());
  REQUIRE(lines.size() == 1);
  auto first = nlohmann::ordered_json::parse(lines[0]);
  std::vector<std::string> keys;
  for (auto it = first.begin(); it != first.end(); ++it) keys.push_back(it.key());
  CHECK(keys == std::vector<std::string>{"loss", "epoch", "step"});
  CHECK(first["loss"].get<double>() == 0.125);
  CHECK(first["step"].get<int64_t>() == 3);
  j.on_train_end(args, state, control);
  CHECK_FALSE(j.is_open());

  // Append mode: a second run adds to the file; a non-main process adds nothing.
  loom::JsonlLogger again;
  again.on_train_begin(args, state, control);
  state.global_step = 4;
  again.on_log(args, state, control, {{"eval_loss", 1.0 / 3.0}});
  state.is_world_process_zero = false;
  again.on_log(args, state, control, {{"eval_loss", 9.0}});
  again.on_train_end(args, state, control);
  lines = read_lines(j.path());
  REQUIRE(lines.size() == 2);
  CHECK(nlohmann::json::parse(lines[1])["eval_loss"].get<double>() == 1.0 / 3.0);  // exact round trip

  // Configurable file name; an unopenable file is a loom::Error naming it.
  loom::JsonlLogger named;
  named.file_name = "metrics/history.jsonl";
  state.is_world_process_zero = true;
  named.on_train_begin(args, state, control);
  CHECK(std::filesystem::exists(std::filesystem::path(args.output_dir) / "metrics" / "history.jsonl"));
  loom::JsonlLogger blocked;
  blocked.file_name = "log.jsonl/x";  // below a regular file
  CHECK_THROWS_WITH_AS(blocked.on_train_begin(args, state, control),
                       doctest::Contains((std::filesystem::path(args.output_dir) / "log.jsonl" / "x").string().c_str()),
                       loom::Error);
}

// ================================ through a real Trainer ==================================

TEST_CASE("a Trainer run: log.jsonl equals log_history; tensorboard reads the same scalars") {
  auto args = quiet_args("trainer_loggers");
  args.learning_rate = 0.05;
  args.max_steps = 12;
  args.logging_steps = 4;
  args.eval_strategy = "steps";
  args.eval_steps = 6;
  args.per_device_train_batch_size = 16;
  Classifier<loom::Callbacks<loom::JsonlLogger, loom::TensorBoardLogger>> t(args, fresh_model(), linear_data(128, 1),
                                                                             linear_data(40, 2));
  t.train();
  const auto& history = t.state().log_history;
  REQUIRE(history.size() == 3 + 2 + 1);  // loss at 4, 8, 12; eval at 6, 12; train metrics

  const auto lines = read_lines(std::filesystem::path(args.output_dir) / "log.jsonl");
  REQUIRE(lines.size() == history.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    INFO("line " << i << ": " << lines[i]);
    CHECK(nlohmann::ordered_json::parse(lines[i]) == history[i]);
  }

  auto& tb = t.callback<loom::TensorBoardLogger>();
  CHECK_FALSE(tb.is_open());
  const auto file = tb.path();
  CHECK(file.parent_path() == std::filesystem::path(args.output_dir) / "runs");
  const auto expected = expected_scalars(history);
  CHECK(expected.at("train/loss").size() == 3);
  CHECK(expected.at("eval/accuracy").size() == 2);
  // C++ read: every record valid, one per logged number, in log order.
  const auto records = read_records(read_bytes(file));
  std::size_t numbers = 0;
  for (const auto& e : history) numbers += e.size() - 1;
  REQUIRE(records.size() == 1 + numbers);
  std::size_t r = 1;
  for (const auto& e : history)
    for (auto it = e.begin(); it != e.end(); ++it) {
      if (it.key() == "step") continue;
      const auto ev = decode_event(records[r++]);
      CHECK(ev.tag == loom::tensorboard::tag_for(it.key()));
      CHECK(ev.step == e["step"].get<int64_t>());
      CHECK(ev.value == static_cast<float>(it.value().get<double>()));
    }
  if (auto read = read_with_tensorboard(file)) check_same_scalars(*read, expected);
}

// ==================================== EarlyStopping ======================================

namespace {

// Feeds `values` of eval_<metric> to a fresh EarlyStopping; returns the 1-based evaluation
// at which it set should_training_stop (0: never) and the final counter.
std::pair<int, int64_t> run_early_stopping(const loom::TrainingArguments& args, int64_t patience, double threshold,
                                           const std::vector<double>& values, loom::TrainerState* state_in = nullptr) {
  loom::EarlyStopping es;
  es.patience = patience;
  es.threshold = threshold;
  loom::TrainerState local;
  loom::TrainerState& state = state_in ? *state_in : local;
  loom::TrainerControl control;
  es.on_train_begin(args, state, control);
  const std::string key = loom::EarlyStopping::metric_key(*args.metric_for_best_model);
  for (std::size_t i = 0; i < values.size(); ++i) {
    loom::Metrics m{{"eval_runtime", 1.0}};
    m.set(key, values[i]);
    es.on_evaluate(args, state, control, m);
    if (control.should_training_stop) return {static_cast<int>(i + 1), es.patience_counter()};
  }
  return {0, es.patience_counter()};
}

loom::TrainingArguments es_args(const std::string& metric, std::optional<bool> greater = std::nullopt) {
  loom::TrainingArguments a;
  a.eval_strategy = "steps";
  a.metric_for_best_model = metric;
  a.greater_is_better = greater;
  return a;
}

}  // namespace

TEST_CASE("EarlyStopping: patience and threshold, lower is better (loss)") {
  const auto args = es_args("loss");  // greater_is_better unset: "loss" -> lower is better
  CHECK_FALSE(loom::EarlyStopping::greater_is_better(args));
  // Improves, improves, then two non-improvements: patience 2 stops at the 4th evaluation.
  CHECK(run_early_stopping(args, 2, 0.0, {1.0, 0.9, 0.95, 0.9}).first == 4);
  // An improvement resets the counter.
  CHECK(run_early_stopping(args, 2, 0.0, {1.0, 1.1, 0.8, 0.85, 0.7, 0.75}) == std::pair<int, int64_t>{0, 1});
  // Patience 1 stops at the first non-improvement; equal counts as no improvement.
  CHECK(run_early_stopping(args, 1, 0.0, {1.0, 0.5, 0.5}).first == 3);
  // Threshold: improvements of 0.05 do not beat a threshold of 0.1 ...
  CHECK(run_early_stopping(args, 3, 0.1, {1.0, 0.95, 0.9, 0.85}).first == 4);
  // ... but one of 0.3 does (the best moved on with each small improvement: 0.9 -> 0.6).
  CHECK(run_early_stopping(args, 3, 0.1, {1.0, 0.95, 0.9, 0.6, 0.55}) == std::pair<int, int64_t>{0, 1});
  // Metric named with the prefix already.
  CHECK(run_early_stopping(es_args("eval_loss"), 1, 0.0, {1.0, 2.0}).first == 2);
}

TEST_CASE("EarlyStopping: higher is better (accuracy, or greater_is_better forced)") {
  const auto args = es_args("accuracy");
  CHECK(loom::EarlyStopping::greater_is_better(args));
  CHECK(run_early_stopping(args, 2, 0.0, {0.5, 0.6, 0.55, 0.6}).first == 4);
  CHECK(run_early_stopping(args, 2, 0.0, {0.5, 0.4, 0.7, 0.6}) == std::pair<int, int64_t>{0, 1});
  CHECK(run_early_stopping(args, 2, 0.05, {0.5, 0.52, 0.54}).first == 3);
  CHECK(run_early_stopping(args, 1, 0.0, {0.5, 0.6, 0.7, 0.8}) == std::pair<int, int64_t>{0, 0});
  // greater_is_better false on a non-loss name: now falling values are the improvement.
  const auto lower = es_args("perplexity", false);
  CHECK(run_early_stopping(lower, 1, 0.0, {10.0, 9.0, 8.0}) == std::pair<int, int64_t>{0, 0});
  CHECK(run_early_stopping(lower, 1, 0.0, {10.0, 11.0}).first == 2);
}

TEST_CASE("EarlyStopping uses state.best_metric when the trainer set it") {
  const auto args = es_args("loss");
  loom::TrainerState state;
  state.best_metric = 0.1;  // a better value than anything fed below
  CHECK(run_early_stopping(args, 2, 0.0, {0.5, 0.4}, &state).first == 2);
  // Without it, the callback's own record: the first evaluation never counts.
  CHECK(run_early_stopping(args, 2, 0.0, {0.5, 0.4}).first == 0);
}

TEST_CASE("EarlyStopping: a missing metric disables it, as HF") {
  const auto args = es_args("f1");
  loom::EarlyStopping es;
  loom::TrainerState state;
  loom::TrainerControl control;
  for (int i = 0; i < 3; ++i) es.on_evaluate(args, state, control, {{"eval_loss", 1.0}});
  CHECK_FALSE(control.should_training_stop);
  CHECK(es.patience_counter() == 0);
  CHECK_FALSE(es.best_metric().has_value());
}

TEST_CASE("EarlyStopping: start-up errors are loom::Error lines") {
  loom::TrainerState state;
  loom::TrainerControl control;
  loom::EarlyStopping es;
  loom::TrainingArguments no_metric;
  no_metric.eval_strategy = "steps";
  CHECK_THROWS_WITH_AS(es.on_train_begin(no_metric, state, control),
                       doctest::Contains("loom: EarlyStopping requires --metric_for_best_model"), loom::Error);
  loom::TrainingArguments no_eval;
  no_eval.metric_for_best_model = "loss";
  CHECK_THROWS_WITH_AS(es.on_train_begin(no_eval, state, control),
                       doctest::Contains("loom: EarlyStopping requires evaluation"), loom::Error);
  CHECK_NOTHROW(es.on_train_begin(es_args("loss"), state, control));

  // Through the Trainer: the error surfaces from train().
  auto args = quiet_args("es_no_eval");
  args.max_steps = 2;
  Classifier<loom::Callbacks<loom::EarlyStopping>> t(args, fresh_model(), linear_data(32, 3));
  CHECK_THROWS_WITH_AS(t.train(), doctest::Contains("loom: EarlyStopping requires --metric_for_best_model"),
                       loom::Error);
}

TEST_CASE("EarlyStopping: state() has HF's shape and round-trips") {
  const auto args = es_args("loss");
  loom::EarlyStopping es;
  es.patience = 3;
  es.threshold = 0.01;
  loom::TrainerState state;
  loom::TrainerControl control;
  for (double v : {1.0, 0.5, 0.6}) es.on_evaluate(args, state, control, {{"eval_loss", v}});
  REQUIRE(es.patience_counter() == 1);
  const auto j = es.state();
  CHECK(j["args"]["early_stopping_patience"] == 3);
  CHECK(j["args"]["early_stopping_threshold"] == 0.01);
  CHECK(j["attributes"]["early_stopping_patience_counter"] == 1);
  CHECK(j["attributes"]["early_stopping_best_metric"] == 0.5);

  loom::EarlyStopping restored;
  restored.load_state(nlohmann::json::parse(j.dump()));
  CHECK(restored.patience == 3);
  CHECK(restored.threshold == 0.01);
  CHECK(restored.patience_counter() == 1);
  CHECK(restored.best_metric() == std::optional<double>(0.5));
  CHECK(restored.state() == j);
  // The restored counter continues: two more non-improvements reach patience 3.
  loom::TrainerControl c2;
  restored.on_evaluate(args, state, c2, {{"eval_loss", 0.55}});
  CHECK_FALSE(c2.should_training_stop);
  restored.on_evaluate(args, state, c2, {{"eval_loss", 0.495}});  // better, but by less than 0.01
  CHECK(c2.should_training_stop);

  // HF's own state (no best value; threshold may be null) loads too; garbage does not.
  loom::EarlyStopping from_hf;
  from_hf.load_state(nlohmann::json::parse(
      R"({"args": {"early_stopping_patience": 5, "early_stopping_threshold": null},
          "attributes": {"early_stopping_patience_counter": 2}})"));
  CHECK(from_hf.patience == 5);
  CHECK(from_hf.threshold == 0.0);
  CHECK(from_hf.patience_counter() == 2);
  CHECK_FALSE(from_hf.best_metric().has_value());
  CHECK_THROWS_WITH_AS(from_hf.load_state(nlohmann::json::parse(R"({"args": {}})")),
                       doctest::Contains("loom: invalid EarlyStopping state"), loom::Error);
}

TEST_CASE("TrainerControl's state is HF's ExportableState entry; a bad entry is a loom: error") {
  loom::TrainerControl c;
  c.should_save = true;
  c.should_log = true;
  const auto j = c.state();
  CHECK(j.dump() == R"({"args":{"should_training_stop":false,"should_epoch_stop":false,"should_save":true,)"
                    R"("should_evaluate":false,"should_log":true},"attributes":{}})");
  const auto back = loom::TrainerControl::from_state(nlohmann::json::parse(j.dump()));
  CHECK(back.should_save);
  CHECK(back.should_log);
  CHECK_FALSE(back.should_evaluate);
  CHECK_FALSE(back.should_training_stop);
  CHECK_THROWS_WITH_AS(loom::TrainerControl::from_state(nlohmann::json::parse(
                           R"({"args": {"should_training_stop": false, "should_epoch_stop": false,
                                        "should_save": 1, "should_evaluate": false, "should_log": false}})")),
                       doctest::Contains("loom: trainer_state.json: stateful_callbacks.TrainerControl.args.should_save "
                                         "is missing or not a boolean"),
                       loom::Error);
  CHECK_THROWS_WITH_AS(loom::TrainerControl::from_state(nlohmann::json::parse("[]")),
                       doctest::Contains("has no \"args\" object"), loom::Error);
}

TEST_CASE("EarlyStopping in a Trainer run stops when eval_loss stops improving") {
  auto args = quiet_args("es_trainer");
  args.learning_rate = 0.0;  // the model never changes: eval_loss never improves
  args.max_steps = 20;
  args.logging_steps = 1;
  args.eval_strategy = "steps";
  args.eval_steps = 1;
  args.metric_for_best_model = "loss";
  args.per_device_train_batch_size = 8;
  Classifier<loom::Callbacks<loom::EarlyStopping>> t(args, fresh_model(), linear_data(64, 4), linear_data(16, 5));
  t.callback<loom::EarlyStopping>().patience = 2;
  const auto out = t.train();
  // Eval 1 sets the best, evals 2 and 3 do not improve: patience 2 is reached at step 3.
  CHECK(out.global_step == 3);
  CHECK(t.state().global_step == 3);
  CHECK(t.callback<loom::EarlyStopping>().patience_counter() == 2);
  int evals = 0;
  for (const auto& e : t.state().log_history) evals += e.contains("eval_loss") ? 1 : 0;
  CHECK(evals == 3);

  // The same run with a learning rate that improves eval_loss goes to max_steps.
  auto learning = quiet_args("es_trainer_learning");
  learning.learning_rate = 0.05;
  learning.max_steps = 8;
  learning.logging_steps = 4;
  learning.eval_strategy = "steps";
  learning.eval_steps = 2;
  learning.metric_for_best_model = "loss";
  Classifier<loom::Callbacks<loom::EarlyStopping>> t2(learning, fresh_model(), linear_data(256, 4), linear_data(64, 5));
  CHECK(t2.train().global_step == 8);
  CHECK(t2.callback<loom::EarlyStopping>().patience_counter() == 0);
}

}  // namespace callbacks_test_callbacks
