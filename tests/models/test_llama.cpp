// The Llama architecture (loom/models/llama.hpp) against transformers: Llama, Qwen2 and
// Mistral folders that transformers itself makes (tests/models/hf_llama.py), read by loom
// with the same logits and loss; what loom saves, opened by transformers as the same class;
// the config's refusals.

#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/core/forward_request.hpp>
#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/bert.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>
#include <loom/peft/lora.hpp>
#include <loom/peft/lora_arguments.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include "peer_support.hpp"

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace llama_test {

namespace fs = std::filesystem;
using loom::models::LlamaConfig;
using loom::models::LlamaForCausalLM;
using Named = loom_test::NamedTensors;

inline std::string script() { return (loom_test::source_dir() / "tests/models/hf_llama.py").string(); }

// The folders hf_llama.py makes, made once per run (nullptr: no Python).
inline const fs::path* made() {
  return loom_test::peer_made("hf_llama.py", "hf_llama", "made llama", "the comparison with transformers");
}

using loom_test::named;

// Largest |a - b| over the largest |b|.
inline double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

inline LlamaConfig tiny(const std::string& model_type = "llama") {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = 100, c.hidden_size = 48, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 128;
  c.bos_token_id = 0, c.eos_token_id = 1;
  return c;
}

// PEFT's adapters (hf_llama.py lora_make), made once per run beside made()'s folders; the
// logits PEFT gave with them.
inline Named made_adapters(const fs::path& dir) {
  static bool done = false;
  if (!done) {
    const auto out = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " lora_make " +
                                            dir.string() + " 2>&1");
    INFO(out);
    REQUIRE(out.find("made peft_adapter, gpt2_peft_adapter, bert_peft_adapter") != std::string::npos);
    done = true;
  }
  return loom::checkpoint::load_safetensors(dir / "lora_expected.safetensors");
}

// What hf_llama.py lora_check prints (PEFT opening loom's `adapter` on `base`, compared with
// `expected`'s loom_logits), ending "exit=<status>".
inline std::string peft_check(const fs::path& base, const fs::path& adapter, const fs::path& expected) {
  return loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " lora_check " + base.string() +
                                " " + adapter.string() + " " + expected.string() + " 2>&1; echo \"exit=$?\"");
}

const std::vector<std::string> kFolders{"llama",         "llama_tied",   "qwen2",        "qwen3",      "mistral",
                                        "mistral_window", "qwen2_window", "llama_linear", "llama_yarn", "qwen3_yarn",
                                        "llama_dynamic",  "llama_longrope", "llama_sharded", "llama_bf16",
                                        "phi3",           "phi3_longrope", "phi3_partial", "gemma",
                                        "gemma2",         "gemma3_text",   "mixtral",      "qwen3_moe"};


TEST_CASE("the Llama family counts its parameters from the config, for every variant of its layers") {
  const auto counted = [](const LlamaConfig& c) { return loom::models::parameter_count(c); };
  auto c = tiny();
  CHECK(counted(c) == LlamaForCausalLM(c)->num_parameters());
  c.tie_word_embeddings = true, c.attention_bias = true, c.mlp_bias = true, c.head_dim = 16;
  CHECK(counted(c) == LlamaForCausalLM(c)->num_parameters());
  auto q = tiny("qwen2");  // biases on q, k and v only
  CHECK(counted(q) == LlamaForCausalLM(q)->num_parameters());
  q.num_key_value_heads = std::nullopt;
  CHECK(counted(q) == LlamaForCausalLM(q)->num_parameters());
  auto q3 = tiny("qwen3");  // q_norm and k_norm in each layer
  q3.head_dim = 16, q3.attention_bias = true;
  CHECK(counted(q3) == LlamaForCausalLM(q3)->num_parameters());
  auto p3 = tiny("phi3");  // qkv_proj and gate_up_proj: the same counts, fused
  CHECK(counted(p3) == LlamaForCausalLM(p3)->num_parameters());
  auto mixtral = tiny("mixtral");  // a router and 8 experts a layer
  CHECK(counted(mixtral) == LlamaForCausalLM(mixtral)->num_parameters());
  auto q3moe = tiny("qwen3_moe");  // sparse and dense layers, experts of their own width
  q3moe.num_hidden_layers = 3, q3moe.num_local_experts = 4, q3moe.num_experts_per_tok = 2, q3moe.moe_intermediate_size = 32;
  q3moe.mlp_only_layers = nlohmann::json::array({1});
  CHECK(counted(q3moe) == LlamaForCausalLM(q3moe)->num_parameters());
}

TEST_CASE("the Llama architecture's families are one table: names, keys and layers follow it") {
  for (const auto& family : loom::models::kLlamaFamilies) {
    CAPTURE(family.model_type);
    auto c = tiny(std::string(family.model_type));
    LlamaForCausalLM model(c);
    CHECK(model->architecture_name() == family.causal_lm);
    CHECK(model->model->units[0]->block_class() == family.decoder_layer);  // --fsdp_transformer_layer_cls_to_wrap
    const auto& attention = model->model->units[0]->inner()->self_attn;
    const auto& mlp = model->model->units[0]->inner()->mlp;
    const auto& moe = model->model->units[0]->inner()->moe;
    CHECK(attention->q_norm.is_empty() == !family.qk_norm);
    CHECK(attention->qkv_proj.is_empty() == !family.fused_projections);  // Phi-3's fused projections
    CHECK(attention->q_proj.is_empty() == family.fused_projections);
    CHECK(mlp.is_empty() == !family.moe_block.empty());  // Mixtral's and Qwen3-MoE's sparse blocks
    CHECK(moe.is_empty() == family.moe_block.empty());
    if (!mlp.is_empty()) CHECK(mlp->gate_up_proj.is_empty() == !family.fused_projections);
    if (!moe.is_empty()) CHECK(moe->block_class() == family.moe_block_class);  // its own FullShard unit
    const auto& q = family.fused_projections ? attention->qkv_proj : attention->q_proj;
    CHECK(q->bias.defined() == family.qkv_bias);
    CHECK(c.written("head_dim") == ((family.keys & loom::models::LlamaFamily::head_dim_key) != 0));
  }
  // Qwen3's config defaults head_dim to 128, not hidden_size / num_attention_heads, as transformers.
  auto q3 = tiny("qwen3");
  loom::models::complete_config(q3);
  CHECK(q3.head_dim == 128);
  auto l = tiny("llama");
  loom::models::complete_config(l);
  CHECK(l.head_dim == 12);
  CHECK(loom::peft::default_target_modules("qwen3") == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(loom::peft::default_target_modules("phi3").empty());  // PEFT's mapping has no phi3 entry either
  CHECK(loom::peft::default_target_modules("gemma") == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(loom::peft::default_target_modules("mixtral") == std::vector<std::string>{"q_proj", "v_proj"});
  CHECK(loom::peft::default_target_modules("qwen3_moe").empty());  // none in PEFT's mapping either
  // Gemma: head_dim 256 unless given, norms starting at 0 (a factor of 1), "gelu" read as the tanh form.
  auto g = tiny("gemma");
  g.head_dim = std::nullopt, g.hidden_act = "gelu";
  loom::models::complete_config(g);
  CHECK(g.head_dim == 256);
  CHECK(g.hidden_act == "gelu_pytorch_tanh");
  CHECK(torch::equal(LlamaForCausalLM(tiny("gemma"))->model->norm->weight, torch::zeros({tiny("gemma").hidden_size})));
}

TEST_CASE("Llama, Qwen2, Qwen3 and Mistral folders made by transformers give its logits and loss in loom") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  torch::NoGradGuard no_grad;
  double worst = 0, worst_loss = 0;
  for (const auto& name : kFolders) {
    CAPTURE(name);
    auto model = LlamaForCausalLM::from_pretrained(*dir / name);
    model->eval();
    CHECK((model->parameters()[0].scalar_type() == torch::kFloat));  // bf16 files read into float32
    const auto out = model->forward({named(expected, "input_ids"), named(expected, "labels")});
    const double d = relative(out.logits, named(expected, name + "_logits"));
    const double l = relative(out.loss.reshape({1}), named(expected, name + "_loss"));
    INFO(name << ": logits " << d << ", loss " << l);
    CHECK(d <= 1e-5);
    CHECK(l <= 1e-5);
    worst = std::max(worst, d), worst_loss = std::max(worst_loss, l);
    CHECK(torch::equal(model->logits(named(expected, "input_ids")), out.logits));
  }
  // bf16 and float32 files into bf16 parameters, as asked: the bf16 file's values exactly.
  auto in_bf16 = LlamaForCausalLM::from_pretrained(*dir / "llama_bf16", torch::kBFloat16);
  auto in_fp32 = LlamaForCausalLM::from_pretrained(*dir / "llama_bf16");
  CHECK((in_bf16->parameters()[0].scalar_type() == torch::kBFloat16));
  for (const auto& p : in_fp32->named_parameters())
    CHECK(torch::equal(in_bf16->named_parameters()[p.key()], p.value().to(torch::kBFloat16)));
  in_bf16->eval();
  const auto bf16_logits = in_bf16->logits(named(expected, "input_ids")).to(torch::kFloat);
  CHECK(relative(bf16_logits, named(expected, "llama_bf16_logits")) < 5e-2);  // computed in bf16
  CHECK((LlamaForCausalLM::from_pretrained(*dir / "llama", torch::kHalf)->parameters()[0].scalar_type() == torch::kHalf));
  CHECK(loom_test::error_of([&] { LlamaForCausalLM::from_pretrained(*dir / "llama", torch::kInt); })
            .find("dtype must be a floating-point type") != std::string::npos);
  auto qwen = LlamaForCausalLM::from_pretrained(*dir / "qwen2");
  CHECK(qwen->config().model_type == "qwen2");
  auto& layer = qwen->model->units[0]->inner();
  CHECK(layer->self_attn->q_proj->bias.defined());
  CHECK_FALSE(layer->self_attn->o_proj->bias.defined());
  CHECK(qwen->config().tie_word_embeddings);
  CHECK(LlamaForCausalLM::from_pretrained(*dir / "llama")->config().rope_parameters["rope_type"] == "llama3");
  auto qwen3 = LlamaForCausalLM::from_pretrained(*dir / "qwen3");
  CHECK(qwen3->config().head_dim == 16);
  CHECK(qwen3->model->units[1]->inner()->self_attn->k_norm->weight.size(0) == 16);
  // A config that disagrees with its weights is refused before the model is built.
  const auto wrong = loom_test::fresh_dir("models/llama_wrong_layers");
  fs::copy(*dir / "llama", wrong, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  auto j = loom::json::read_file(wrong / "config.json");
  j["num_hidden_layers"] = 3;
  loom_test::write_bytes(wrong / "config.json", j.dump());
  const auto mismatch = loom_test::error_of([&] { LlamaForCausalLM::from_pretrained(wrong); });
  CHECK(mismatch.starts_with("loom: "));
  CHECK(mismatch.find("model.layers.2.self_attn.k_proj.weight") != std::string::npos);
  MESSAGE("largest relative difference from transformers: logits " << worst << ", loss " << worst_loss);
}

TEST_CASE("what loom saves of a Llama-architecture model, transformers opens as the same class with the same logits") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto out = loom_test::fresh_dir("models/llama_saved");
  std::string groups;
  for (const auto& name : kFolders) {
    auto model = LlamaForCausalLM::from_pretrained(*dir / name);
    model->save_pretrained(out / name, {.max_shard_size = name == "llama_sharded" ? 40'000 : 50'000'000'000});
    groups += " " + name + "," + (out / name).string() + "," + (*dir / "expected.safetensors").string();
  }
  const auto config = loom::json::read_file(out / "qwen2" / "config.json");
  CHECK(config["architectures"] == nlohmann::json::array({"Qwen2ForCausalLM"}));
  CHECK(config["model_type"] == "qwen2");
  CHECK_FALSE(config.contains("attention_bias"));  // a Llama key, not Qwen2's
  CHECK_FALSE(config.contains("rope_theta"));       // folded into rope_parameters
  const auto qwen3_config = loom::json::read_file(out / "qwen3" / "config.json");
  CHECK(qwen3_config["architectures"] == nlohmann::json::array({"Qwen3ForCausalLM"}));
  CHECK(qwen3_config["head_dim"] == 16);
  CHECK(qwen3_config["attention_bias"] == true);
  CHECK_FALSE(qwen3_config.contains("mlp_bias"));  // a Llama key
  CHECK(fs::exists(out / "llama_sharded" / "model.safetensors.index.json"));
  // The MoE families' keys, as transformers writes them: num_experts is num_local_experts.
  const auto mixtral_config = loom::json::read_file(out / "mixtral" / "config.json");
  CHECK(mixtral_config["num_local_experts"] == 4);
  CHECK(mixtral_config["output_router_logits"] == true);
  CHECK(mixtral_config.contains("router_jitter_noise"));
  CHECK_FALSE(mixtral_config.contains("norm_topk_prob"));  // Qwen3-MoE's
  const auto qwen3_moe_config = loom::json::read_file(out / "qwen3_moe" / "config.json");
  CHECK(qwen3_moe_config["num_local_experts"] == 4);
  CHECK_FALSE(qwen3_moe_config.contains("num_experts"));
  CHECK(qwen3_moe_config["mlp_only_layers"] == nlohmann::json::array({1}));
  CHECK(qwen3_moe_config["moe_intermediate_size"] == 32);
  CHECK_FALSE(qwen3_moe_config.contains("router_jitter_noise"));  // Mixtral's
  const auto result = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " check" + groups +
                                             " 2>&1; echo \"exit=$?\"");
  INFO(result);
  CHECK(result.find("exit=0") != std::string::npos);
  for (const auto& name : kFolders) CHECK(result.find(name + ": logits ") != std::string::npos);
}

TEST_CASE("Llama-architecture and GPT-2 sequence classifiers: transformers' logits and loss, padding either side; saved, opened") {
  using loom::models::LlamaForSequenceClassification;
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  const auto ids = named(expected, "cls_input_ids"), mask = named(expected, "cls_attention_mask");
  const auto out_dir = loom_test::fresh_dir("models/llama_seqcls_saved");
  std::string groups;
  for (const auto& [name, labels] : {std::pair<std::string, std::string>{"llama_seqcls", "cls_labels"},
                                     {"qwen2_reward", "reward_labels"}}) {
    CAPTURE(name);
    auto model = LlamaForSequenceClassification::from_pretrained(*dir / name);
    model->eval();
    torch::NoGradGuard no_grad;
    const auto out = model->forward({ids, mask, named(expected, labels)});
    CHECK(relative(out.logits, named(expected, name + "_logits")) <= 1e-5);
    CHECK(relative(out.loss.reshape({1}), named(expected, name + "_loss")) <= 1e-5);
    // The pooled positions: each row's last token (row 3 is padded on the left).
    CHECK(model->pooled_positions(ids).to(torch::kLong).equal(torch::tensor({19, 13, 8, 19})));
    model->save_pretrained(out_dir / name);
    groups += " " + name + "," + (out_dir / name).string() + "," + (*dir / "expected.safetensors").string();
  }
  {  // GPT-2's classifier, multi-label (float 0/1 targets, BCE)
    auto gpt2 = loom::models::GPT2ForSequenceClassification::from_pretrained(*dir / "gpt2_seqcls");
    gpt2->eval();
    torch::NoGradGuard no_grad;
    const auto out = gpt2->forward({ids, mask, named(expected, "multi_labels")});
    CHECK(relative(out.logits, named(expected, "gpt2_seqcls_logits")) <= 1e-5);
    CHECK(relative(out.loss.reshape({1}), named(expected, "gpt2_seqcls_loss")) <= 1e-5);
    gpt2->save_pretrained(out_dir / "gpt2_seqcls");
    groups += " gpt2_seqcls," + (out_dir / "gpt2_seqcls").string() + "," + (*dir / "expected.safetensors").string();
  }
  const auto config = loom::json::read_file(out_dir / "qwen2_reward" / "config.json");
  CHECK(config["architectures"] == nlohmann::json::array({"Qwen2ForSequenceClassification"}));
  CHECK(config["id2label"] == nlohmann::json{{"0", "LABEL_0"}});
  CHECK_FALSE(config.contains("num_labels"));
  CHECK_FALSE(loom::json::read_file(out_dir / "llama_seqcls" / "config.json").contains("problem_type"));
  CHECK_FALSE(loom::json::read_file(*dir / "llama" / "config.json").contains("id2label"));  // a causal LM's has none
  const auto result = loom_test::run_capture(std::string(loom_test::python("")) + " " + script() + " check" + groups +
                                             " 2>&1; echo \"exit=$?\"");
  INFO(result);
  CHECK(result.find("exit=0") != std::string::npos);
  CHECK(result.find("qwen2_reward: logits ") != std::string::npos);
  CHECK(result.find("gpt2_seqcls: logits ") != std::string::npos);

  // A reward model from a causal LM's folder: the body read, lm_head left out, score new.
  auto causal = LlamaForCausalLM::from_pretrained(*dir / "llama");
  auto reward = LlamaForSequenceClassification::from_pretrained(*dir / "llama", torch::kFloat, 1);
  CHECK(reward->config().num_labels == 1);
  CHECK(reward->score->weight.sizes() == torch::IntArrayRef({1, 48}));
  CHECK(torch::equal(reward->model->embed_tokens->weight, causal->model->embed_tokens->weight));
  CHECK(loom::json::read_file(*dir / "llama" / "config.json")["architectures"][0] == "LlamaForCausalLM");
  // Without pad_token_id only a batch of one, as transformers.
  CHECK(loom_test::error_of([&] { reward->logits(ids); }).find("without pad_token_id") != std::string::npos);
  CHECK(reward->logits(ids.narrow(0, 0, 1)).sizes() == torch::IntArrayRef({1, 1}));
  // Labels that do not fit the problem type: one loom: line naming the class.
  auto classifier = LlamaForSequenceClassification::from_pretrained(*dir / "llama_seqcls");
  const auto wrong = loom_test::error_of([&] { classifier->forward({ids, mask, torch::ones({4, 2})}); });
  CHECK(wrong.starts_with("loom: LlamaForSequenceClassification with problem_type unset"));
}

TEST_CASE("the Llama architecture's names are HF's, each decoder layer a FullShard unit; tied heads share") {
  torch::manual_seed(0);
  LlamaForCausalLM untied(tiny());
  std::vector<std::string> names;
  for (const auto& p : untied->named_parameters()) names.push_back(p.key());
  CHECK(names.front() == "model.embed_tokens.weight");
  CHECK(std::find(names.begin(), names.end(), "model.layers.1.self_attn.k_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "model.layers.0.mlp.gate_proj.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "model.layers.0.post_attention_layernorm.weight") != names.end());
  CHECK(std::find(names.begin(), names.end(), "model.norm.weight") != names.end());
  CHECK(names.back() == "lm_head.weight");
  CHECK(untied->named_parameters()["model.layers.0.self_attn.k_proj.weight"].sizes() == torch::IntArrayRef({24, 48}));
  // The two decoder layers, and (untied) the embeddings and the head as units of their own.
  std::vector<std::string> units;
  for (const auto& m : untied->modules(false))
    if (const auto* u = dynamic_cast<loom::dist::FullShardUnitBase*>(m.get())) units.push_back(u->block_class());
  CHECK(units == std::vector<std::string>{"Embedding", "LlamaDecoderLayer", "LlamaDecoderLayer", "Linear"});
  auto c = tiny();
  c.tie_word_embeddings = true;
  LlamaForCausalLM tied(c);
  CHECK(tied->lm_head.is_empty());
  CHECK(tied->num_parameters() == untied->num_parameters() - 100 * 48);
  // A tied config whose file holds an lm_head.weight of its own: a copy of the embeddings is
  // read; other values (a model trained untied) are refused rather than dropped by the tie.
  const auto dir = loom_test::fresh_dir("models/llama_tied_head");
  tied->save_pretrained(dir);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : tied->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
  tensors.emplace_back("lm_head.weight", tied->named_parameters()["model.embed_tokens.weight"].detach().clone());
  loom::checkpoint::save_safetensors(tensors, dir / "model.safetensors", {{"format", "pt"}});
  CHECK_NOTHROW(LlamaForCausalLM::from_pretrained(dir));
  tensors.back().second = tensors.back().second + 1;
  loom::checkpoint::save_safetensors(tensors, dir / "model.safetensors", {{"format", "pt"}});
  const auto own_head = loom_test::error_of([&] { LlamaForCausalLM::from_pretrained(dir); });
  CHECK(own_head.starts_with("loom: "));
  CHECK(own_head.find("lm_head.weight differs from model.embed_tokens.weight in the file, but the config ties them "
                      "(tie_word_embeddings true)") != std::string::npos);
}

TEST_CASE("Gemma 2 and 3: their configs' defaults and older keys, the soft-caps that count, the loss paths under the cap") {
  // Gemma2Config / Gemma3TextConfig's defaults: head_dim 256, query_pre_attn_scalar 256,
  // hidden_activation for hidden_act, layer_types from the pattern (every 2nd / 6th layer full).
  auto g2 = tiny("gemma2");
  g2.num_hidden_layers = 4, g2.hidden_activation = "gelu_pytorch_tanh";
  loom::models::complete_config(g2);
  CHECK(g2.head_dim == 256);
  CHECK(g2.query_pre_attn_scalar == 256);
  CHECK(g2.hidden_act == "gelu_pytorch_tanh");
  CHECK(g2.layer_types == nlohmann::json::array({"sliding_attention", "full_attention", "sliding_attention",
                                                 "full_attention"}));
  CHECK_FALSE(g2.written("hidden_act"));
  CHECK(g2.written("hidden_activation"));
  CHECK_FALSE(tiny("llama").written("query_pre_attn_scalar"));
  auto g3 = tiny("gemma3_text");
  g3.num_hidden_layers = 7;
  loom::models::complete_config(g3);
  CHECK(g3.layer_types[5] == "full_attention");
  CHECK(g3.layer_types[6] == "sliding_attention");
  CHECK(g3.rope_parameters == nlohmann::json{{"full_attention", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
                                             {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}});
  for (const char* type : {"gemma2", "gemma3_text"})
    CHECK(loom::peft::default_target_modules(type) == std::vector<std::string>{"q_proj", "v_proj"});
  // Four (1 + w) norms a layer, counted from the config as built.
  auto small = tiny("gemma2");
  small.head_dim = 16;
  CHECK(loom::models::parameter_count(small) == LlamaForCausalLM(small)->num_parameters());
  small.model_type = "gemma3_text";
  CHECK(loom::models::parameter_count(small) == LlamaForCausalLM(small)->num_parameters());
  CHECK(torch::equal(LlamaForCausalLM(small)->model->units[0]->inner()->post_feedforward_layernorm->weight,
                     torch::zeros({48})));

  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  const auto ids = named(expected, "input_ids"), labels = named(expected, "labels");
  torch::NoGradGuard no_grad;
  // A Gemma 3 config.json in the older keys (rope_theta, rope_local_base_freq, rope_scaling,
  // sliding_window_pattern; no layer_types or rope_parameters) reads as the same model.
  const auto legacy = loom_test::fresh_dir("models/gemma3_legacy");
  fs::copy(*dir / "gemma3_text", legacy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  auto j = loom::json::read_file(legacy / "config.json");
  j.erase("layer_types"), j.erase("rope_parameters");
  j["rope_theta"] = 1000000.0, j["rope_local_base_freq"] = 100.0, j["sliding_window_pattern"] = 2;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  loom_test::write_bytes(legacy / "config.json", j.dump());
  auto older = LlamaForCausalLM::from_pretrained(legacy);
  older->eval();
  CHECK(torch::equal(older->logits(ids), named(expected, "gemma3_text_logits")));
  // The soft-caps bind in the peer's folder: without them the logits move well past 1e-5.
  const auto uncapped = loom_test::fresh_dir("models/gemma2_uncapped");
  fs::copy(*dir / "gemma2", uncapped, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  for (const char* cap : {"attn_logit_softcapping", "final_logit_softcapping"}) {
    auto k = loom::json::read_file(*dir / "gemma2" / "config.json");
    k[cap] = nullptr;
    loom_test::write_bytes(uncapped / "config.json", k.dump());
    auto model = LlamaForCausalLM::from_pretrained(uncapped);
    model->eval();
    CAPTURE(cap);
    CHECK(relative(model->logits(ids), named(expected, "gemma2_logits")) > 1e-3);
  }
  // Every loss path takes the capped logits: the loss alone (the Trainer's training forward),
  // and the token scores DPO reads; the chunked loss has no cap and is refused when asked for.
  auto gemma2 = LlamaForCausalLM::from_pretrained(*dir / "gemma2");
  gemma2->eval();
  const auto whole = gemma2->forward({ids, labels});
  {
    loom::ForwardRequestScope request({.logits = false, .chunked_lm_loss = std::nullopt});
    CHECK(gemma2->forward({ids, labels}).loss.item<float>() == whole.loss.item<float>());
  }
  {
    loom::ForwardRequestScope request({.logits = false, .chunked_lm_loss = true});
    const auto refused = loom_test::error_of([&] { gemma2->forward({ids, labels}); });
    CHECK(refused.starts_with("loom: the chunked LM loss (--chunked_lm_loss true) has no final logit soft-capping"));
  }
  // In bfloat16 the written-out attention masks with bfloat16's own lowest value: finite, and
  // within bfloat16's rounding of the float32 logits.
  auto in_bf16 = LlamaForCausalLM::from_pretrained(*dir / "gemma2", torch::kBFloat16);
  in_bf16->eval();
  const auto bf16_logits = in_bf16->logits(ids).to(torch::kFloat);
  CHECK(bf16_logits.isfinite().all().item<bool>());
  CHECK(relative(bf16_logits, named(expected, "gemma2_logits")) < 5e-2);
  const auto scores = gemma2->token_scores({ids, labels});
  const auto shifted = torch::constant_pad_nd(labels, {0, 1}, -100).narrow(1, 1, labels.size(1));
  const auto scored = shifted.ne(-100);
  const auto log_probs = torch::log_softmax(whole.logits, -1).gather(-1, shifted.clamp_min(0).unsqueeze(-1)).squeeze(-1);
  CHECK(torch::allclose(scores.log_probs.masked_select(scored), log_probs.masked_select(scored), 1e-6, 1e-6));
  // The config's refusals, one loom: line each.
  const auto error = [](LlamaConfig c) { return loom_test::error_of([&] { LlamaForCausalLM m(std::move(c)); }); };
  auto c = small;
  c.model_type = "gemma2", c.attn_logit_softcapping = 0.0;
  CHECK(error(c).find("field 'attn_logit_softcapping' must be a positive number or null, got 0") != std::string::npos);
  c = small;
  c.sliding_window_pattern = 0;
  CHECK(error(c).find("field 'sliding_window_pattern' must be a positive integer, got 0") != std::string::npos);
  c = small;
  c.rope_parameters = {{"global", {{"rope_type", "default"}, {"rope_theta", 1e6}}}};
  CHECK(error(c).find("field 'rope_parameters.global' is not supported; gemma3_text's rope_parameters holds one rope "
                      "per layer type") != std::string::npos);
  c = small;
  c.rope_parameters = {{"full_attention", {{"rope_type", "yarn"}, {"rope_theta", 1e6}}}};
  CHECK(error(c).find("field 'rope_parameters.full_attention.original_max_position_embeddings' must be a number for "
                      "rope_type yarn") != std::string::npos);
}

TEST_CASE("dynamic NTK rope keeps transformers' state: grown past max_position_embeddings, reset below it") {
  auto c = tiny();
  c.max_position_embeddings = 16;
  c.rope_parameters = {{"rope_type", "dynamic"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
  torch::manual_seed(5);
  const auto ids = torch::randint(100, {1, 24});
  const auto fresh = [&] {
    torch::manual_seed(4);
    LlamaForCausalLM m(c);
    m->eval();
    return m;
  };
  torch::NoGradGuard no_grad;
  auto model = fresh();
  const auto short_before = model->logits(ids.narrow(1, 0, 8));
  const auto grown = model->logits(ids);                    // 24 > 16: frequencies for 24 positions
  const auto middle = model->logits(ids.narrow(1, 0, 20));  // 16 < 20 < 24: still those of 24
  CHECK_FALSE(torch::equal(middle, fresh()->logits(ids.narrow(1, 0, 20))));
  CHECK(torch::equal(model->logits(ids.narrow(1, 0, 8)), short_before));  // below 16: the original ones again
  CHECK(torch::equal(grown, fresh()->logits(ids)));
}

TEST_CASE("Llama configs loom cannot compute are refused with a loom: line naming the field") {
  const auto error = [](LlamaConfig c) { return loom_test::error_of([&] { LlamaForCausalLM m(std::move(c)); }); };
  auto c = tiny();
  c.rope_parameters = {{"rope_type", "proportional"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  CHECK(error(c).find("field 'rope_parameters.rope_type' is \"proportional\"") != std::string::npos);
  c.rope_parameters = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}, {"original_max_position_embeddings", 16},
                       {"short_factor", {1.0, 1.0}}, {"long_factor", {1.0, 1.0}}};
  CHECK(error(c).find("'rope_parameters.short_factor' must be a list of 6 positive numbers") != std::string::npos);
  c.rope_parameters = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}};  // no original length
  CHECK(error(c).find("'rope_parameters.original_max_position_embeddings' must be a number for rope_type yarn") !=
        std::string::npos);
  c.rope_parameters = {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 0.5}};
  CHECK(error(c).find("'rope_parameters.factor' must be at least 1") != std::string::npos);
  c = tiny();
  c.rope_parameters = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
  CHECK(error(c).find("'rope_parameters.partial_rotary_factor' is 0.5; loom's llama rotary embedding turns the whole "
                      "head (1.0)") != std::string::npos);
  c.rope_parameters["partial_rotary_factor"] = 1.0;  // transformers writes 1.0 into Phi-3's (and newer) configs
  CHECK(error(c) == "<no loom::Error>");
  c = tiny("qwen2");
  c.use_sliding_window = true;
  CHECK(error(c).find("field 'use_sliding_window' is true") != std::string::npos);
  c = tiny();
  c.pretraining_tp = 2;
  CHECK(error(c).find("field 'pretraining_tp' is 2") != std::string::npos);
  c = tiny();
  c.num_key_value_heads = 3;
  CHECK(error(c).find("must be a multiple of num_key_value_heads (3)") != std::string::npos);
  c = tiny("deepseek_v3");
  CHECK(error(c).find("field 'model_type' is \"deepseek_v3\"; loom's Llama architecture reads llama, qwen2, qwen3, "
                      "mistral, phi3, gemma, gemma2, gemma3_text, mixtral, qwen3_moe") != std::string::npos);
  c = tiny("gemma");
  c.use_bidirectional_attention = true;
  CHECK(error(c).find("field 'use_bidirectional_attention' is true; loom's Llama architecture attends causally") !=
        std::string::npos);
  c = tiny("qwen3");
  c.use_sliding_window = true;
  CHECK(error(c).find("field 'use_sliding_window' is true") != std::string::npos);
  c = tiny();
  c.num_hidden_layers = 1'000'000'000;
  CHECK(error(c).find("field 'num_hidden_layers' must be a positive integer at most 1024") != std::string::npos);
  for (const auto& e : {error(tiny("deepseek_v3")), error(c)}) CHECK(e.starts_with("loom: "));
  // A Mistral window shorter than the sequence (transformers' logits: the folders above). With
  // one layer and rotary positions (relative), the last token sees exactly the last 8 tokens:
  // its logits equal those of those 8 tokens alone, and differ from a window that does not bind.
  c = tiny("mistral");
  c.num_hidden_layers = 1, c.sliding_window = 8;
  torch::manual_seed(3);
  LlamaForCausalLM mistral(c);
  mistral->eval();
  const auto ids = torch::randint(100, {1, 12});
  torch::NoGradGuard no_grad;
  const auto windowed = mistral->logits(ids).select(1, 11);
  CHECK(torch::allclose(windowed, mistral->logits(ids.narrow(1, 4, 8)).select(1, 7), 1e-5, 1e-5));
  // Within the window the prefix is the same function (not bitwise: the products' shapes differ).
  CHECK(torch::allclose(mistral->logits(ids).narrow(1, 0, 8), mistral->logits(ids.narrow(1, 0, 8)), 1e-6, 1e-6));
  c.sliding_window = 12;
  torch::manual_seed(3);
  LlamaForCausalLM unbound(c);
  unbound->eval();
  CHECK_FALSE(torch::allclose(unbound->logits(ids).select(1, 11), windowed, 1e-3, 1e-3));
  // Older files: rope_theta and rope_scaling (with "type") become rope_parameters.
  const auto dir = loom_test::fresh_dir("models/llama_legacy");
  loom_test::write_bytes(dir / "config.json", R"({"model_type": "llama", "hidden_size": 48, "num_attention_heads": 4,
    "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 32}, "eos_token_id": [1, 2]})");
  auto legacy = loom::models::read_hf_config<LlamaConfig>(dir);
  loom::models::complete_config(legacy);
  loom::models::validate(legacy, "config.json");
  CHECK(legacy.rope_parameters["rope_type"] == "llama3");
  CHECK(legacy.rope_parameters["rope_theta"] == 500000.0);
  CHECK(legacy.eos_token_id == nlohmann::json::array({1, 2}));
  loom_test::write_bytes(dir / "config.json", R"({"model_type": "bert"})");
  CHECK(loom_test::error_of([&] { loom::models::read_hf_config<LlamaConfig>(dir); })
            .find("reads \"llama\", \"qwen2\", \"qwen3\", \"mistral\"") != std::string::npos);
}

TEST_CASE("the Llama architecture's fast kernels compute the reference's function (padded LM head)") {
  torch::manual_seed(2);
  LlamaForCausalLM model(tiny());
  model->eval();
  const auto ids = torch::randint(100, {2, 10});
  model->set_kernels(loom::models::Kernels::reference);
  const auto ref = model->forward({ids, ids});
  model->set_kernels(loom::models::Kernels::fast);
  const auto fast = model->forward({ids, ids});
  CHECK(fast.logits.size(-1) == 100);
  CHECK(relative(fast.logits, ref.logits) < 1e-5);
  CHECK(fast.loss.item<double>() == doctest::Approx(ref.loss.item<double>()).epsilon(1e-6));
}

// One training forward's gradients on `ids` (its own labels), then again with the decoder
// layers recomputed (`layers` of them): the same bit for bit.
inline void check_recomputed_gradients(LlamaForCausalLM& model, const torch::Tensor& ids, int64_t layers) {
  model->train();  // attention_dropout is 0: training forwards are deterministic
  const auto grads = [&] {
    model->zero_grad();
    model->forward({ids, ids}).loss.backward();
    std::vector<torch::Tensor> g;
    for (const auto& p : model->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto plain = grads();
  CHECK(loom::dist::enable_gradient_checkpointing(*model) == layers);
  const auto recomputed = grads();
  REQUIRE(plain.size() == recomputed.size());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(torch::equal(plain[i], recomputed[i]));
}

TEST_CASE("the Llama architecture recomputes its decoder layers (gradient checkpointing) to the same gradients; NEFTune") {
  torch::manual_seed(5);
  LlamaForCausalLM model(tiny());
  const auto ids = torch::randint(100, {2, 12});
  check_recomputed_gradients(model, ids, 2);
  // NEFTune's noise reaches the embeddings in training only.
  model->neftune().noise_alpha = 5.0;
  const auto noisy = model->logits(ids);
  model->eval();
  const auto clean = model->logits(ids);
  model->neftune().noise_alpha = 0.0;
  CHECK_FALSE(torch::equal(noisy, clean));
  CHECK(torch::equal(model->logits(ids), clean));
  // Gemma 2 (the written-out, soft-capped attention; a window that binds) and Gemma 3 (q/k norms,
  // a rope per layer type).
  for (const std::string type : {"gemma2", "gemma3_text"}) {
    CAPTURE(type);
    auto c = tiny(type);
    c.num_hidden_layers = 3, c.head_dim = 16, c.sliding_window = 5;
    c.attn_logit_softcapping = 1.0, c.final_logit_softcapping = 5.0, c.initializer_range = 0.2;
    torch::manual_seed(6);
    LlamaForCausalLM gemma(c);
    check_recomputed_gradients(gemma, ids, 3);
  }
}

TEST_CASE("Mixtral and Qwen3-MoE: HF's expert names, the load-balancing loss masked as transformers', its refusals") {
  const fs::path* dir = made();
  if (dir != nullptr) {
    const auto expected = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
    const auto ids = named(expected, "input_ids"), labels = named(expected, "labels");
    const auto mask = named(expected, "attention_mask");
    torch::NoGradGuard no_grad;
    for (const std::string name : {"mixtral", "qwen3_moe"}) {
      CAPTURE(name);
      auto model = LlamaForCausalLM::from_pretrained(*dir / name);
      model->eval();
      CHECK(model->config().output_router_logits);
      // Padding (row 2 from token 17) masked: the auxiliary loss counts the tokens only.
      const auto masked = model->forward({ids, labels, {}, mask}).loss.reshape({1});
      INFO("masked loss " << relative(masked, named(expected, name + "_masked_loss")));
      CHECK(relative(masked, named(expected, name + "_masked_loss")) <= 1e-6);
      CHECK(relative(masked, named(expected, name + "_loss")) > 1e-6);  // the mask counts
      // The load-balancing loss alone, from the router logits of the last forward.
      model->model->forward(ids);
      const auto routers = model->model->take_router_logits();
      CHECK(routers.size() == 2);  // qwen3_moe: 2 of its 3 layers (layer 1 is dense)
      CHECK(model->model->take_router_logits().empty());       // handed over once
      const auto aux = loom::models::load_balancing_loss(routers, 4, 2).reshape({1});
      INFO("aux loss " << relative(aux, named(expected, name + "_aux_loss")));
      CHECK(relative(aux, named(expected, name + "_aux_loss")) <= 1e-6);
    }
    const auto names = LlamaForCausalLM::from_pretrained(*dir / "qwen3_moe")->named_parameters();
    CHECK(names.contains("model.layers.0.mlp.experts.3.down_proj.weight"));
    CHECK(names.contains("model.layers.0.mlp.gate.weight"));
    CHECK(names.contains("model.layers.1.mlp.gate_proj.weight"));  // mlp_only_layers: dense
    CHECK(LlamaForCausalLM::from_pretrained(*dir / "mixtral")->named_parameters().contains(
        "model.layers.1.block_sparse_moe.experts.2.w3.weight"));
  }
  // The auxiliary loss's gradient reaches the routers, through recomputed layers as without.
  auto c = tiny("mixtral");
  c.num_local_experts = 4, c.initializer_range = 0.2;
  const auto ids = torch::randint(100, {2, 12});
  torch::manual_seed(7);
  LlamaForCausalLM plain(c);
  c.output_router_logits = true, c.router_aux_loss_coef = 0.5;
  torch::manual_seed(7);
  LlamaForCausalLM balanced(c);
  for (auto* model : {&plain, &balanced}) {
    (*model)->zero_grad();
    (*model)->forward({ids, ids}).loss.backward();
  }
  const auto router = [](LlamaForCausalLM& m) {
    return m->named_parameters()["model.layers.0.block_sparse_moe.gate.weight"].grad().clone();
  };
  CHECK_FALSE(torch::equal(router(plain), router(balanced)));
  check_recomputed_gradients(balanced, ids, 2);
  auto q = tiny("qwen3_moe");
  q.num_hidden_layers = 3, q.num_local_experts = 4, q.num_experts_per_tok = 2, q.moe_intermediate_size = 32;
  q.head_dim = 16;
  q.mlp_only_layers = nlohmann::json::array({1}), q.output_router_logits = true, q.norm_topk_prob = true;
  q.initializer_range = 0.2;
  torch::manual_seed(8);
  LlamaForCausalLM qwen(q);
  check_recomputed_gradients(qwen, ids, 3);
  // The older key num_experts is num_local_experts (transformers' attribute_map).
  auto older = tiny("qwen3_moe");
  older.num_experts = 6;
  loom::models::complete_config(older);
  CHECK(older.num_local_experts == 6);
  CHECK_FALSE(older.num_experts.has_value());
  CHECK(older.moe_intermediate_size == 768);  // Qwen3MoeConfig's defaults
  CHECK(older.num_experts_per_tok == 8);
  // Refused with the field named.
  const auto error = [](LlamaConfig bad) {
    loom::models::complete_config(bad);
    return loom_test::error_of([&] { loom::models::validate(bad, "config.json"); });
  };
  auto k = tiny("mixtral");
  k.num_experts_per_tok = 9;
  CHECK(error(k).find("field 'num_experts_per_tok' must be in [1, num_local_experts (8)], got 9") != std::string::npos);
  auto j = tiny("mixtral");
  j.router_jitter_noise = 1.5;
  CHECK(error(j).find("field 'router_jitter_noise' must be in [0, 1)") != std::string::npos);
  auto l = tiny("qwen3_moe");
  l.mlp_only_layers = nlohmann::json::array({5});
  CHECK(error(l).find("field 'mlp_only_layers' holds 5; each entry must be a layer index in [0, 2)") != std::string::npos);
  auto z = tiny("qwen3_moe");
  z.decoder_sparse_step = 0;
  CHECK(error(z).find("field 'decoder_sparse_step' must be a positive integer") != std::string::npos);
  auto m = tiny("mixtral");
  m.num_local_experts = 0;
  CHECK(error(m).find("field 'num_local_experts' must be a positive integer, got 0") != std::string::npos);
}

TEST_CASE("LoRA as PEFT: loom reads PEFT's adapter, PEFT reads loom's, merge_and_unload opens in transformers") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const char* py = loom_test::python("");
  const auto expected = made_adapters(*dir);
  const auto ids = named(expected, "input_ids");
  torch::NoGradGuard no_grad;
  // PEFT's adapter on loom's model: PEFT's logits.
  auto model = LlamaForCausalLM::from_pretrained(*dir / "llama");
  model->eval();
  const auto config = loom::peft::load_adapter(*model, *dir / "peft_adapter");
  CHECK(config.r == 4);
  CHECK(config.target_modules.size() == 3);
  const double peft_diff = relative(model->logits(ids), named(expected, "lora_logits"));
  CHECK(peft_diff <= 1e-5);
  int64_t trainable = 0;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) trainable += p.numel();
  // 2 layers x (q: 4x48 + 24x4... ) : A [4, in] and B [out, 4] for q_proj (48->48), v_proj (48->24), down_proj (96->48).
  CHECK(trainable == 2 * (4 * 48 + 48 * 4 + 4 * 48 + 24 * 4 + 4 * 96 + 48 * 4));
  // loom's adapter (B perturbed, so it counts) read by PEFT.
  auto mine = LlamaForCausalLM::from_pretrained(*dir / "llama");
  mine->eval();
  loom::peft::LoraConfig lora;
  lora.r = 8, lora.lora_alpha = 16, lora.target_modules = {"k_proj", "o_proj", "up_proj"};
  CHECK(loom::peft::apply_lora(*mine, lora) == 6);
  torch::manual_seed(9);
  for (auto& p : mine->named_parameters())
    if (p.key().find("lora_B") != std::string::npos) p.value().normal_(0.0, 0.05);
  const auto out = loom_test::fresh_dir("models/lora");
  loom::peft::save_adapter(*mine, out / "adapter");
  const auto mine_logits = mine->logits(ids);
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"loom_logits", mine_logits.contiguous()}},
                                     out / "loom_expected.safetensors");
  const auto checked = peft_check(*dir / "llama", out / "adapter", out / "loom_expected.safetensors");
  INFO(checked);
  CHECK(checked.find("exit=0") != std::string::npos);
  // Merged: a plain folder transformers opens, with the adapted logits.
  loom::peft::merge_and_unload(*mine);
  for (const auto& p : mine->named_parameters()) CHECK(p.key().find("lora_") == std::string::npos);
  const auto merged_logits = mine->logits(ids);
  CHECK(relative(merged_logits, mine_logits) < 1e-5);
  mine->save_pretrained(out / "merged");
  const auto labels = named(loom::checkpoint::load_safetensors(*dir / "expected.safetensors"), "labels");
  const auto merged_out = mine->forward({ids, labels});
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"labels", labels}, {"merged_logits", merged_logits.contiguous()},
                                      {"merged_loss", merged_out.loss.reshape({1})}},
                                     out / "merged_expected.safetensors");
  const auto opened = loom_test::run_capture(std::string(py) + " " + script() + " check merged," + (out / "merged").string() +
                                             "," + (out / "merged_expected.safetensors").string() + " 2>&1; echo \"exit=$?\"");
  INFO(opened);
  CHECK(opened.find("exit=0") != std::string::npos);
  const auto line = checked.find("peft on loom's adapter");
  MESSAGE("loom on PEFT's adapter: logits " << peft_diff << " relative; "
                                            << (line == std::string::npos ? checked : checked.substr(line, checked.find('\n', line) - line)));
}

TEST_CASE("LoRA on GPT-2's Conv1D as PEFT (fan_in_fan_out): PEFT's adapter in loom, loom's in PEFT, merged") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const auto expected = made_adapters(*dir);
  const auto ids = named(expected, "input_ids");
  torch::NoGradGuard no_grad;
  auto model = loom::models::GPT2LMHeadModel::from_pretrained(*dir / "gpt2");
  model->eval();
  const auto before = model->logits(ids);
  CHECK(loom::peft::load_adapter(*model, *dir / "gpt2_peft_adapter").target_modules.size() == 2);
  CHECK(relative(model->logits(ids), named(expected, "gpt2_lora_logits")) <= 1e-5);
  CHECK(model->named_parameters()["transformer.h.0.attn.c_attn.lora_A.weight"].sizes() == torch::IntArrayRef({4, 32}));
  CHECK(model->named_parameters()["transformer.h.0.attn.c_attn.lora_B.weight"].sizes() == torch::IntArrayRef({96, 4}));
  const auto adapted = model->logits(ids);
  CHECK_FALSE(torch::equal(adapted, before));
  // loom's adapter (PEFT's weights, saved again) read by PEFT; merged into the Conv1D weights.
  const auto out = loom_test::fresh_dir("models/lora_gpt2");
  loom::peft::LoraConfig lora;
  lora.r = 4, lora.lora_alpha = 8, lora.target_modules = {"c_attn", "c_proj"};
  loom::peft::save_adapter(*model, out / "adapter");
  CHECK(loom::json::read_file(out / "adapter" / "adapter_config.json")["fan_in_fan_out"] == true);
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"loom_logits", adapted.contiguous()}}, out / "loom.safetensors");
  const auto checked = peft_check(*dir / "gpt2", out / "adapter", out / "loom.safetensors");
  INFO(checked);
  CHECK(checked.find("exit=0") != std::string::npos);
  loom::peft::merge_and_unload(*model);
  CHECK(relative(model->logits(ids), adapted) < 1e-5);
}

TEST_CASE("LoRA on BERT as PEFT's SEQ_CLS: the classifier saved whole; PEFT's adapter in loom, loom's in PEFT, merged") {
  const fs::path* dir = made();
  if (dir == nullptr) return;
  const char* py = loom_test::python("");
  const auto expected = made_adapters(*dir);
  const auto ids = named(expected, "bert_input_ids"), mask = named(expected, "bert_attention_mask");
  using loom::models::BertForSequenceClassification;
  torch::NoGradGuard no_grad;
  // PEFT's adapter (query and value, its classifier perturbed) on loom's BERT: PEFT's logits.
  auto model = BertForSequenceClassification::from_pretrained(*dir / "bert");
  model->eval();
  const auto before = model->logits(ids, mask);
  const auto config = loom::peft::load_adapter(*model, *dir / "bert_peft_adapter");
  CHECK(config.task_type == "SEQ_CLS");
  CHECK(config.modules_to_save == std::vector<std::string>{"classifier", "score"});  // as PEFT wrote it
  CHECK(loom::peft::adapter_config(*model)->modules_to_save == std::vector<std::string>{"classifier"});  // what is here
  const auto adapted = model->logits(ids, mask);
  const double peft_diff = relative(adapted, named(expected, "bert_lora_logits"));
  CHECK(peft_diff <= 1e-5);
  CHECK_FALSE(torch::equal(adapted, before));
  int64_t trainable = 0;
  for (const auto& p : model->parameters())
    if (p.requires_grad()) trainable += p.numel();
  CHECK(trainable == 2 * 2 * (4 * 32 + 32 * 4) + 3 * 32 + 3);  // query and value of 2 layers, the classifier

  // loom's adapter: all-linear with SEQ_CLS passes over the classifier (trained whole instead).
  auto mine = BertForSequenceClassification::from_pretrained(*dir / "bert");
  mine->eval();
  loom::peft::LoraConfig lora;
  lora.r = 8, lora.lora_alpha = 16, lora.target_modules = {"all-linear"}, lora.task_type = "SEQ_CLS";
  CHECK(loom::peft::apply_lora(*mine, lora) == 2 * 6 + 1);  // q, k, v, 3 dense a layer; the pooler's
  CHECK(mine->classifier->weight.requires_grad());
  CHECK_FALSE(mine->bert->pooler->named_parameters()["dense.weight"].requires_grad());
  torch::manual_seed(9);
  for (auto& p : mine->named_parameters())
    if (p.key().find("lora_B") != std::string::npos || p.key().starts_with("classifier."))
      p.value().add_(torch::randn_like(p.value()) * 0.05);
  const auto out = loom_test::fresh_dir("models/lora_bert");
  loom::peft::save_adapter(*mine, out / "adapter");
  const auto written = loom::json::read_file(out / "adapter" / "adapter_config.json");
  CHECK(written["modules_to_save"] == nlohmann::json::array({"classifier"}));
  CHECK(written["task_type"] == "SEQ_CLS");
  CHECK(written["target_modules"].size() == 13);
  const auto weights = loom::checkpoint::load_safetensors(out / "adapter" / "adapter_model.safetensors");
  CHECK(torch::equal(named(weights, "base_model.model.classifier.weight"), mine->classifier->weight));
  CHECK(torch::equal(named(weights, "base_model.model.classifier.bias"), mine->classifier->bias));
  const auto mine_logits = mine->logits(ids, mask);
  loom::checkpoint::save_safetensors({{"input_ids", ids}, {"attention_mask", mask}, {"loom_logits", mine_logits}},
                                     out / "loom.safetensors");
  const auto checked = peft_check(*dir / "bert", out / "adapter", out / "loom.safetensors");
  INFO(checked);
  CHECK(checked.find("exit=0") != std::string::npos);
  // Merged: a plain BERT folder transformers opens, with the adapted logits and loss.
  loom::peft::merge_and_unload(*mine);
  for (const auto& p : mine->named_parameters()) CHECK(p.key().find("lora_") == std::string::npos);
  const auto labels = named(expected, "bert_labels");
  const auto merged = mine->forward({ids, mask, labels});
  CHECK(relative(merged.logits, mine_logits) < 1e-5);
  mine->save_pretrained(out / "merged");
  loom::checkpoint::save_safetensors({{"merged_input_ids", ids}, {"merged_attention_mask", mask},
                                      {"merged_labels", labels}, {"merged_logits", merged.logits},
                                      {"merged_loss", merged.loss.reshape({1})}},
                                     out / "merged.safetensors");
  const auto opened = loom_test::run_capture(
      std::string(py) + " " + (loom_test::source_dir() / "tests/models/hf_models.py").string() + " check bert," +
      (out / "merged").string() + "," + (out / "merged.safetensors").string() + ",merged 2>&1; echo \"exit=$?\"");
  INFO(opened);
  CHECK(opened.find("exit=0") != std::string::npos);
  // A SEQ_CLS target that is only the head it saves whole; without SEQ_CLS the head can carry one.
  auto head = BertForSequenceClassification::from_pretrained(*dir / "bert");
  loom::peft::LoraConfig on_head;
  on_head.target_modules = {"classifier"}, on_head.task_type = "SEQ_CLS";
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*head, on_head); }) ==
        "loom: LoRA target_modules match only classifier, which modules_to_save trains whole (task_type SEQ_CLS "
        "saves the classification head)");
  on_head.task_type = "CAUSAL_LM";
  CHECK(loom::peft::apply_lora(*head, on_head) == 1);
  CHECK_FALSE(loom::peft::adapter_config(*head)->modules_to_save.size());
  const auto line = checked.find("peft on loom's adapter");
  MESSAGE("BERT: loom on PEFT's adapter: logits " << peft_diff << " relative; "
                                                  << (line == std::string::npos ? checked : checked.substr(line, checked.find('\n', line) - line)));
}

TEST_CASE("LoRA's bad input: a target that matches nothing, r <= 0, an adapter for another base") {
  torch::manual_seed(0);
  LlamaForCausalLM model(tiny());
  loom::peft::LoraConfig lora;
  lora.target_modules = {"c_attn"};
  const auto none = loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); });
  CHECK(none.starts_with("loom: "));
  CHECK(none.find("match no module of the model; its linear projections are named down_proj, gate_proj, k_proj") !=
        std::string::npos);
  lora.target_modules = {"embed_tokens"};
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); }).find("LoRA target model.embed_tokens is a") !=
        std::string::npos);
  // A regex in Python's dialect (PEFT's re.fullmatch), and one whose nested repetitions would
  // backtrack for hours: refused after a bounded number of steps.
  lora.target_modules = {};
  lora.target_regex = R"(model\.layers\.\d+\.self_attn\.(?:q|v)_proj)";
  {
    LlamaForCausalLM fresh(tiny());
    CHECK(loom::peft::apply_lora(*fresh, lora) == 2 * tiny().num_hidden_layers);
  }
  lora.target_regex = "(.*.*)*\\d";
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); }) ==
        "loom: LoraConfig: target_modules regex \"(.*.*)*\\d\" gave up on module name 'model.layers.0.self_attn.q_proj' "
        "after 1000000 backtracking steps (nested repetitions such as (.*)* try every split of the name); write it "
        "without nested quantifiers");
  lora.target_regex = "(q_proj";
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); }) ==
        "loom: LoraConfig: target_modules regex \"(q_proj\" is not a valid regular expression (at offset 7: missing "
        "closing parenthesis)");
  lora.target_regex.reset();
  // A rank whose adapter cannot fit the host: refused before anything is allocated.
  lora.target_modules = {"q_proj"};
  lora.r = int64_t{1} << 40;
  const auto huge = loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); });
  CHECK(huge.starts_with("loom: LoRA rank r 1099511627776 gives the adapter "));
  CHECK(huge.find("GB of host memory each of this machine's") != std::string::npos);
  CHECK(loom::peft::adapter_config(*model) == std::nullopt);
  lora.r = 0;
  CHECK(loom_test::error_of([&] { loom::peft::apply_lora(*model, lora); }).find("LoRA's r must be a positive integer, got 0") !=
        std::string::npos);
  lora.r = 4;
  loom::peft::apply_lora(*model, lora);
  const auto dir = loom_test::fresh_dir("models/lora_other_base");
  loom::peft::save_adapter(*model, dir);
  auto wider = tiny();
  wider.hidden_size = 64;
  LlamaForCausalLM other(wider);
  const auto mismatch = loom_test::error_of([&] { loom::peft::load_adapter(*other, dir); });
  CHECK(mismatch.find("(an adapter made for another base model)") != std::string::npos);
  CHECK(mismatch.starts_with("loom: "));
  // Adapter weights stored as integers: refused by name, not read as whole numbers.
  std::vector<std::pair<std::string, torch::Tensor>> as_ints;
  for (auto& [name, t] : loom::peft::adapter_tensors(*model)) as_ints.emplace_back(name, t.detach().to(torch::kInt));
  loom::checkpoint::save_safetensors(as_ints, dir / "adapter_model.safetensors", {{"format", "pt"}});
  LlamaForCausalLM same(tiny());
  const auto ints = loom_test::error_of([&] { loom::peft::load_adapter(*same, dir); });
  CHECK(ints.starts_with("loom: "));
  CHECK(ints.find("is Int in the file but Float here (adapter weights are floating-point") != std::string::npos);
}

}  // namespace llama_test
