// The memory plan (accelerate/memory_plan.hpp) against what the engines hold: every sharding
// policy at 1 and 2 ranks, optimizer and parameter offload, bf16 gathers and LoRA; each model
// state line within 10% of the bytes the engines report after setup and a step
// (Accelerator::model_state_bytes). And the activation estimates of GPT-2, Llama and BERT against
// the memory one training forward keeps on the CPU.

#include "support.hpp"

#include <loom/metrics/memory.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

using namespace dist_test;

namespace plan_dist_test {

// |planned - measured| relative to the larger; 0 when both are 0.
double relative_error(double planned, double measured) {
  const double scale = std::max(std::abs(planned), std::abs(measured));
  return scale == 0 ? 0.0 : std::abs(planned - measured) / scale;
}

}  // namespace plan_dist_test

TEST_CASE("memory plan at 1 and 2 ranks: every model-state line within 10% of the engines' bytes") {
  using plan_dist_test::relative_error;
  using Flags = std::vector<std::pair<std::string, std::string>>;
  struct Case {
    std::string tag, policy;
    int world;
    Flags flags;
  };
  std::vector<Case> cases{{"no_1", "no", 1, {}}};
  for (const auto& policy : kPolicies)
    for (int world : {1, 2}) cases.push_back({policy + "_" + std::to_string(world), policy, world, {}});
  cases.push_back({"zero2_offload", "zero2", 2, {{"--offload_optimizer", "true"}}});
  cases.push_back({"full_shard_offload", "full_shard", 2, {{"--offload_optimizer", "true"}}});
  cases.push_back({"full_shard_offload_param", "full_shard", 2, {{"--offload_optimizer", "true"}, {"--offload_param", "true"}}});
  cases.push_back({"full_shard_bf16", "full_shard", 2, {{"--bf16", "true"}, {"--sharding_param_dtype", "bf16"}}});
  cases.push_back({"zero1_bf16_reduce", "zero1", 2, {{"--bf16", "true"}, {"--sharding_reduce_dtype", "bf16"}}});
  cases.push_back({"lora_zero2", "zero2", 2, {{"--task", "lora"}}});
  cases.push_back({"lora_ddp", "ddp", 2, {{"--task", "lora"}}});
  cases.push_back({"lora_full_shard", "full_shard", 2, {{"--task", "lora"}}});
  double worst = 0, ddp_frozen = 0;
  for (const auto& c : cases) {
    CAPTURE(c.tag);
    const auto out = dist_dir("plan_" + c.tag);
    auto args = base_args(c.policy, 4, out, 2);
    set_flag(args, "--eval_strategy", "no");
    set_flags(args, c.flags);
    require_success(launch(c.world, args, out / "logs", c.policy != "no"));
    const bool lora = c.tag.rfind("lora", 0) == 0;
    for (int r = 0; r < c.world; ++r) {
      CAPTURE(r);
      const auto j = rank_result(out, r);
      REQUIRE(j.contains("plan"));
      const auto& plan = j.at("plan");
      // The LoRA worker reports the optimizer and gradient bytes (its frozen base: the plan's
      // frozen line, whole on every rank but under FullShard).
      const std::vector<std::string> lines =
          lora ? std::vector<std::string>{"grads", "optimizer"} : std::vector<std::string>{"params", "grads", "optimizer", "host"};
      std::string report;
      for (const auto& line : lines) {
        const double planned = plan.at(line).get<double>(), measured = j.at(line).get<double>();
        const double err = relative_error(planned, measured);
        worst = std::max(worst, err);
        report += " " + line + " " + std::to_string(static_cast<int64_t>(planned)) + "/" +
                  std::to_string(static_cast<int64_t>(measured));
        CAPTURE(line);
        CHECK(err <= 0.10);
      }
      if (lora) CHECK(plan.at("frozen").get<double>() > 0);
      if (c.tag == "lora_ddp") ddp_frozen = plan.at("frozen").get<double>();
      if (c.tag == "lora_full_shard") {
        // FullShard shards the frozen base too: the plan's adapter shard and base shard against
        // the engine's parameter bytes at rest, and half the base that DDP keeps whole.
        const double planned = plan.at("params").get<double>() + plan.at("frozen").get<double>();
        const double err = relative_error(planned, j.at("params").get<double>());
        CHECK(err <= 0.10);
        worst = std::max(worst, err);
        REQUIRE(ddp_frozen > 0);  // lora_ddp ran first
        CHECK(plan.at("frozen").get<double>() == doctest::Approx(ddp_frozen / 2).epsilon(0.01));
        report += " params+frozen " + std::to_string(static_cast<int64_t>(planned)) + "/" +
                  std::to_string(static_cast<int64_t>(j.at("params").get<double>()));
      }
      MESSAGE(c.tag << " rank " << r << " planned/measured bytes:" << report);
    }
  }
  MESSAGE("largest model-state error of the plan: " << worst * 100 << "%");
}

namespace plan_dist_test {

// Bytes one training forward (loss and logits kept, no backward) holds on the CPU beyond the
// model: the process RSS after the forward minus before, with glibc's large allocations
// mmapped (M_MMAP_THRESHOLD 64 KiB), so a freed intermediate leaves the RSS at once.
template <class Batch, class Model>
double measured_activations(Model& model, int64_t batch, int64_t seq, int64_t vocab) {
  model->train();
  Batch b{};
  b.input_ids = torch::randint(vocab, {batch, seq}, torch::kLong);
  b.labels = b.input_ids.clone();
  if constexpr (requires { b.attention_mask; }) b.attention_mask = torch::ones({batch, seq}, torch::kLong);
  model->forward(b).loss.backward();  // warm-up: lazy initialisation, gradient buffers
  const int64_t before = loom::cpu_rss_bytes();
  const auto out = model->forward(b);
  const int64_t after = loom::cpu_rss_bytes();
  return static_cast<double>(after - before);
}

}  // namespace plan_dist_test

TEST_CASE("memory plan: the activation estimates of GPT-2, Llama, Gemma 2 and 3, Mixtral, Qwen3-MoE and BERT against one training forward on the CPU") {
  // Process-wide: this test's own process only (loom_dist_tests runs its cases one by one).
  ::mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  ::mallopt(M_TRIM_THRESHOLD, 0);
  torch::manual_seed(0);
  struct Size {
    int64_t hidden, layers, heads, batch, seq;
  };
  double worst = 0;
  // The estimate of `model` (vocabulary 4096) against its measured forward; generous bound:
  // measured within 11% (docs/building.md).
  const auto compare = [&worst]<class Batch>(const char* name, auto& model, const Size& s) {
    const double measured = plan_dist_test::measured_activations<Batch>(model, s.batch, s.seq, 4096);
    const double planned = model->activation_bytes(s.batch, s.seq, 4, false);
    const double err = (planned - measured) / measured;
    worst = std::max(worst, std::abs(err));
    MESSAGE(std::string(name) << " h=" << s.hidden << " L=" << s.layers << " b=" << s.batch << " s=" << s.seq << ": estimate "
                 << planned / 1048576 << " MiB, measured " << measured / 1048576 << " MiB (" << err * 100 << "%)");
    CHECK(std::abs(err) <= 0.25);
  };
  for (const auto& s : {Size{128, 2, 4, 4, 128}, Size{256, 4, 8, 4, 256}}) {
    CAPTURE(s.hidden);
    loom::models::GPT2Config g;
    g.n_embd = s.hidden, g.n_layer = s.layers, g.n_head = s.heads, g.vocab_size = 4096, g.n_positions = 512;
    loom::models::GPT2LMHeadModel gpt2(g);
    compare.template operator()<loom::data::CausalLMBatch>("GPT-2", gpt2, s);
    loom::models::LlamaConfig l;
    l.hidden_size = s.hidden, l.num_hidden_layers = s.layers, l.num_attention_heads = s.heads;
    l.num_key_value_heads = s.heads / 2, l.intermediate_size = s.hidden * 8 / 3, l.vocab_size = 4096;
    l.max_position_embeddings = 512;
    loom::models::LlamaForCausalLM llama(l);
    compare.template operator()<loom::data::CausalLMBatch>("Llama", llama, s);
    // Gemma 2: four norms a layer, the soft-capped attention written out, the capped head;
    // Gemma 3: its q/k norms, sdpa again.
    for (const char* type : {"gemma2", "gemma3_text"}) {
      auto g = l;
      g.model_type = type, g.head_dim = s.hidden / s.heads, g.sliding_window = s.seq / 2;
      if (g.model_type == "gemma2") g.attn_logit_softcapping = 50.0, g.final_logit_softcapping = 30.0;
      loom::models::LlamaForCausalLM gemma(g);
      compare.template operator()<loom::data::CausalLMBatch>(type, gemma, s);
    }
    // Mixtral: every layer sparse (8 experts, top 2, experts as wide as Llama's MLP); Qwen3-MoE:
    // its q/k norms, narrower experts (top 4 of 8), layer 1 dense, the load-balancing loss on.
    {
      auto m = l;
      m.model_type = "mixtral", m.num_local_experts = 8, m.num_experts_per_tok = 2;
      loom::models::LlamaForCausalLM mixtral(m);
      compare.template operator()<loom::data::CausalLMBatch>("Mixtral", mixtral, s);
      auto q = l;
      q.model_type = "qwen3_moe", q.head_dim = s.hidden / s.heads, q.num_local_experts = 8, q.num_experts_per_tok = 4;
      q.moe_intermediate_size = s.hidden / 2, q.mlp_only_layers = nlohmann::json::array({1});
      q.output_router_logits = true;
      loom::models::LlamaForCausalLM qwen3_moe(q);
      compare.template operator()<loom::data::CausalLMBatch>("Qwen3-MoE", qwen3_moe, s);
    }
    loom::models::BertConfig b;
    b.hidden_size = s.hidden, b.num_hidden_layers = s.layers, b.num_attention_heads = s.heads;
    b.intermediate_size = 4 * s.hidden, b.vocab_size = 4096;
    loom::models::BertForMaskedLM bert(b);
    compare.template operator()<loom::data::SequenceBatch>("BERT (MLM)", bert, s);
  }
  MESSAGE("largest activation estimate error: " << worst * 100 << "%");
}
