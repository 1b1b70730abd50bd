// Iterable datasets (data/iterable.hpp, data/token_stream.hpp): each rank's slice of a stream
// against accelerate's IterableDatasetShard, the Trainer on a stream with --max_steps (and the
// loom: line without it), a resume that seeks instead of replaying and ends bitwise where an
// uninterrupted run does, and a token file larger than the process's memory limit read whole
// through its mapping. The 2-rank resume is dist.stream (tests/dist/main.cpp, --task stream).

#include <doctest/doctest.h>

#include "../trainer_support.hpp"

#include <loom/data/token_stream.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

// A namespace of its own: the Trainer test files build as a few unity units (tests/CMakeLists.txt).
namespace data_test_iterable {

namespace {

namespace fs = std::filesystem;
using loom_test::Batch;

struct Value {
  torch::Tensor v;  // int64, 0-dim: the example's index
};

// The stream 0, 1, ..., n - 1 (the same every epoch).
auto counting(int64_t n) {
  return loom::data::from_generator([n](int64_t, int64_t i) -> std::optional<Value> {
    if (i >= n) return std::nullopt;
    return Value{torch::tensor(i)};
  });
}

// Every batch rank `rank` of `world` reads from counting(n) in one epoch, as lists.
std::vector<std::vector<int64_t>> shard_batches(int64_t n, int64_t batch, int64_t rank, int64_t world, bool drop_last) {
  auto s = counting(n);
  s.set_epoch(0);
  std::vector<std::vector<int64_t>> out;
  while (auto b = loom::data::read_shard(s, 0, batch, rank, world, drop_last)) {
    const auto v = b->v.contiguous();
    out.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel());
  }
  return out;
}

// `n` rows of argmax_data(n, 3, 6) as a stream whose order is a permutation seeded on the
// epoch (a stream that shuffles, keyed on set_epoch); every example read is recorded.
struct Calls {
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> read;  // (epoch, index) of each example made
};
auto shuffled_rows(int64_t n, std::shared_ptr<Calls> calls) {
  const auto rows = loom_test::argmax_data(n, 3, 6).tensors();
  return loom::data::from_generator([rows, n, calls](int64_t epoch, int64_t i) -> std::optional<Batch> {
    if (i >= n) return std::nullopt;
    {
      std::lock_guard lock(calls->mutex);
      calls->read.emplace_back(epoch, i);
    }
    const int64_t row = loom::data::seeded_permutation(n, 17, epoch)[i].item<int64_t>();
    return Batch{rows.x[row], rows.labels[row]};
  });
}

using StreamTrainer = loom_test::Mlp6Trainer<>;
using loom_test::fresh_mlp6;
using loom_test::losses_of;

// 45 rows in batches of 4 with 2 micro-batches a step: 12 batches an epoch (the last of one
// row), so an epoch is 6 steps (the last of 2 batches, one of them short) and 14 steps run 2
// epochs and part of a third. Checkpoints every step.
loom::TrainingArguments stream_args(const std::string& name) {
  auto a = loom_test::resume_args(name, 4, 14);
  a.save_strategy = "steps";
  a.save_steps = 1;
  return a;
}
constexpr int64_t kRows = 45;

// The log history without its times: step, epoch, loss, eval_loss, grad_norm, learning_rate.
nlohmann::json history(const loom::TrainerState& s) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& e : s.log_history) {
    nlohmann::json kept;
    for (const char* key : {"step", "epoch", "loss", "eval_loss", "grad_norm", "learning_rate"})
      if (e.contains(key)) kept[key] = e.at(key);
    out.push_back(kept);
  }
  return out;
}

bool bitwise_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// The VmRSS-style field `key` ("RssAnon:", "VmHWM:") of /proc/self/status, in KiB.
int64_t status_kib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return -1;
}

}  // namespace

TEST_CASE("each rank's slice of a stream is accelerate's IterableDatasetShard's") {
  // Batches of 1 or 3 ranks, chunks that end short (filled from the epoch's start, or dropped),
  // streams shorter than one chunk.
  struct Case {
    int64_t n, batch, world;
    bool drop_last;
  };
  const std::vector<Case> cases{{10, 2, 2, false}, {10, 2, 2, true}, {3, 2, 2, false}, {23, 3, 3, false},
                                {23, 3, 3, true},  {5, 4, 3, false}, {7, 2, 1, false}, {7, 2, 1, true}};
  // The same slices, cut into batches as HF's DataLoader does over the shard (one rank: the plain DataLoader).
  const char* py = loom_test::python("accelerate's IterableDatasetShard");
  for (const auto& c : cases) {
    CAPTURE(c.n);
    CAPTURE(c.batch);
    CAPTURE(c.world);
    CAPTURE(c.drop_last);
    for (int64_t r = 0; r < c.world; ++r) {
      const auto got = shard_batches(c.n, c.batch, r, c.world, c.drop_last);
      if (!py) continue;
      std::ostringstream cmd;
      cmd << py << " -c \"import json, torch; from accelerate.data_loader import IterableDatasetShard; "
          << "d = range(" << c.n << "); d = IterableDatasetShard(d, batch_size=" << c.batch
          << ", num_processes=" << c.world << ", process_index=" << r << ", drop_last=" << (c.drop_last ? "True" : "False")
          << ") if " << c.world << " > 1 else d; "
          << "print(json.dumps([b.tolist() for b in torch.utils.data.DataLoader(list(d) if " << c.world
          << " > 1 else torch.arange(" << c.n << "), batch_size=" << c.batch
          << ", drop_last=" << (c.drop_last ? "True" : "False") << ")]))\"";
      const auto want = nlohmann::json::parse(loom_test::run_capture(cmd.str())).get<std::vector<std::vector<int64_t>>>();
      CHECK(got == want);
    }
  }
}

TEST_CASE("a DataLoader over a stream has no length, reads in order and seeks to a recorded position") {
  loom::data::DataLoader<Value> loader(loom::data::AnyStream<Value>(counting(10)), 3, false);
  CHECK_FALSE(loader.has_length());
  CHECK(loom_test::error_of([&] { (void)loader.size(); }).find("loom: a DataLoader over a stream") == 0);
  loader.set_epoch(0);
  CHECK(loader.batch(0).v[0].item<int64_t>() == 0);
  CHECK(loader.batch(1).v[0].item<int64_t>() == 3);
  CHECK(loom_test::error_of([&] { (void)loader.batch(5); }).find("read in order") != std::string::npos);
  const auto position = loader.position_after(1);
  CHECK(loader.batch(2).v[0].item<int64_t>() == 6);
  CHECK(loader.batch(3).v.numel() == 1);  // the short last batch
  CHECK_FALSE(loader.try_batch(4).has_value());

  loom::data::DataLoader<Value> resumed(loom::data::AnyStream<Value>(counting(10)), 3, false);
  resumed.seek(position);
  resumed.set_epoch(0);  // keeps the place
  CHECK(resumed.batch(2).v[0].item<int64_t>() == 6);
  resumed.set_epoch(1);  // a new epoch starts at the stream's beginning
  CHECK(resumed.batch(0).v[0].item<int64_t>() == 0);
}

TEST_CASE("a TokenStream reads a token file's windows in order, each rank its slice, and seeks") {
  const auto dir = loom_test::fresh_dir("iterable/token_stream");
  std::vector<uint16_t> ids(1000);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<uint16_t>((i * 7919) % 50000);
  loom_test::write_bytes(dir / "train.bin",
                         std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t)));
  const loom::data::TokenFileOptions opts{.dtype = loom::data::TokenDtype::uint16, .block_size = 16, .stride = {}, .vocab_size = {}};
  const loom::data::TokenFileDataset windows(dir / "train.bin", opts);  // 62 windows
  loom::data::TokenStream stream(dir / "train.bin", opts);
  CHECK(stream.windows() == windows.size());
  // Two ranks, batches of 3: rank r holds windows 6k + 3r .. 6k + 3r + 2 of each chunk.
  for (int64_t r = 0; r < 2; ++r) {
    loom::data::DataLoader<loom::data::CausalLMBatch> loader(loom::data::AnyStream<loom::data::CausalLMBatch>(stream),
                                                             3, true, {r, 2});
    loader.set_epoch(0);
    int64_t k = 0;
    while (auto b = loader.try_batch(k)) {
      std::vector<int64_t> idx{6 * k + 3 * r, 6 * k + 3 * r + 1, 6 * k + 3 * r + 2};
      const auto want = windows.get_batch(idx);
      CHECK(torch::equal(b->input_ids, want.input_ids));
      CHECK(torch::equal(b->labels, want.labels));
      ++k;
    }
    CHECK(k == windows.size() / 6);  // drop_last: the last short chunk is dropped
  }
  stream.set_epoch(0);
  CHECK(stream.skip(5) == 5);
  const auto state = stream.state_dict();
  const auto sixth = stream.next()->input_ids;
  loom::data::TokenStream other(dir / "train.bin", opts);
  other.load_state_dict(state);
  CHECK(torch::equal(other.next()->input_ids, sixth));
  CHECK(torch::equal(sixth, windows.get_batch(std::vector<int64_t>{5}).input_ids[0]));
  CHECK(loom_test::error_of([&] { other.load_state_dict({{"window", 63}}); }).find("outside its 62 windows") !=
        std::string::npos);
}

TEST_CASE("the Trainer trains on a stream with --max_steps; without it, one loom: line at start-up") {
  auto calls = std::make_shared<Calls>();
  auto args = stream_args("iterable/no_max_steps");
  args.max_steps = -1;
  const auto err = loom_test::error_of([&] { StreamTrainer t(args, fresh_mlp6(), shuffled_rows(kRows, calls)); });
  CHECK(err.find("loom: the training dataset is a stream") == 0);
  CHECK(err.find("--max_steps") != std::string::npos);
  CHECK(err.find('\n') == std::string::npos);

  args = stream_args("iterable/group_by_length");
  args.train_sampling_strategy = "group_by_length";
  CHECK(loom_test::error_of([&] { StreamTrainer t(args, fresh_mlp6(), shuffled_rows(kRows, calls)); }) ==
        "loom: --train_sampling_strategy group_by_length needs every example's length, and the training dataset is a "
        "stream (an iterable dataset)");

  // A checkpoint of a run on a sized dataset holds no stream position.
  args = stream_args("iterable/sized_checkpoint");
  args.max_steps = 2;
  StreamTrainer sized(args, fresh_mlp6(), loom_test::argmax_data(kRows, 3, 6));
  sized.train();
  auto resume = stream_args("iterable/sized_checkpoint_resumed");
  resume.resume_from_checkpoint = (fs::path(args.output_dir) / "checkpoint-2").string();
  StreamTrainer on_stream(resume, fresh_mlp6(), shuffled_rows(kRows, calls));
  CHECK(loom_test::error_of([&] { on_stream.train(); })
            .find("loom: resuming training on a stream needs the stream's position, and " +
                  *resume.resume_from_checkpoint + " has none") == 0);
  calls->read.clear();

  args = stream_args("iterable/trains");
  args.save_strategy = "no";
  StreamTrainer t(args, fresh_mlp6(), shuffled_rows(kRows, calls));
  const auto before = loom_test::weights(t.model());
  const auto out = t.train();
  CHECK(out.global_step == 14);
  CHECK_FALSE(bitwise_equal(loom_test::weights(t.model()), before));
  // HF's epoch for a stream: epoch + batches read in it / (max_steps x accumulation); the
  // third epoch has read 4 batches (steps 13 and 14) when the run ends.
  CHECK(t.state().epoch == doctest::Approx(2.0 + 4.0 / 28.0));
  CHECK(t.state().num_train_epochs == std::numeric_limits<int64_t>::max());
  // Two whole epochs (45 rows each) and 16 rows of the third: each example read once.
  CHECK(calls->read.size() == 2 * kRows + 16);
  CHECK(calls->read[kRows] == std::pair<int64_t, int64_t>{1, 0});
}

TEST_CASE("a resume on a stream seeks to its position: no example is read again, the run ends bitwise") {
  auto straight_calls = std::make_shared<Calls>();
  auto args = stream_args("iterable/straight");
  StreamTrainer straight(args, fresh_mlp6(), shuffled_rows(kRows, straight_calls));
  straight.train();
  const auto want = loom_test::weights(straight.model());
  const auto want_losses = losses_of(straight.state());
  // Mid-epoch, after the step whose group the stream's end cut short (the end of epoch 0),
  // and one step into the second epoch.
  for (const int64_t step : {3, 6, 7}) {
    for (const int64_t workers : {0, 2}) {
      CAPTURE(step);
      CAPTURE(workers);
      auto calls = std::make_shared<Calls>();
      auto resume = stream_args("iterable/resumed_" + std::to_string(step) + "_" + std::to_string(workers));
      resume.resume_from_checkpoint = (fs::path(args.output_dir) / ("checkpoint-" + std::to_string(step))).string();
      resume.dataloader_num_workers = workers;
      StreamTrainer resumed(resume, fresh_mlp6(), shuffled_rows(kRows, calls));
      resumed.train();
      CHECK(bitwise_equal(loom_test::weights(resumed.model()), want));
      const auto got_losses = losses_of(resumed.state());
      CHECK(got_losses == want_losses);
      CHECK(resumed.state().epoch == straight.state().epoch);
      if (workers == 0) {  // read-ahead reads a few examples past the end
        // Exactly the examples the straight run read after that step, none before.
        REQUIRE(calls->read.size() < straight_calls->read.size());
        CHECK(std::equal(calls->read.begin(), calls->read.end(),
                         straight_calls->read.end() - static_cast<std::ptrdiff_t>(calls->read.size())));
        CHECK(calls->read.front() != std::pair<int64_t, int64_t>{0, 0});
      }
    }
  }
}

TEST_CASE("--ignore_data_skip: a stream resumed mid-epoch reads its epoch again from the first example") {
  auto args = stream_args("iterable/ignore_skip_straight");
  StreamTrainer straight(args, fresh_mlp6(), shuffled_rows(kRows, std::make_shared<Calls>()));
  straight.train();
  auto calls = std::make_shared<Calls>();
  auto resume = stream_args("iterable/ignore_skip_resumed");
  resume.resume_from_checkpoint = (fs::path(args.output_dir) / "checkpoint-3").string();
  resume.ignore_data_skip = true;
  StreamTrainer resumed(resume, fresh_mlp6(), shuffled_rows(kRows, calls));
  resumed.train();
  REQUIRE_FALSE(calls->read.empty());
  CHECK(calls->read.front() == std::pair<int64_t, int64_t>{0, 0});  // epoch 0, its first example
  CHECK(resumed.state().global_step == straight.state().global_step);  // --max_steps still ends it
  CHECK_FALSE(bitwise_equal(loom_test::weights(resumed.model()), loom_test::weights(straight.model())));
}

// The child of the next case, in a process of its own (started by exec, so no thread or
// OpenMP pool of the parent's is inherited). Under RLIMIT_DATA = what it holds + 64 MiB it
// writes a token file 64 MiB larger than that limit to $LOOM_TEST_BIG_FILE (ids 0, 1, ...,
// 49999, 0, ... in blocks of 1 Mi ids), reads it whole through a TokenStream, tries to load
// it into a tensor, and writes its report to $LOOM_TEST_REPORT. Skipped unless run with --no-skip.
TEST_CASE("token stream memory child" * doctest::skip()) {
  const char* file = std::getenv("LOOM_TEST_BIG_FILE");
  const char* report_path = std::getenv("LOOM_TEST_REPORT");
  REQUIRE(file != nullptr);
  REQUIRE(report_path != nullptr);
  constexpr int64_t kBlock = int64_t{1} << 20;  // ids per block (2 MiB)
  const int64_t held_kib = status_kib("VmData:"), rss_anon_before = status_kib("RssAnon:");
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(held_kib * 1024 + (int64_t{64} << 20));
  REQUIRE(::setrlimit(RLIMIT_DATA, &limit) == 0);
  const int64_t blocks = static_cast<int64_t>(limit.rlim_cur) / (2 * kBlock) + 32;  // limit + 64 MiB or so
  {
    std::vector<uint16_t> block(kBlock);
    for (std::size_t i = 0; i < block.size(); ++i) block[i] = static_cast<uint16_t>(i % 50000);
    std::ofstream out(file, std::ios::binary);
    for (int64_t b = 0; b < blocks; ++b)
      out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(kBlock * 2));
  }
  const auto bytes = static_cast<int64_t>(fs::file_size(file));
  loom::data::DataLoader<loom::data::CausalLMBatch> loader(
      loom::data::AnyStream<loom::data::CausalLMBatch>(loom::data::TokenStream(
          file, {.dtype = loom::data::TokenDtype::uint16, .block_size = 4096, .stride = {}, .vocab_size = {}})),
      8, false);
  loader.set_epoch(0);
  const int64_t hwm_before = status_kib("VmHWM:");
  int64_t tokens = 0, sum = 0, k = 0;
  while (auto b = loader.try_batch(k)) {
    tokens += b->input_ids.numel();
    sum += b->input_ids.sum().item<int64_t>();
    (void)loader.position_after(k++);
  }
  const int64_t rss_anon = status_kib("RssAnon:"), hwm = status_kib("VmHWM:");
  bool load_refused = false;
  try {
    auto whole = torch::empty({bytes}, torch::kUInt8);
    std::ifstream in(file, std::ios::binary);
    in.read(reinterpret_cast<char*>(whole.data_ptr()), bytes);
  } catch (const std::exception&) {
    load_refused = true;
  }
  int64_t block_sum = 0;
  for (int64_t i = 0; i < kBlock; ++i) block_sum += i % 50000;
  std::ofstream(report_path) << nlohmann::json{{"limit_mib", static_cast<int64_t>(limit.rlim_cur >> 20)},
                                               {"held_mib", held_kib >> 10}, {"file_mib", bytes >> 20},
                                               {"tokens", tokens}, {"want_tokens", bytes / 2}, {"sum", sum},
                                               {"want_sum", block_sum * blocks}, {"load_refused", load_refused},
                                               {"rss_anon_before_mib", rss_anon_before >> 10},
                                               {"rss_anon_mib", rss_anon >> 10}, {"hwm_before_mib", hwm_before >> 10}, {"hwm_mib", hwm >> 10}}.dump();
  fs::remove(file);
}

TEST_CASE("a stream resumed from a checkpoint saved at an epoch's end goes on with the next epoch, bitwise") {
  // --save_strategy epoch: checkpoint-6 is saved once epoch 0's stream has ended, after
  // on_epoch_end; the resumed run starts epoch 1 (no second epoch end, as a sized run).
  auto calls = std::make_shared<Calls>();
  auto args = stream_args("iterable/epoch_saves");
  args.save_strategy = "epoch";
  args.eval_strategy = "epoch";
  StreamTrainer straight(args, fresh_mlp6(), shuffled_rows(kRows, calls), loom_test::argmax_data(20, 9, 6));
  straight.train();
  auto resume = stream_args("iterable/epoch_saves_resumed");
  resume.save_strategy = "epoch";
  resume.eval_strategy = "epoch";
  resume.resume_from_checkpoint = (fs::path(args.output_dir) / "checkpoint-6").string();
  auto resumed_calls = std::make_shared<Calls>();
  StreamTrainer resumed(resume, fresh_mlp6(), shuffled_rows(kRows, resumed_calls), loom_test::argmax_data(20, 9, 6));
  resumed.train();
  CHECK(bitwise_equal(loom_test::weights(resumed.model()), loom_test::weights(straight.model())));
  CHECK(history(resumed.state()) == history(straight.state()));  // the evaluations included, none twice
  CHECK(history(straight.state()).dump().find("eval_loss") != std::string::npos);
  REQUIRE(resumed_calls->read.size() < calls->read.size());
  CHECK(resumed_calls->read.front() == std::pair<int64_t, int64_t>{1, 0});
  CHECK(std::equal(resumed_calls->read.begin(), resumed_calls->read.end(),
                   calls->read.end() - static_cast<std::ptrdiff_t>(resumed_calls->read.size())));
}

TEST_CASE("a token file larger than the process's memory limit is read whole through its mapping") {
  // RLIMIT_DATA bounds a process's private writable memory (heap, anonymous maps) and leaves
  // out read-only file maps, so it caps what a process can load. The child above sets it to
  // what it already holds plus 64 MiB, reads a file larger than that through a TokenStream
  // (every window), then tries to load the file into a tensor, which the same limit refuses.
  const auto dir = loom_test::fresh_dir("iterable/large");
  const auto report = dir / "report.json";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::setenv("LOOM_TEST_BIG_FILE", (dir / "big.bin").c_str(), 1);
    ::setenv("LOOM_TEST_REPORT", report.c_str(), 1);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    const char* argv[] = {"loom_tests", "--no-skip", "--test-case=token stream memory child", nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const auto r = nlohmann::json::parse(loom_test::read_bytes(report));
  MESSAGE("RLIMIT_DATA " << r.at("limit_mib") << " MiB (" << r.at("held_mib") << " MiB held at the start), file "
                         << r.at("file_mib") << " MiB read whole; RssAnon " << r.at("rss_anon_before_mib") << " -> "
                         << r.at("rss_anon_mib") << " MiB, VmHWM " << r.at("hwm_before_mib") << " -> " << r.at("hwm_mib")
                         << " MiB");
  // The peak resident memory grows by far less than the file: the stream drops its pages behind it.
  CHECK(r.at("hwm_mib").get<int64_t>() - r.at("hwm_before_mib").get<int64_t>() < r.at("file_mib").get<int64_t>() / 4);
  CHECK(r.at("file_mib").get<int64_t>() > r.at("limit_mib").get<int64_t>());  // the file is larger than the limit ...
  CHECK(r.at("tokens") == r.at("want_tokens"));                              // ... and every token of it was read
  CHECK(r.at("sum") == r.at("want_sum"));
  CHECK(r.at("load_refused").get<bool>());  // loading it instead is refused under the same limit
}

}  // namespace data_test_iterable
