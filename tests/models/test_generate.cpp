// Generation (loom/models/generation.hpp) against transformers: tiny random GPT-2 and Llama
// (grouped-query attention) folders that transformers makes and generates from
// (tests/models/hf_generate.py), read by loom, whose greedy tokens must be transformers' token
// for token, with and without the key/value cache, on one prompt and on a left-padded batch of
// different lengths, with eos ids that end rows early. Sampling: reproducible under a seed,
// top_k 1 is greedy, the warpers equal transformers'. The refusals and the warning.

#include <loom/checkpoint/safetensors.hpp>
#include <loom/core/error.hpp>
#include <loom/models/generation.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"
#include "peer_support.hpp"

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

namespace generate_test {

namespace fs = std::filesystem;
using loom::models::GenerationConfig;

// The folders and expected.safetensors hf_generate.py makes, made once per run (nullptr: no Python).
inline const fs::path* made() {
  return loom_test::peer_made("hf_generate.py", "hf_generate", "made generate",
                              "the comparison with transformers' generate");
}

using loom_test::named;

// Greedy generation of max_new_tokens 12 (hf_generate.py's NEW_TOKENS) with pad 0, with and
// without the cache; both must give the same tokens, which are returned.
template <class Model>
torch::Tensor greedy(Model& model, const torch::Tensor& ids, const torch::Tensor& mask,
                     std::optional<std::vector<int64_t>> eos = std::nullopt) {
  GenerationConfig config{.max_new_tokens = 12, .eos_token_id = std::move(eos), .pad_token_id = 0};
  const auto cached = loom::models::generate(model, ids, mask, config);
  config.use_cache = false;
  const auto uncached = loom::models::generate(model, ids, mask, config);
  CHECK(torch::equal(cached, uncached));
  return cached;
}

template <class Model>
void check_against_transformers(const std::string& name) {
  const auto* dir = made();
  if (dir == nullptr) return;
  const auto t = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  auto model = Model::from_pretrained(*dir / name);
  const auto single = named(t, name + "_single_ids");
  const auto ids = named(t, name + "_batch_ids");
  const auto mask = named(t, name + "_batch_mask");
  INFO(name);
  CHECK(torch::equal(greedy(model, single, torch::ones_like(single)), named(t, name + "_single_out")));
  // The prompt alone (no mask): the same tokens.
  CHECK(torch::equal(greedy(model, single, {}), named(t, name + "_single_out")));
  const auto batch = greedy(model, ids, mask);
  INFO(batch);
  CHECK(torch::equal(batch, named(t, name + "_batch_out")));
  const auto eos_tensor = named(t, name + "_eos");
  const std::vector<int64_t> eos(eos_tensor.data_ptr<int64_t>(), eos_tensor.data_ptr<int64_t>() + eos_tensor.numel());
  const auto ended = greedy(model, ids, mask, eos);
  INFO(ended);
  CHECK(torch::equal(ended, named(t, name + "_eos_out")));
  // The eos ids stopped some row early (it emits pad 0 after), so the check above covers them.
  CHECK(ended.eq(0).sum().template item<int64_t>() > mask.eq(0).sum().template item<int64_t>());
}

TEST_CASE("generate: greedy tokens equal transformers' generate, GPT-2, Llama (GQA), Qwen3, Mistral, Phi-3, Gemma 1, 2 and 3 past their windows, Mixtral, Qwen3-MoE") {
  check_against_transformers<loom::models::GPT2LMHeadModel>("gpt2");
  check_against_transformers<loom::models::LlamaForCausalLM>("llama");
  check_against_transformers<loom::models::LlamaForCausalLM>("qwen3");
  check_against_transformers<loom::models::LlamaForCausalLM>("mistral");  // sliding_window 5 < 7 + 12 tokens
  check_against_transformers<loom::models::LlamaForCausalLM>("phi3");     // fused projections, sliding_window 6
  check_against_transformers<loom::models::LlamaForCausalLM>("gemma");    // (1 + w) norms, scaled embeddings
  check_against_transformers<loom::models::LlamaForCausalLM>("gemma2");   // soft-caps, window 5 on alternate layers
  check_against_transformers<loom::models::LlamaForCausalLM>("gemma3_text");  // a rope per layer type, q/k norms
  check_against_transformers<loom::models::LlamaForCausalLM>("mixtral");      // sparse MoE layers, window 5
  check_against_transformers<loom::models::LlamaForCausalLM>("qwen3_moe");    // sparse and dense layers
}

TEST_CASE("generate: the sampling warpers equal transformers' (temperature, then top-k, then top-p)") {
  const auto* dir = made();
  if (dir == nullptr) return;
  const auto t = loom::checkpoint::load_safetensors(*dir / "expected.safetensors");
  const GenerationConfig config{.do_sample = true, .temperature = 0.7, .top_k = 10, .top_p = 0.8};
  const auto warped = loom::models::warp_scores(named(t, "warp_scores"), config);
  const auto expected = named(t, "warped");
  CHECK(torch::equal(warped.isinf(), expected.isinf()));
  const auto kept = expected.isfinite();
  CHECK(torch::allclose(warped.masked_select(kept), expected.masked_select(kept)));
  CHECK(kept.sum().item<int64_t>() < 30);  // the warpers removed most of the 3 x 100 scores
}

inline loom::models::GPT2LMHeadModel tiny_gpt2() {
  torch::manual_seed(0);
  loom::models::GPT2Config c;
  c.vocab_size = 61, c.n_positions = 24, c.n_embd = 32, c.n_layer = 2, c.n_head = 4, c.initializer_range = 0.2;
  c.eos_token_id = std::nullopt, c.bos_token_id = std::nullopt;
  return loom::models::GPT2LMHeadModel(c);
}

inline loom::models::LlamaForCausalLM tiny_llama() {
  torch::manual_seed(0);
  loom::models::LlamaConfig c;
  c.vocab_size = 61, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.max_position_embeddings = 16;
  c.initializer_range = 0.2, c.eos_token_id = nullptr, c.bos_token_id = std::nullopt;
  return loom::models::LlamaForCausalLM(c);
}

TEST_CASE("generate: sampling is reproducible under a seed, and top_k 1 is greedy") {
  auto model = tiny_gpt2();
  const auto ids = torch::randint(1, 61, {3, 5}, torch::kLong);
  const GenerationConfig sampled{.max_new_tokens = 16, .do_sample = true, .top_k = 0, .seed = 11};
  const auto a = loom::models::generate(model, ids, {}, sampled);
  CHECK(a.sizes() == torch::IntArrayRef{3, 21});
  CHECK(torch::equal(a, loom::models::generate(model, ids, {}, sampled)));
  auto other = sampled;
  other.seed = 12;
  CHECK_FALSE(torch::equal(a, loom::models::generate(model, ids, {}, other)));
  // With the cache or without, the same draws from the same seed.
  auto uncached = sampled;
  uncached.use_cache = false;
  CHECK(torch::equal(a, loom::models::generate(model, ids, {}, uncached)));
  // top_k 1 leaves one token to draw: greedy's (temperature and top_p change nothing then).
  const auto greedy = loom::models::generate(model, ids, {}, {.max_new_tokens = 16});
  CHECK(torch::equal(greedy, loom::models::generate(model, ids, {}, {.max_new_tokens = 16, .do_sample = true,
                                                                      .temperature = 0.5, .top_k = 1, .top_p = 0.9,
                                                                      .seed = 5})));
  CHECK_FALSE(torch::equal(greedy, a));
  // Without a seed: torch's default generator, seeded by torch::manual_seed.
  torch::manual_seed(3);
  const auto b = loom::models::generate(model, ids, {}, {.max_new_tokens = 16, .do_sample = true});
  torch::manual_seed(3);
  CHECK(torch::equal(b, loom::models::generate(model, ids, {}, {.max_new_tokens = 16, .do_sample = true})));
}

TEST_CASE("generate: the step forward is the training forward's last position, and the mode is restored") {
  auto gpt2 = tiny_gpt2();
  auto llama = tiny_llama();
  const auto ids = torch::randint(1, 61, {2, 9}, torch::kLong);
  const auto positions = torch::arange(9, torch::kLong).unsqueeze(0).expand({2, 9});
  gpt2->eval();
  llama->eval();
  torch::NoGradGuard no_grad;
  CHECK(torch::allclose(gpt2->next_token_logits({ids, positions}), gpt2->logits(ids).select(1, 8), 1e-6, 1e-6));
  CHECK(torch::allclose(llama->next_token_logits({ids, positions}), llama->logits(ids).select(1, 8), 1e-6, 1e-6));
  gpt2->train();
  loom::models::generate(gpt2, ids, {}, {.max_new_tokens = 2});
  CHECK(gpt2->is_training());
  // max_length (HF's default 20) counts the prompt: 11 new tokens after 9.
  CHECK(loom::models::generate(gpt2, ids).size(1) == 20);
}

// What `f` prints to stderr.
template <class F>
std::string stderr_of(F&& f) {
  const auto path = loom_test::fresh_dir("models/generate_stderr") / "stderr.txt";
  std::fflush(stderr);
  const int saved = dup(fileno(stderr));
  FILE* file = std::fopen(path.c_str(), "w");
  dup2(fileno(file), fileno(stderr));
  f();
  std::fflush(stderr);
  dup2(saved, fileno(stderr));
  close(saved);
  std::fclose(file);
  return loom_test::read_bytes(path);
}

TEST_CASE("generate: refusals, and generation past the position table") {
  auto gpt2 = tiny_gpt2();
  const auto ids = torch::randint(1, 61, {2, 10}, torch::kLong);
  const auto error = [&](const GenerationConfig& c, const torch::Tensor& input = {}, const torch::Tensor& mask = {}) {
    return loom_test::error_of([&] { loom::models::generate(gpt2, input.defined() ? input : ids, mask, c); });
  };
  CHECK(error({.max_new_tokens = 4, .num_beams = 2}) ==
        "loom: generate: num_beams is 2; loom implements greedy decoding and sampling only (num_beams 1), not beam "
        "search");
  CHECK(error({.max_new_tokens = 0}) == "loom: generate: max_new_tokens must be positive, got 0");
  CHECK(error({.max_new_tokens = 4, .do_sample = true, .temperature = 0.0}) ==
        "loom: generate: temperature must be positive when do_sample is true, got 0");
  // A temperature so small that the scaled logits overflow: named, not multinomial's error.
  CHECK(error({.max_new_tokens = 4, .do_sample = true, .temperature = 1e-45}) ==
        "loom: generate: temperature 1e-45 overflows float32: the logits divided by it are infinite, so the sampling "
        "probabilities are undefined (transformers stops here too); use a larger temperature, or do_sample false for "
        "the argmax it tends to");
  CHECK(error({.max_new_tokens = 4, .do_sample = true, .top_p = 1.5}) ==
        "loom: generate: top_p must be in [0, 1], got 1.5");
  CHECK(error({.max_new_tokens = 4, .do_sample = true, .top_k = -1}) ==
        "loom: generate: top_k must be 0 (off) or positive, got -1");
  CHECK(error({.max_length = 8}) == "loom: generate: the prompt has 10 tokens and max_length is 8, which leaves none "
                                    "to generate; set max_new_tokens");
  CHECK(error({.max_new_tokens = 2}, ids.to(torch::kInt)) ==
        "loom: generate: input_ids must be int64 of shape [batch, seq] with batch and seq at least 1, got Int [2, 10]");
  CHECK(error({.max_new_tokens = 2}, {}, torch::ones({2, 9}, torch::kLong)) ==
        "loom: generate: attention_mask of shape [2, 9] does not match input_ids of shape [2, 10]");
  CHECK(error({.max_new_tokens = 2}, {}, torch::zeros({2, 10}, torch::kLong)) ==
        "loom: generate: a row of attention_mask has no token (all 0)");
  // GPT-2: 10 prompt tokens + 15 new need 24 positions (the last token is not fed back): fits
  // n_positions 24; 16 new do not.
  CHECK(loom::models::generate(gpt2, ids, {}, {.max_new_tokens = 15}).size(1) == 25);
  CHECK(error({.max_new_tokens = 16}) ==
        "loom: generate: the longest prompt plus max_new_tokens needs 25 positions, past GPT-2's n_positions (24): "
        "its learned position table has no row beyond; shorten the prompt or max_new_tokens");
  // Left padding counts from the first real token: a row of 4 real tokens leaves room for 20 new.
  auto mask = torch::ones({2, 10}, torch::kLong);
  mask.narrow(1, 0, 6).zero_();
  CHECK(loom::models::generate(gpt2, ids, mask, {.max_new_tokens = 20}).size(1) == 30);
  // Llama: the rope goes on past max_position_embeddings (16), as in transformers, with a warning.
  auto llama = tiny_llama();
  const auto printed = stderr_of([&] { loom::models::generate(llama, ids, {}, {.max_new_tokens = 8}); });
  CHECK(printed ==
        "loom: warning: generate: the longest prompt plus max_new_tokens needs 17 positions, past the config's "
        "max_position_embeddings (16); the rotary embeddings extrapolate (as in transformers), where the model was "
        "not trained\n");
  CHECK(stderr_of([&] { loom::models::generate(llama, ids, {}, {.max_new_tokens = 7}); }).empty());
  // Far past every position table (max_new_tokens with extra digits): refused before the first step.
  CHECK(loom_test::error_of([&] { loom::models::generate(llama, ids, {}, {.max_new_tokens = 100'000'000}); }) ==
        "loom: generate: the longest prompt plus max_new_tokens needs 100000009 positions, past 1048576, the most loom "
        "generates to (the largest position table it reads); lower max_new_tokens");
}

}  // namespace generate_test
