// Checkpoint folders: numeric order, latest complete checkpoint, crash-safe commit and
// recovery, HF's rotation rules (exact survivors), validation messages.
#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/core/state.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <signal.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace {
namespace fs = std::filesystem;
namespace ck = loom::checkpoint;

using loom_test::error_of;

fs::path folders_dir(const std::string& name) { return loom_test::fresh_dir("checkpoint_folders/" + name); }

void touch(const fs::path& p, const std::string& text = "x") {
  std::ofstream out(p);
  out << text;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// checkpoint-<s> for each step, complete (model + state) unless `complete` is false.
void make_checkpoints(const fs::path& out, const std::vector<int64_t>& steps, bool complete = true) {
  for (auto s : steps) {
    const auto d = ck::checkpoint_dir(out, s);
    fs::create_directories(d);
    if (complete) {
      touch(d / "trainer_state.json", "{}");
      touch(d / "model.safetensors");
    }
  }
}

std::vector<std::string> names(const std::vector<fs::path>& paths) {
  std::vector<std::string> v;
  for (const auto& p : paths) v.push_back(p.filename().string());
  return v;
}

// Every entry of a folder, by name, sorted.
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> v;
  for (const auto& e : fs::directory_iterator(dir)) v.push_back(e.path().filename().string());
  std::sort(v.begin(), v.end());
  return v;
}

// Survivor steps after rotating checkpoints 1..n with the given limit and best step.
struct Rotation {
  std::vector<std::string> deleted, survivors;
};
Rotation rotate(int64_t n, int64_t limit, std::optional<int64_t> best_step) {
  const auto out = folders_dir("rotate_case");
  std::vector<int64_t> steps;
  for (int64_t s = 1; s <= n; ++s) steps.push_back(s);
  make_checkpoints(out, steps);
  std::optional<fs::path> best;
  if (best_step) best = ck::checkpoint_dir(out, *best_step);
  Rotation r;
  r.deleted = names(ck::rotate_checkpoints(out, limit, best));
  r.survivors = names(ck::sorted_checkpoints(out));
  return r;
}
using S = std::vector<std::string>;
}  // namespace

TEST_CASE("checkpoint_dir is output_dir/checkpoint-<step>") {
  CHECK(ck::checkpoint_dir("out", 500) == fs::path("out") / "checkpoint-500");
  CHECK(ck::checkpoint_dir("/a/b", 0) == fs::path("/a/b/checkpoint-0"));
  CHECK_THROWS_WITH_AS(ck::checkpoint_dir("out", -1), "loom: checkpoint step must not be negative, got -1",
                       loom::Error);
}

TEST_CASE("sorted_checkpoints: numeric order, only folders named checkpoint-<int>") {
  const auto out = folders_dir("sorted");
  make_checkpoints(out, {10, 9, 100, 2}, false);
  for (const char* other : {"checkpoint-abc", "checkpoint-5x", "checkpoint-", "checkpoints", "xcheckpoint-3",
                            ".tmp-checkpoint-11-123", ".old-checkpoint-12-1", "runs"})
    fs::create_directories(out / other);
  touch(out / "checkpoint-7");  // a file, not a folder
  CHECK(names(ck::sorted_checkpoints(out)) == S{"checkpoint-2", "checkpoint-9", "checkpoint-10", "checkpoint-100"});
  CHECK(ck::sorted_checkpoints(out).front() == out / "checkpoint-2");
  CHECK(ck::sorted_checkpoints(out / "does-not-exist").empty());
}

TEST_CASE("latest_checkpoint: the highest complete step, ignoring incomplete folders and temporaries") {
  const auto out = folders_dir("latest");
  CHECK_FALSE(ck::latest_checkpoint(out).has_value());
  CHECK_FALSE(ck::latest_checkpoint(out / "missing").has_value());
  make_checkpoints(out, {5, 9});
  make_checkpoints(out, {10, 30}, false);  // crashed mid-save (no trainer_state.json)
  touch(out / "checkpoint-30" / "model.safetensors");
  fs::create_directories(out / ".tmp-checkpoint-40-1");
  touch(out / ".tmp-checkpoint-40-1" / "trainer_state.json");
  const auto latest = ck::latest_checkpoint(out);
  REQUIRE(latest.has_value());
  CHECK(*latest == out / "checkpoint-9");
  make_checkpoints(out, {10});
  CHECK(ck::latest_checkpoint(out) == std::optional<fs::path>(out / "checkpoint-10"));
}

TEST_CASE("begin/commit write a checkpoint through a temporary folder; re-saving a step replaces it") {
  const auto out = folders_dir("commit") / "nested" / "output";  // created on demand
  const auto tmp = ck::begin_checkpoint(out, 3);
  CHECK(fs::is_directory(tmp));
  CHECK(tmp.parent_path() == out);
  CHECK(tmp.filename().string().rfind(".tmp-checkpoint-3-", 0) == 0);
  CHECK(fs::is_empty(tmp));
  // Not visible as a checkpoint while being written.
  touch(tmp / "trainer_state.json", "first");
  touch(tmp / "only-in-first");
  fs::create_directories(tmp / "sub");
  touch(tmp / "sub" / "rng.bin", "r1");
  CHECK(ck::sorted_checkpoints(out).empty());
  CHECK_FALSE(ck::latest_checkpoint(out).has_value());

  const auto final_dir = ck::checkpoint_dir(out, 3);
  ck::commit_checkpoint(tmp, final_dir);
  CHECK_FALSE(fs::exists(tmp));
  CHECK(slurp(final_dir / "trainer_state.json") == "first");
  CHECK(slurp(final_dir / "sub" / "rng.bin") == "r1");
  CHECK(listing(out) == S{"checkpoint-3"});

  // Same step again: the new folder replaces the old one entirely.
  const auto tmp2 = ck::begin_checkpoint(out, 3);
  touch(tmp2 / "trainer_state.json", "second");
  ck::commit_checkpoint(tmp2, final_dir);
  CHECK(slurp(final_dir / "trainer_state.json") == "second");
  CHECK_FALSE(fs::exists(final_dir / "only-in-first"));
  CHECK_FALSE(fs::exists(final_dir / "sub"));
  CHECK(listing(out) == S{"checkpoint-3"});  // no .old- or .tmp- left behind

  // begin_checkpoint starts from an empty folder even if this process left one behind.
  const auto tmp3 = ck::begin_checkpoint(out, 4);
  touch(tmp3 / "junk");
  CHECK(ck::begin_checkpoint(out, 4) == tmp3);
  CHECK(fs::is_empty(tmp3));

  CHECK(error_of([&] { ck::commit_checkpoint(out / ".tmp-checkpoint-9-0", ck::checkpoint_dir(out, 9)); }) ==
        "loom: temporary checkpoint folder " + (out / ".tmp-checkpoint-9-0").string() + " does not exist");
  CHECK_THROWS_AS(ck::begin_checkpoint(out, -2), loom::Error);
}

TEST_CASE("a real checkpoint: model + trainer state written via begin/commit, then validated and found") {
  const auto out = folders_dir("real");
  torch::nn::Linear model(3, 2);
  loom::TrainerState state;
  state.global_step = 12;
  const auto tmp = ck::begin_checkpoint(out, state.global_step);
  ck::save_module(*model, tmp / ck::kModelFile);
  state.save(tmp / ck::kTrainerStateFile);
  ck::commit_checkpoint(tmp, ck::checkpoint_dir(out, state.global_step));
  const auto latest = ck::latest_checkpoint(out);
  REQUIRE(latest.has_value());
  CHECK_NOTHROW(ck::validate_checkpoint(*latest));
  CHECK(loom::TrainerState::load(*latest / "trainer_state.json").global_step == 12);
  torch::nn::Linear other(3, 2);
  ck::load_module(*other, *latest / "model.safetensors");
  CHECK(torch::equal(other->weight, model->weight));
}

TEST_CASE("remove_stale_temporaries deletes temporaries and restores a checkpoint moved aside by a crash") {
  const auto out = folders_dir("stale");
  CHECK(ck::remove_stale_temporaries(out / "missing").empty());
  make_checkpoints(out, {7});
  // A crash while re-saving step 6, between "rename old away" and "rename new in":
  fs::create_directories(out / ".old-checkpoint-6-4242");
  touch(out / ".old-checkpoint-6-4242" / "trainer_state.json", "old 6");
  fs::create_directories(out / ".tmp-checkpoint-6-4242");
  touch(out / ".tmp-checkpoint-6-4242" / "trainer_state.json", "half-written 6");
  // A crash after the new step 7 was in place, before the old one was deleted:
  fs::create_directories(out / ".old-checkpoint-7-4242");
  touch(out / ".old-checkpoint-7-4242" / "trainer_state.json", "old 7");
  // A crash while writing step 8:
  fs::create_directories(out / ".tmp-checkpoint-8-99" / "sub");
  fs::create_directories(out / "runs");  // not ours
  CHECK(ck::latest_checkpoint(out) == std::optional<fs::path>(out / "checkpoint-7"));

  const auto removed = names(ck::remove_stale_temporaries(out));
  CHECK(removed == S{".old-checkpoint-7-4242", ".tmp-checkpoint-6-4242", ".tmp-checkpoint-8-99"});
  CHECK(listing(out) == S{"checkpoint-6", "checkpoint-7", "runs"});
  CHECK(slurp(out / "checkpoint-6" / "trainer_state.json") == "old 6");
  CHECK(slurp(out / "checkpoint-7" / "trainer_state.json") == "{}");
  CHECK(ck::remove_stale_temporaries(out).empty());
}

TEST_CASE("rotate_checkpoints without a best checkpoint keeps the newest save_total_limit") {
  auto r = rotate(5, 1, std::nullopt);
  CHECK(r.survivors == S{"checkpoint-5"});
  CHECK(r.deleted == S{"checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"});
  CHECK(rotate(5, 2, std::nullopt).survivors == S{"checkpoint-4", "checkpoint-5"});
  r = rotate(5, 3, std::nullopt);
  CHECK(r.survivors == S{"checkpoint-3", "checkpoint-4", "checkpoint-5"});
  CHECK(r.deleted == S{"checkpoint-1", "checkpoint-2"});
  // Nothing to do: limit 0 / negative (no limit), or no more checkpoints than the limit.
  CHECK(rotate(5, 0, std::nullopt).survivors.size() == 5);
  CHECK(rotate(5, -1, std::nullopt).deleted.empty());
  r = rotate(3, 3, 1);
  CHECK(r.deleted.empty());
  CHECK(r.survivors.size() == 3);
  CHECK(rotate(0, 2, std::nullopt).survivors.empty());
}

TEST_CASE("rotate_checkpoints keeps the best checkpoint exactly as HF does") {
  // HF moves the best to the second-to-last place, then deletes from the front; with a limit
  // of 1 and a best that is not the newest it keeps 2.
  struct Case {
    int64_t limit, best;
    S survivors;
  };
  const std::vector<Case> cases{
      {1, 1, {"checkpoint-1", "checkpoint-5"}},
      {1, 3, {"checkpoint-3", "checkpoint-5"}},
      {1, 4, {"checkpoint-4", "checkpoint-5"}},
      {1, 5, {"checkpoint-5"}},
      {2, 1, {"checkpoint-1", "checkpoint-5"}},
      {2, 3, {"checkpoint-3", "checkpoint-5"}},
      {2, 4, {"checkpoint-4", "checkpoint-5"}},
      {2, 5, {"checkpoint-4", "checkpoint-5"}},
      {3, 1, {"checkpoint-1", "checkpoint-4", "checkpoint-5"}},
      {3, 2, {"checkpoint-2", "checkpoint-4", "checkpoint-5"}},
      {3, 3, {"checkpoint-3", "checkpoint-4", "checkpoint-5"}},
      {3, 5, {"checkpoint-3", "checkpoint-4", "checkpoint-5"}},
  };
  for (const auto& c : cases) {
    INFO("limit " << c.limit << ", best checkpoint-" << c.best);
    const auto r = rotate(5, c.limit, c.best);
    CHECK(r.survivors == c.survivors);
    CHECK(r.deleted.size() + r.survivors.size() == 5);
  }
  // Deleted in the order of the rearranged list: best=2, limit 3 -> [1, 3, 4, 2, 5].
  CHECK(rotate(5, 3, 2).deleted == S{"checkpoint-1", "checkpoint-3"});
}

TEST_CASE("rotate_checkpoints: numeric order, path spelling of the best, other folders untouched") {
  const auto out = folders_dir("rotate_misc");
  make_checkpoints(out, {9, 10, 100, 1000});
  fs::create_directories(out / "runs");
  fs::create_directories(out / ".tmp-checkpoint-2000-1");
  // The best spelled differently (a "..", a "."), still recognised as checkpoint-9:
  // [9, 10, 100, 1000] -> [10, 100, 9, 1000], the first one goes (by name, 9 would sort last).
  const auto best = out / "runs" / ".." / "." / "checkpoint-9";
  const auto deleted = names(ck::rotate_checkpoints(out, 3, best));
  CHECK(deleted == S{"checkpoint-10"});
  CHECK(listing(out) == S{".tmp-checkpoint-2000-1", "checkpoint-100", "checkpoint-1000", "checkpoint-9", "runs"});
  // A best outside output_dir with limit 1: HF still keeps two.
  const auto r = names(ck::rotate_checkpoints(out, 1, loom_test::tmp_root() / "elsewhere" / "checkpoint-3"));
  CHECK(r == S{"checkpoint-9"});
  CHECK(names(ck::sorted_checkpoints(out)) == S{"checkpoint-100", "checkpoint-1000"});
  CHECK(names(ck::rotate_checkpoints(out, 1, std::nullopt)) == S{"checkpoint-100"});
  CHECK(ck::rotate_checkpoints(out / "missing", 1, std::nullopt).empty());
}

TEST_CASE("validate_checkpoint names what is wrong") {
  const auto out = folders_dir("validate");
  const auto missing = out / "checkpoint-1";
  CHECK(error_of([&] { ck::validate_checkpoint(missing); }) ==
        "loom: checkpoint folder " + missing.string() + " does not exist");
  touch(out / "checkpoint-2");
  CHECK(error_of([&] { ck::validate_checkpoint(out / "checkpoint-2"); }) ==
        "loom: " + (out / "checkpoint-2").string() + " is a file, not a folder (a checkpoint folder)");
  const auto dir = out / "checkpoint-3";
  fs::create_directories(dir);
  CHECK(error_of([&] { ck::validate_checkpoint(dir); }) ==
        "loom: " + dir.string() + " is not a complete checkpoint: missing model.safetensors (or model.safetensors.index.json, a sharded model's, or adapter_model.safetensors, an adapter's), trainer_state.json");
  touch(dir / "trainer_state.json", "{}");
  CHECK(error_of([&] { ck::validate_checkpoint(dir); }) ==
        "loom: " + dir.string() + " is not a complete checkpoint: missing model.safetensors (or model.safetensors.index.json, a sharded model's, or adapter_model.safetensors, an adapter's)");
  fs::create_directories(dir / "model.safetensors");  // a folder is not the file
  CHECK(error_of([&] { ck::validate_checkpoint(dir); }) ==
        "loom: " + (dir / "model.safetensors").string() + " is a folder, not a file");
  fs::remove(dir / "model.safetensors");
  touch(dir / "model.safetensors");
  CHECK_NOTHROW(ck::validate_checkpoint(dir));
}

namespace {
// claim_output_dir for the local main processes of 4 "nodes" (threads, ranks 0, 2, 4, 6; the
// other ranks are not candidates), node n writing into folders[n]; returns each node's claim.
std::vector<bool> claims(const std::vector<fs::path>& folders) {
  const auto n = folders.size();
  std::barrier sync(static_cast<std::ptrdiff_t>(n));
  std::vector<char> claimed(n, 0);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      try {
        claimed[i] = ck::claim_output_dir(folders[i], static_cast<int>(2 * i), true, [&] { sync.arrive_and_wait(); });
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) CHECK(e.empty());
  return {claimed.begin(), claimed.end()};
}
}  // namespace

TEST_CASE("claim_output_dir: one writer per folder the nodes see, whichever folders they share") {
  const auto root = folders_dir("claim");
  const auto shared = root / "shared", a = root / "a", b = root / "b";
  CHECK(claims({a, b, root / "c", root / "d"}) == std::vector<bool>{true, true, true, true});  // folders of their own
  CHECK(claims({shared, shared, shared, shared}) == std::vector<bool>{true, false, false, false});
  CHECK(claims({a, b, a, b}) == std::vector<bool>{true, true, false, false});  // two pairs
  // The marks are gone, and a folder the claim made is removed again when nothing else is in it.
  CHECK_FALSE(fs::exists(shared));
  CHECK_FALSE(fs::exists(a));
  fs::create_directories(shared);
  touch(shared / "kept");
  touch(shared / ".loom.node-0");  // a mark a killed run left: not a node of this one
  CHECK(claims({b, shared, b, shared}) == std::vector<bool>{true, true, false, false});
  CHECK(listing(shared) == S{"kept"});
  // One process (not a candidate) claims nothing and writes nothing.
  CHECK_FALSE(ck::claim_output_dir(root / "e", 1, false, [] {}));
  CHECK_FALSE(fs::exists(root / "e"));
}

TEST_CASE("one run per output folder: a second process's run stops at start-up, a dead holder's lock is taken over") {
  const auto dir = loom_test::fresh_dir("checkpoint/locked");
  const auto lock = dir / ".loom.lock";
  {
    // Two objects of this process share the lock; the last one removes the file.
    ck::OutputDirLock first(dir);
    CHECK(fs::exists(lock));
    {
      ck::OutputDirLock second(dir / "." / "");
      CHECK(fs::exists(lock));
    }
    CHECK(fs::exists(lock));
  }
  CHECK_FALSE(fs::exists(lock));
  // Another process holds it (as a run of another program would): refused, naming it.
  const std::string holder =
      "python3 -c \"import fcntl, os, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
      "f.write(str(os.getpid())); f.flush(); print('locked', flush=True); time.sleep(60)\" " + lock.string();
  FILE* proc = ::popen((holder + " & echo $!").c_str(), "r");
  REQUIRE(proc != nullptr);
  char line[64] = {};
  REQUIRE(std::fgets(line, sizeof(line), proc) != nullptr);  // the holder's pid
  const long pid = std::atol(line);
  REQUIRE(std::fgets(line, sizeof(line), proc) != nullptr);  // "locked"
  CHECK(std::string(line) == "locked\n");
  const auto error = error_of([&] { ck::OutputDirLock taken(dir); });
  CHECK(error == "loom: output_dir " + dir.string() + " is in use by another run (process " + std::to_string(pid) +
                     " holds .loom.lock); wait for it to end, or give another --output_dir");
  // Killed, its lock goes with it: the file stays, and the next run takes it over.
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  ::pclose(proc);
  CHECK(fs::exists(lock));
  bool taken = false;  // once the kernel has ended the holder (a few milliseconds)
  for (int i = 0; i < 200 && !taken; ++i) {
    try {
      ck::OutputDirLock after(dir);
      taken = true;
    } catch (const loom::Error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  CHECK(taken);
  CHECK_FALSE(fs::exists(lock));
}
