#pragma once
// What the test cases of loom_dist_tests share across its files (defined in main.cpp, which
// is also the worker): launching ranks of this binary, the common flags, reading what the
// workers wrote. A new group of dist test cases goes in its own file beside main.cpp.

#include <doctest/doctest.h>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dist_test {

/// <tmp_root>/dist/<name>, emptied.
std::filesystem::path dist_dir(const std::string& name);

/// How the ranks of one launch ended.
struct Launch {
  std::vector<int> status;         ///< exit code per rank; 128+signal when killed; -1 on timeout
  std::vector<std::string> err;    ///< stderr per rank
  double seconds = 0;              ///< until the last rank ended
};

/// Starts `world` workers (ranks) of this binary with `args`; with `launched` false a single
/// worker gets no launch variables at all (the plain one-process path).
Launch launch(int world, const std::vector<std::string>& args, const std::filesystem::path& logs, bool launched = true,
              int timeout_s = 120, int stopped_rank = -1);
/// REQUIREs that every rank exited with 0 (printing the stderr of one that did not).
void require_success(const Launch& l);

/// Common flags: a small MLP, Adam with weight decay, clipping that is active, accumulation.
std::vector<std::string> base_args(const std::string& sharding, int64_t batch, const std::filesystem::path& out, int64_t steps = 10);
/// Sets `flag` to `value` in `args`, replacing an earlier value (flags may be given once).
void set_flag(std::vector<std::string>& args, const std::string& flag, const std::string& value);
/// set_flag for each pair.
void set_flags(std::vector<std::string>& args, const std::vector<std::pair<std::string, std::string>>& flags);

/// The values of `key` in the run's log_history, in order ("loss": every logged training loss).
std::vector<double> logged(const std::filesystem::path& out, const std::string& key);
std::vector<double> logged_losses(const std::filesystem::path& out);
/// The final weights the run saved (result.model).
std::map<std::string, torch::Tensor> weights(const std::filesystem::path& out);
/// The largest relative difference between two runs' final weights (per tensor, by norm).
double weight_difference(const std::filesystem::path& a, const std::filesystem::path& b);
/// CHECKs each logged loss against `want[i + skip]` within `rel` (relative).
void check_losses(const std::vector<double>& got, const std::vector<double>& want, double rel, std::size_t skip = 0);

}  // namespace dist_test
