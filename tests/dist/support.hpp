// The test side of the multi-process tests (tests/dist/main.cpp's runner and the files beside
// it, each compiled into loom_dist_tests): start workers of this binary with the variables
// torchrun would set, wait for them with a deadline, and read what they wrote (logged
// losses, final weights). The worker side is in main.cpp.
#pragma once

#include <doctest/doctest.h>

#include <loom/checkpoint/safetensors.hpp>

#include "../support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace dist_test {

// <tmp_root>/dist/<name>, emptied.
inline fs::path dist_dir(const std::string& name) { return loom_test::tmp_dir("dist/" + name); }

using loom_test::free_port;


struct Launch {
  std::vector<int> status;         ///< exit code per rank; 128+signal when killed; -1 on timeout
  std::vector<std::string> err;    ///< stderr per rank
  double seconds = 0;              ///< until the last rank ended
};

// Starts `world` workers (ranks) of this binary with `args`; with `launched` false a single
// worker gets no launch variables at all (the plain one-process path).
inline Launch launch(int world, const std::vector<std::string>& args, const fs::path& logs, bool launched = true,
              int timeout_s = 120, int stopped_rank = -1) {
  fs::create_directories(logs);
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv(*e);
      if (kv.rfind("RANK=", 0) == 0 || kv.rfind("WORLD_SIZE=", 0) == 0 || kv.rfind("LOCAL_RANK=", 0) == 0 ||
          kv.rfind("MASTER_", 0) == 0 || kv.rfind("LOCAL_WORLD_SIZE=", 0) == 0 || kv.rfind("TORCHELASTIC", 0) == 0)
        continue;
      env.push_back(kv);
    }
    env.push_back("LOOM_DIST_WORKER=1");
    env.push_back("OMP_NUM_THREADS=1");
    if (launched) {
      for (auto kv : {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                      "LOCAL_WORLD_SIZE=" + std::to_string(world), std::string("MASTER_ADDR=127.0.0.1"),
                      "MASTER_PORT=" + std::to_string(port)})
        env.push_back(kv);
    }
    std::vector<std::string> argv_s{"/proc/self/exe"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv, envp;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const auto out = (logs / ("rank" + std::to_string(r) + ".out")).string();
    const auto err = (logs / ("rank" + std::to_string(r) + ".err")).string();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  Launch result;
  result.status.assign(static_cast<std::size_t>(world), -1);
  const auto start = std::chrono::steady_clock::now();
  int left = world;
  while (left > 0) {
    // A rank stopped on purpose is killed once every other rank has ended.
    if (stopped_rank >= 0 && left == 1 && pids[static_cast<std::size_t>(stopped_rank)] != 0) {
      ::kill(pids[static_cast<std::size_t>(stopped_rank)], SIGKILL);
    }
    for (int r = 0; r < world; ++r) {
      if (pids[static_cast<std::size_t>(r)] == 0) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG) > 0) {
        result.status[static_cast<std::size_t>(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        pids[static_cast<std::size_t>(r)] = 0;
        --left;
      }
    }
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (left > 0 && result.seconds > timeout_s) {
      for (auto p : pids)
        if (p != 0) {
          ::kill(p, SIGKILL);
          ::waitpid(p, nullptr, 0);
        }
      break;  // ranks still running keep status -1: a hang
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < world; ++r) result.err.push_back(loom_test::read_bytes(logs / ("rank" + std::to_string(r) + ".err")));
  return result;
}

inline void require_success(const Launch& l) {
  for (std::size_t r = 0; r < l.status.size(); ++r) {
    INFO("rank " << r << " stderr:\n" << l.err[r]);
    REQUIRE(l.status[r] == 0);
  }
}

// What rank `r` of the run in `out` wrote (its result.rank<r>.json).
inline nlohmann::json rank_result(const fs::path& out, int r) {
  std::ifstream in((out / ("result.rank" + std::to_string(r) + ".json")).string());
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

// Common flags: a small MLP, Adam with weight decay, clipping that is active, accumulation.
inline std::vector<std::string> base_args(const std::string& sharding, int64_t batch, const fs::path& out, int64_t steps = 10) {
  return {"--sharding", sharding, "--per_device_train_batch_size", std::to_string(batch), "--gradient_accumulation_steps",
          "2", "--max_steps", std::to_string(steps), "--learning_rate", "1e-2", "--weight_decay", "0.01",
          "--max_grad_norm", "0.5", "--logging_steps", "1", "--seed", "7", "--save_strategy", "no",
          "--ddp_timeout", "30", "--eval_strategy", "steps", "--eval_steps", "5", "--per_device_eval_batch_size", "8",
          "--output_dir", out.string(), "--result", (out / "result").string()};
}

// Sets `flag` to `value` in `args`, replacing an earlier value (flags may be given once).
inline void set_flag(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  for (std::size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == flag) {
      args[i + 1] = value;
      return;
    }
  args.push_back(flag);
  args.push_back(value);
}

// set_flag for each pair.
inline void set_flags(std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& flags) {
  for (const auto& [flag, value] : flags) set_flag(args, flag, value);
}

// The values of `key` in the run's log_history, in order ("loss": every logged training loss).
inline std::vector<double> logged(const fs::path& out, const std::string& key) {
  std::ifstream in(out / "trainer_state.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  std::vector<double> values;
  for (const auto& e : j.at("log_history"))
    if (e.contains(key)) values.push_back(e.at(key).get<double>());
  return values;
}
inline std::vector<double> logged_losses(const fs::path& out) { return logged(out, "loss"); }

inline std::map<std::string, torch::Tensor> weights(const fs::path& out) {
  std::map<std::string, torch::Tensor> m;
  // A LoRA run's save_model holds the adapter (adapter_model.safetensors) instead.
  const auto full = out / "result.model" / "model.safetensors";
  for (auto& [k, t] : loom::checkpoint::load_safetensors(fs::exists(full) ? full : out / "result.model" / "adapter_model.safetensors"))
    m[k] = t;
  return m;
}

// The largest relative difference between two runs' final weights (per tensor, by norm).
inline double weight_difference(const fs::path& a, const fs::path& b) {
  const auto wa = weights(a), wb = weights(b);
  REQUIRE(wa.size() == wb.size());
  double worst = 0;
  for (const auto& [k, t] : wa) {
    REQUIRE(wb.contains(k));
    worst = std::max(worst, ((t - wb.at(k)).norm() / wb.at(k).norm().clamp_min(1e-12)).item<double>());
  }
  return worst;
}

inline void check_losses(const std::vector<double>& got, const std::vector<double>& want, double rel, std::size_t skip = 0) {
  REQUIRE(got.size() + skip == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("logged loss " << i + skip << ": " << got[i] << " vs " << want[i + skip]);
    CHECK(std::abs(got[i] - want[i + skip]) <= rel * std::abs(want[i + skip]));
  }
}

inline const std::vector<std::string> kPolicies{"ddp", "zero1", "zero2", "full_shard"};


}  // namespace dist_test
