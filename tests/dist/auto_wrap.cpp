// FullShard's auto-wrap at 2 ranks (issue 28 point 2): HF's policies choose which of the
// model's FullShardUnits are units, by the wrapped block's class
// (--fsdp_transformer_layer_cls_to_wrap) or by size (--fsdp_min_num_params, innermost first),
// and units may nest (main.cpp's MLP with --nested holds `pair`, a unit with a unit inside).
// Each choice trains as one process without sharding; the units each rank used are checked
// by name, and the policies that have no units refuse the flags. The workers are main.cpp's.

#include "support.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace dist_test;  // NOLINT: the runner helpers

namespace {

constexpr int64_t b = 4, hidden = 64;  // per-rank batch, the MLP's width

// The nested MLP's arguments (main.cpp's --nested) under `policy`.
std::vector<std::string> flags(const std::string& policy, int64_t batch, const fs::path& out) {
  auto a = base_args(policy, batch, out);
  set_flags(a, {{"--nested", "true"}, {"--hidden", std::to_string(hidden)}});
  return a;
}

// The reference: one process without sharding on both ranks' batch, in dist_dir(`name`).
fs::path reference_run(const std::string& name) {
  const auto ref = dist_dir(name);
  require_success(launch(1, flags("no", 2 * b, ref), ref / "logs", /*launched=*/false));
  return ref;
}

}  // namespace

TEST_CASE("auto-wrap at 2 ranks: nested units, by class and by size, train as one process") {
  const auto ref = reference_run("wrap_ref");
  const auto want = logged_losses(ref);
  REQUIRE(want.size() == 10);
  struct Case {
    std::string tag;
    std::vector<std::pair<std::string, std::string>> flags;
    std::vector<std::string> units;  // the root ("") first, then in module order
  };
  // Parameters: l1 16x64 + 64 = 1088, l2 / pair.inner / pair.mix 64x64 + 64 = 4160 each.
  const std::vector<Case> cases{
      {"every", {}, {"", "l1", "l2", "pair", "pair.inner"}},
      {"class_linear", {{"--fsdp_transformer_layer_cls_to_wrap", "Linear"}}, {"", "l1", "l2", "pair.inner"}},
      {"class_pair", {{"--fsdp_transformer_layer_cls_to_wrap", "Pair"}}, {"", "pair"}},
      // pair.inner (4160) first, then pair's own mix (4160), l2 (4160); l1 (1088) joins the root.
      {"size", {{"--fsdp_min_num_params", "4096"}}, {"", "l2", "pair", "pair.inner"}},
      // Nothing inside pair reaches 5000 alone; pair with its inner layer does (8320).
      {"size_outer", {{"--fsdp_min_num_params", "5000"}}, {"", "pair"}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    const auto out = dist_dir("wrap_" + c.tag);
    auto args = flags("full_shard", b, out);
    set_flags(args, c.flags);
    require_success(launch(2, args, out / "logs"));
    check_losses(logged_losses(out), want, 1e-5);
    const double diff = weight_difference(out, ref);
    MESSAGE(c.tag << ": final weights differ from one process by " << diff << " (relative)");
    CHECK(diff < 1e-5);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto j = rank_result(out, r);
      CHECK(j.at("units").get<std::vector<std::string>>() == c.units);
      // The memory plan chose the same units: its model state is what the engine holds.
      for (const char* line : {"params", "grads", "optimizer"}) {
        CAPTURE(line);
        const double planned = j.at("plan").at(line).get<double>(), measured = j.at(line).get<double>();
        CHECK(std::abs(planned - measured) <= 0.10 * measured);
      }
    }
  }
}

TEST_CASE("auto-wrap with --gradient_checkpointing: nested units recompute inside their outer block, as one process") {
  // The outermost blocks recompute (l1, l2, pair; pair.inner is covered by pair's
  // recomputation). Under FullShard, a unit inside a recomputed block (pair.inner under
  // "every" and "size") gathers its parameters a second time during the outer block's
  // backward; a block that is no unit (pair under "class_linear") recomputes from the
  // parameters its enclosing unit holds.
  const auto ref = reference_run("wrap_ckpt_ref");
  const auto want = logged_losses(ref);
  const auto plain_runs = rank_result(ref, 0).at("pair_runs").get<int64_t>();
  CHECK(plain_runs > 0);
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> cases{
      {"every", {}},
      {"class_linear", {{"--fsdp_transformer_layer_cls_to_wrap", "Linear"}}},
      {"size", {{"--fsdp_min_num_params", "4096"}}},
  };
  for (const auto& [tag, wrap] : cases) {
    CAPTURE(tag);
    const auto out = dist_dir("wrap_ckpt_" + tag);
    auto args = flags("full_shard", b, out);
    set_flags(args, wrap);
    set_flags(args, {{"--gradient_checkpointing", "true"}});
    require_success(launch(2, args, out / "logs"));
    check_losses(logged_losses(out), want, 1e-5);
    const double diff = weight_difference(out, ref);
    MESSAGE(tag << " with recomputation: final weights differ from one process by " << diff << " (relative)");
    CHECK(diff < 1e-5);
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const auto j = rank_result(out, r);
      CHECK(j.at("recomputing").get<std::vector<std::string>>() == std::vector<std::string>{"l1", "l2", "pair"});
      // Each training forward of pair ran once more in backward (the reference's batch is
      // both ranks' together: the same number of forwards).
      CHECK(j.at("pair_runs").get<int64_t>() == 2 * plain_runs);
    }
  }
}

TEST_CASE("auto-wrap flags a policy cannot honour stop every rank with one loom: line") {
  const auto out = dist_dir("wrap_refused");
  auto args = base_args("full_shard", 4, out);
  set_flags(args, {{"--nested", "true"}, {"--fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer"}});
  auto l = launch(2, args, out / "logs");
  for (int r = 0; r < 2; ++r) {
    CHECK(l.status[static_cast<std::size_t>(r)] != 0);
    CHECK(l.err[static_cast<std::size_t>(r)].find("loom: --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer: no "
                                                  "FullShardUnit of the model wraps a LlamaDecoderLayer (the units "
                                                  "wrap: Linear, Pair)") != std::string::npos);
  }
  args = base_args("zero2", 4, out);
  set_flags(args, {{"--fsdp_min_num_params", "100"}});
  l = launch(2, args, out / "logs");
  CHECK(l.err[0].find("loom: --fsdp_transformer_layer_cls_to_wrap / --fsdp_min_num_params choose --sharding "
                      "full_shard's units; --sharding zero2 has none") != std::string::npos);
}
