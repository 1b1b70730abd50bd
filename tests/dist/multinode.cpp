// Several nodes on this machine: two torchrun agents (--nnodes 2, 2 processes each) start the
// workers of this binary (tests/dist/main.cpp's worker: the MLP under the Trainer), as two
// machines would. Each agent runs in its own working folder, so a relative --output_dir is a
// folder of that "node" alone: the storage is not shared, as on nodes without a shared file
// system. Shows that two nodes train as one node of the same world size, that their sharded
// checkpoint resumes at another world size, and that save_on_each_node and log_on_each_node
// behave as in HF (docs/distributed.md, "Several nodes"). CTest: dist.multinode and
// dist.save_on_each_node, one test case each; without the venv's torchrun both are skipped.

#include <doctest/doctest.h>

#include <loom/checkpoint/folders.hpp>

#include "../support.hpp"
#include "support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using dist_test::logged;
using dist_test::weight_difference;

namespace {

/// torchrun of the project's venv ($LOOM_TORCHRUN overrides it); empty when there is none.
fs::path torchrun() {
  if (const char* t = std::getenv("LOOM_TORCHRUN"); t != nullptr && *t != '\0') return t;
  const auto p = loom_test::source_dir() / ".venv" / "bin" / "torchrun";
  return fs::exists(p) ? p : fs::path();
}

/// One torchrun agent: a node of the job.
struct Node {
  fs::path cwd;          ///< its working folder (relative paths are the node's own)
  int node_rank = 0;
  int nproc = 2;
};

/// What each agent printed (its workers' lines, tagged "[default<local rank>]:" by --tee 3).
struct Run {
  std::vector<int> status;         ///< exit code per node; -1 when it had to be killed
  std::vector<std::string> output;  ///< stdout and stderr per node
  double seconds = 0;

  /// The lines of `node`'s local rank `local` (without the tag).
  [[nodiscard]] std::string of(std::size_t node, int local) const {
    const std::string tag = "[default" + std::to_string(local) + "]:";
    std::string lines;
    std::size_t at = 0;
    const auto& out = output.at(node);
    while (at < out.size()) {
      auto end = out.find('\n', at);
      if (end == std::string::npos) end = out.size();
      const auto line = out.substr(at, end - at);
      if (line.rfind(tag, 0) == 0) lines += line.substr(tag.size()) + "\n";
      at = end + 1;
    }
    return lines;
  }
};

/// Starts one torchrun agent per node at once and waits for all (killing them after
/// `timeout_s`). Several nodes meet through `rendezvous`: "c10d" (torchrun's c10d rendezvous on
/// localhost, which numbers the nodes in the order they arrive) or "static" (--master_addr /
/// --master_port, which keeps each node's --node_rank); one node runs --standalone.
Run run_nodes(const std::vector<Node>& nodes, const std::string& rendezvous, const std::vector<std::string>& args,
              int timeout_s = 120) {
  const auto exe = fs::read_symlink("/proc/self/exe");
  const int port = loom_test::free_port();
  std::vector<pid_t> pids;
  std::vector<fs::path> logs;
  for (const auto& node : nodes) {
    fs::create_directories(node.cwd);
    std::vector<std::string> argv_s{torchrun().string()};
    if (nodes.size() == 1) {
      argv_s.insert(argv_s.end(), {"--standalone", "--nnodes", "1"});
    } else if (rendezvous == "c10d") {
      argv_s.insert(argv_s.end(), {"--nnodes", std::to_string(nodes.size()), "--node_rank", std::to_string(node.node_rank),
                                   "--rdzv_backend", "c10d", "--rdzv_endpoint", "localhost:" + std::to_string(port)});
    } else {
      argv_s.insert(argv_s.end(), {"--nnodes", std::to_string(nodes.size()), "--node_rank", std::to_string(node.node_rank),
                                   "--master_addr", "127.0.0.1", "--master_port", std::to_string(port)});
    }
    argv_s.insert(argv_s.end(), {"--nproc_per_node", std::to_string(node.nproc), "--tee", "3", "--log_dir",
                                 (node.cwd / "torchrun_logs").string(), "--no-python", exe.string()});
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      if (kv.rfind("RANK=", 0) == 0 || kv.rfind("WORLD_SIZE=", 0) == 0 || kv.rfind("LOCAL_", 0) == 0 ||
          kv.rfind("MASTER_", 0) == 0 || kv.rfind("TORCHELASTIC", 0) == 0 || kv.rfind("GROUP_", 0) == 0 ||
          kv.rfind("LOOM_FAULT_POINT=", 0) == 0)
        continue;
      env.push_back(kv);
    }
    env.emplace_back("LOOM_DIST_WORKER=1");
    env.emplace_back("OMP_NUM_THREADS=1");
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    logs.push_back(node.cwd / ("node" + std::to_string(node.node_rank) + ".log"));
    const auto log = logs.back().string();
    const auto dir = node.cwd.string();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::setpgid(0, 0);  // the agent and its workers: one group, killed together on a timeout
      const int o = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(o, 2);
      if (::chdir(dir.c_str()) != 0) ::_exit(126);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  Run run;
  run.status.assign(nodes.size(), -1);
  const auto start = std::chrono::steady_clock::now();
  std::size_t left = nodes.size();
  while (left > 0) {
    for (std::size_t n = 0; n < nodes.size(); ++n) {
      int st = 0;
      if (pids[n] != 0 && ::waitpid(pids[n], &st, WNOHANG) > 0) {
        run.status[n] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[n] = 0;
        --left;
      }
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left > 0 && run.seconds > timeout_s) {
      for (auto p : pids)
        if (p != 0) {
          ::kill(-p, SIGKILL);
          ::waitpid(p, nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& log : logs) run.output.push_back(loom_test::read_bytes(log));
  return run;
}

void require_success(const Run& run) {
  for (std::size_t n = 0; n < run.status.size(); ++n) {
    INFO("node " << n << " output:\n" << run.output[n]);
    REQUIRE(run.status[n] == 0);
  }
}

/// The worker's flags: a small MLP, AdamW with weight decay, active clipping, accumulation,
/// evaluation every 5 steps; `batch` per process, checkpoints every `save_steps`.
std::vector<std::string> worker_args(const std::string& sharding, int64_t batch, const std::string& out,
                                     int64_t save_steps) {
  return {"--sharding", sharding, "--per_device_train_batch_size", std::to_string(batch),
          "--gradient_accumulation_steps", "2", "--max_steps", "10", "--learning_rate", "1e-2", "--weight_decay",
          "0.01", "--max_grad_norm", "0.5", "--logging_steps", "1", "--seed", "7", "--save_strategy", "steps",
          "--save_steps", std::to_string(save_steps), "--ddp_timeout", "30", "--eval_strategy", "steps",
          "--eval_steps", "5", "--per_device_eval_batch_size", "8", "--output_dir", out, "--result", out + "/result"};
}

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

/// The largest relative difference between two lists of logged values (of equal length).
double value_difference(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-30));
  return worst;
}

/// Names in `dir` that start with a dot other than the run lock: a save's leftovers or a node's mark.
std::vector<std::string> dotted(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind(".", 0) == 0 && name != loom::checkpoint::kLockFile) found.push_back(name);
  }
  return found;
}

/// How many lines of `text` match `pattern`.
int count_lines(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<int>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("two torchrun nodes of 2 processes train as one node of 4; their ZeRO-2 checkpoint resumes at 2 and 1") {
  if (torchrun().empty()) {
    MESSAGE("no torchrun in " << (loom_test::source_dir() / ".venv/bin") << ": the multi-node test is skipped");
    return;
  }
  const auto root = loom_test::fresh_dir("dist/multinode");
  // One node of 4 processes: the reference.
  const auto one = root / "one_node";
  require_success(run_nodes({{one, 0, 4}}, "", worker_args("zero2", 4, (one / "out").string(), 5)));
  // Two nodes of 2 under torchrun's c10d rendezvous, writing into one folder (shared storage):
  // with --save_on_each_node each node's local main finds the other's mark there, and rank 0
  // alone writes the shared files, as without the flag.
  const auto two = root / "two_nodes";
  const auto out = two / "out";
  const auto run = run_nodes({{two, 0, 2}, {two, 1, 2}}, "c10d",
                             with(worker_args("zero2", 4, out.string(), 5), {"--save_on_each_node", "--log_level", "info"}));
  require_success(run);
  MESSAGE("two nodes of 2 processes: " << run.seconds << " s");
  // The same world size, the same collectives: the same numbers, bit for bit.
  for (const char* key : {"loss", "grad_norm", "eval_loss", "eval_accuracy", "eval_ordered_accuracy"}) {
    CAPTURE(key);
    const auto want = logged(one / "out", key);
    CHECK(!want.empty());
    CHECK(logged(out, key) == want);
  }
  CHECK(weight_difference(out, one / "out") == 0.0);
  const auto ckpt = out / "checkpoint-5";
  for (int r = 0; r < 4; ++r) CHECK(fs::exists(ckpt / ("optimizer-" + std::to_string(r) + "-of-4.safetensors")));
  CHECK(dotted(out).empty());
  // One writer for the shared folder: the save was announced by one process in all.
  int saving = 0;
  for (std::size_t n = 0; n < 2; ++n)
    for (int local = 0; local < 2; ++local) saving += count_lines(run.of(n, local), "loom: info: saving model checkpoint to [^\n]*checkpoint-5\n");
  CHECK(saving == 1);

  // The 4-rank ZeRO-2 checkpoint resumed at another world size: one node of 2 under
  // FullShard (batch 8), and one process without sharding (batch 16).
  struct Resume {
    std::string policy;
    int nproc;
    int64_t batch;
  };
  for (const auto& [policy, nproc, batch] : {Resume{"full_shard", 2, 8}, Resume{"no", 1, 16}}) {
    CAPTURE(policy);
    const auto dir = root / ("resumed_" + policy);
    require_success(run_nodes({{dir, 0, nproc}}, "",
                              with(worker_args(policy, batch, (dir / "out").string(), 5),
                                   {"--resume_from_checkpoint", ckpt.string()})));
    // The history holds the checkpoint's first 5 steps and the resumed run's 5.
    const double losses = value_difference(logged(dir / "out", "loss"), logged(out, "loss"));
    const double weights = weight_difference(dir / "out", out);
    MESSAGE("resumed under " << policy << " at " << nproc << ": losses differ by " << losses << ", final weights by "
                             << weights << " (relative)");
    CHECK(losses < 1e-5);
    CHECK(weights < 1e-5);
  }
}

TEST_CASE("save_on_each_node: each node writes its own folder and resumes from it alone; log_on_each_node as in HF") {
  if (torchrun().empty()) {
    MESSAGE("no torchrun in " << (loom_test::source_dir() / ".venv/bin") << ": the multi-node test is skipped");
    return;
  }
  const auto root = loom_test::fresh_dir("dist/save_on_each_node");
  // Static rendezvous: node n keeps --node_rank n, so ranks 2n and 2n+1 run in node n's folder.
  const std::vector<Node> nodes{{root / "node0", 0, 2}, {root / "node1", 1, 2}};
  // Checkpoints at 4, 8 and 10, two kept: each node rotates its own folder.
  const auto args = with(worker_args("zero2", 4, "out", 4),
                         {"--save_on_each_node", "--save_total_limit", "2", "--log_level", "info"});
  const auto run = run_nodes(nodes, "static", args);
  require_success(run);
  for (int n = 0; n < 2; ++n) {
    CAPTURE(n);
    const auto out = nodes[static_cast<std::size_t>(n)].cwd / "out";
    CHECK(!fs::exists(out / "checkpoint-4"));
    CHECK(loom::checkpoint::sorted_checkpoints(out) == std::vector<fs::path>{out / "checkpoint-8", out / "checkpoint-10"});
    CHECK(dotted(out).empty());
    const auto ckpt = out / "checkpoint-8";
    CHECK_NOTHROW(loom::checkpoint::validate_checkpoint(ckpt));
    for (const char* f : {"model.safetensors", "trainer_state.json", "training_args.json", "scheduler.json",
                          "loop_state.json", "rng_state.safetensors", "optimizer.json"}) {
      CAPTURE(f);
      CHECK(fs::exists(ckpt / f));
    }
    // Its own ranks' optimizer shards, and no other.
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(fs::exists(ckpt / ("optimizer-" + std::to_string(r) + "-of-4.safetensors")) == (r / 2 == n));
    }
    CHECK(fs::exists(out / "result.model" / "model.safetensors"));  // save_model on each node (HF's should_save)
    // log_on_each_node (default true) with --log_level info: each node's local main process
    // logs at info, the other at --log_level_replica (warning).
    CHECK(count_lines(run.of(static_cast<std::size_t>(n), 0), "loom: info: saving model checkpoint to out/checkpoint-8\n") == 1);
    CHECK(count_lines(run.of(static_cast<std::size_t>(n), 0),
                      "loom: info: deleting older checkpoint \\[out/checkpoint-4\\] due to save_total_limit\n") == 1);
    CHECK(count_lines(run.of(static_cast<std::size_t>(n), 1), "loom: info:") == 0);
    // The log lines: --disable_tqdm (the worker's default) prints them as HF's PrinterCallback
    // does, on the main process of each node.
    CHECK(count_lines(run.of(static_cast<std::size_t>(n), 0), "\\{'loss': ") == 10);
    CHECK(count_lines(run.of(static_cast<std::size_t>(n), 1), "\\{'loss': ") == 0);
  }
  CHECK(weight_difference(nodes[1].cwd / "out", nodes[0].cwd / "out") == 0.0);

  // Each node resumes from its own folder's checkpoint-8 (a relative path, so a missing file
  // on either node fails the run) into a fresh folder, and ends where the straight run did.
  // --log_on_each_node false: only global rank 0 logs at info.
  const auto resumed = run_nodes(nodes, "static",
                                 with(worker_args("zero2", 4, "resumed", 4),
                                      {"--save_on_each_node", "--resume_from_checkpoint", "out/checkpoint-8",
                                       "--log_level", "info", "--log_on_each_node", "false"}));
  require_success(resumed);
  for (std::size_t n = 0; n < 2; ++n) {
    CAPTURE(n);
    CHECK(weight_difference(nodes[n].cwd / "resumed", nodes[0].cwd / "out") == 0.0);
    CHECK(count_lines(resumed.of(n, 0), "loom: info: loading model from out/checkpoint-8\n") == (n == 0 ? 1 : 0));
  }
  CHECK(logged(nodes[0].cwd / "resumed", "loss") == logged(nodes[0].cwd / "out", "loss"));

  // Node 1's folder alone at another world size: it lacks ranks 0 and 1's shards.
  const auto other = run_nodes({{nodes[1].cwd, 0, 2}}, "",
                               with(worker_args("zero2", 8, "other", 4), {"--resume_from_checkpoint", "out/checkpoint-8"}));
  CHECK(other.status[0] != 0);
  CHECK(other.output[0].find("loom: out/checkpoint-8 is missing the optimizer shard of rank 0 "
                             "(optimizer-0-of-4.safetensors/.json) of the 4 it was saved at") != std::string::npos);

  // A save that reached node 0's commit but not node 1's: "latest" differs between the
  // folders, and every rank stops instead of resuming from two steps.
  fs::remove_all(nodes[1].cwd / "out" / "checkpoint-10");
  const auto apart = run_nodes(nodes, "static", with(args, {"--resume_from_checkpoint", "latest"}));
  for (std::size_t n = 0; n < 2; ++n) {
    CAPTURE(n);
    CHECK(apart.status[n] != 0);
    CHECK(apart.output[n].find("loom: the nodes would resume from different checkpoints, each from its own output "
                               "folder (save_on_each_node): rank 0: step 10, rank 1: step 10, rank 2: step 8, rank 3: "
                               "step 8; ") != std::string::npos);
  }
}
