// --offload_optimizer at 2 ranks (Gloo on the CPU): the optimizer steps host copies of each
// rank's pieces, a separate storage even on the CPU, so these runs go through every copy.
// On the CPU the same kernel runs on the same values, so the runs must equal the ones without
// offload bitwise; the checkpoints are the same files, so each resumes the other's.

#include "support.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

using namespace dist_test;

namespace offload_test {

// What rank `r` of the run in `out` wrote about its model-state bytes.
inline nlohmann::json rank_bytes(const std::filesystem::path& out, int r) { return rank_result(out, r); }

}  // namespace offload_test

TEST_CASE("optimizer offload at 2 ranks equals the run without it bitwise; its state is counted as host bytes") {
  using offload_test::rank_bytes;
  using Flags = std::vector<std::pair<std::string, std::string>>;
  struct Case {
    std::string tag, policy;
    Flags flags;            // both runs
    bool params = false;    // the offloaded run adds --offload_param
  };
  // fp16 with an overflow on every rank at step 2: the skip flag travels to the host with the
  // gradients and the host step skips as the device step does.
  const std::vector<Case> cases{{"zero1", "zero1", {}},
                                {"zero2", "zero2", {}},
                                {"full_shard", "full_shard", {}},
                                {"zero2_fp16", "zero2", {{"--fp16", "true"}, {"--poison_step", "2"}}},
                                {"full_shard_bf16", "full_shard", {{"--bf16", "true"}}},
                                {"full_shard_params", "full_shard", {}, true},
                                // bf16 gathers staged from the host shard (--fsdp "full_shard offload" --bf16)
                                {"full_shard_params_bf16", "full_shard",
                                 {{"--bf16", "true"}, {"--sharding_param_dtype", "bf16"}}, true}};
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    const auto plain = dist_dir("offload_plain_" + c.tag), off = dist_dir("offload_" + c.tag);
    auto args = base_args(c.policy, 4, plain, 6);
    set_flags(args, c.flags);
    require_success(launch(2, args, plain / "logs"));
    args = base_args(c.policy, 4, off, 6);
    set_flags(args, c.flags);
    set_flag(args, "--offload_optimizer", "true");
    if (c.params) set_flag(args, "--offload_param", "true");
    require_success(launch(2, args, off / "logs"));

    check_losses(logged_losses(off), logged_losses(plain), 0.0);
    // The poisoned step logs an infinite norm (null in JSON); its skip is logged instead.
    const bool poisoned =
        std::any_of(c.flags.begin(), c.flags.end(), [](const auto& f) { return f.first == "--poison_step"; });
    for (const char* key : {poisoned ? "skipped_steps" : "grad_norm", "eval_loss"}) {
      CAPTURE(key);
      check_losses(logged(off, key), logged(plain, key), 0.0);
    }
    if (poisoned) {  // logged per logging window
      const auto skips = logged(off, "skipped_steps");
      CHECK(std::accumulate(skips.begin(), skips.end(), 0.0) == 1.0);
    }
    CHECK(weight_difference(off, plain) == 0.0);

    // The device keeps the gradients it kept; the optimizer state moves to the host with the
    // host copies of the pieces and their gradients (4 + 4 bytes a parameter). With
    // --offload_param the shard itself is the host copy, and the device keeps no parameter
    // between steps (the gathered units are released).
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto p = rank_bytes(plain, r), o = rank_bytes(off, r);
      const double state = p.at("optimizer").get<double>(), psi = o.at("psi").get<double>();
      MESSAGE(c.tag << " rank " << r << ": device params, grads, optimizer bytes " << o.at("params").get<double>() << ", "
                    << o.at("grads").get<double>() << ", " << o.at("optimizer").get<double>() << " (without offload "
                    << p.at("params").get<double>() << ", " << p.at("grads").get<double>() << ", " << state
                    << "); host bytes " << o.at("host").get<double>());
      CHECK(p.at("host").get<double>() == 0.0);
      CHECK(o.at("optimizer").get<double>() == 0.0);
      CHECK(o.at("params").get<double>() == (c.params ? 0.0 : p.at("params").get<double>()));
      CHECK(o.at("grads").get<double>() == p.at("grads").get<double>());
      // state = 8 bytes per element of the pieces plus the step counts; the copies 8 more.
      const double copies = o.at("host").get<double>() - state;
      CHECK(copies > 0.0);
      CHECK(std::abs(copies - 8 * psi / 2) <= 0.05 * 8 * psi / 2);
    }
  }
}

TEST_CASE("a checkpoint saved with optimizer offload resumes bitwise, with offload and without") {
  using Flags = std::vector<std::pair<std::string, std::string>>;
  const Flags optimizer{{"--offload_optimizer", "true"}}, both{{"--offload_optimizer", "true"}, {"--offload_param", "true"}},
      none{{"--offload_optimizer", "false"}};
  struct Case {
    std::string policy;
    Flags saved;
    std::vector<Flags> resumed;
  };
  for (const auto& c : {Case{"zero2", optimizer, {optimizer, none}}, Case{"full_shard", both, {both, optimizer, none}}}) {
    CAPTURE(c.policy);
    const auto straight = dist_dir("offload_straight_" + c.policy);
    auto args = base_args(c.policy, 4, straight, 10);
    set_flags(args, c.saved);
    set_flags(args, {{"--save_strategy", "steps"}, {"--save_steps", "5"}});
    require_success(launch(2, args, straight / "logs"));
    const auto ckpt = straight / "checkpoint-5";
    REQUIRE(std::filesystem::exists(ckpt / "optimizer-1-of-2.safetensors"));
    for (std::size_t k = 0; k < c.resumed.size(); ++k) {
      CAPTURE(k);
      const auto out = dist_dir("offload_resume_" + c.policy + "_" + std::to_string(k));
      auto resume = base_args(c.policy, 4, out, 10);
      set_flags(resume, c.resumed[k]);
      set_flag(resume, "--resume_from_checkpoint", ckpt.string());
      require_success(launch(2, resume, out / "logs"));
      check_losses(logged_losses(out), logged_losses(straight), 0.0);
      CHECK(weight_difference(out, straight) == 0.0);
    }
  }
}
