// benchmarks/generate: greedy generation's tokens per second with and without the key/value
// cache (loom/models/generation.hpp), on small random GPT-2 and Llama models on the CPU.
//
//   build/benchmarks/generate                      # batch 4, prompt 32, 128 new tokens, 1 thread
//   build/benchmarks/generate --new_tokens 32 --rounds 1
//
// Each model generates from the same random prompts with use_cache true and false (no eos, so
// every row makes new_tokens tokens); the figure is batch x new_tokens over the median wall
// time of `rounds` calls, and the two modes must give the same tokens.

#include <loom/config/cli.hpp>
#include <loom/core/error.hpp>
#include <loom/models/generation.hpp>
#include <loom/models/gpt2.hpp>
#include <loom/models/llama.hpp>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

namespace {

struct BenchArguments {
  int64_t batch = 4;          ///< prompts generated together
  int64_t prompt = 32;        ///< tokens per prompt
  int64_t new_tokens = 128;   ///< tokens generated per prompt
  int64_t layers = 4;         ///< blocks of each model
  int64_t hidden = 256;       ///< hidden size (GPT-2's n_embd, Llama's hidden_size)
  int64_t vocab = 4096;       ///< vocabulary
  int64_t rounds = 3;         ///< timed calls per model and mode (the median is reported)
  int64_t threads = 1;        ///< torch intra-op threads
};

// Median seconds of `rounds` calls of generate, and the tokens of the last.
template <class Model>
std::pair<double, torch::Tensor> time_generate(Model& model, const torch::Tensor& ids,
                                               const loom::models::GenerationConfig& config, int64_t rounds) {
  std::vector<double> seconds;
  torch::Tensor out;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto begin = std::chrono::steady_clock::now();
    out = loom::models::generate(model, ids, {}, config);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], out};
}

template <class Model>
void run(const std::string& name, Model& model, const BenchArguments& b) {
  const auto ids = torch::randint(0, b.vocab, {b.batch, b.prompt}, torch::kLong);
  loom::models::GenerationConfig config{.max_new_tokens = b.new_tokens, .eos_token_id = std::vector<int64_t>{}};
  const double tokens = static_cast<double>(b.batch * b.new_tokens);
  const auto [cached_s, cached] = time_generate(model, ids, config, b.rounds);
  config.use_cache = false;
  const auto [uncached_s, uncached] = time_generate(model, ids, config, b.rounds);
  fmt::print("{:<8} {:>14.1f} {:>14.1f} {:>9.1f}x  {}\n", name, tokens / cached_s, tokens / uncached_s,
             uncached_s / cached_s, torch::equal(cached, uncached) ? "same tokens" : "TOKENS DIFFER");
}

}  // namespace

int main(int argc, char** argv) try {
  const auto b = loom::parse_args<BenchArguments>(argc, argv);
  at::set_num_threads(static_cast<int>(b.threads));
  torch::manual_seed(0);
  loom::models::GPT2Config g;
  g.vocab_size = b.vocab, g.n_positions = b.prompt + b.new_tokens, g.n_embd = b.hidden, g.n_layer = b.layers;
  g.n_head = b.hidden / 64;
  loom::models::GPT2LMHeadModel gpt2(g);
  loom::models::LlamaConfig l;
  l.vocab_size = b.vocab, l.hidden_size = b.hidden, l.intermediate_size = b.hidden * 8 / 3;
  l.num_hidden_layers = b.layers, l.num_attention_heads = b.hidden / 64, l.num_key_value_heads = b.hidden / 128;
  l.max_position_embeddings = b.prompt + b.new_tokens;
  loom::models::LlamaForCausalLM llama(l);
  fmt::print("greedy generation: batch {}, prompt {}, {} new tokens; {} layers, hidden {}, vocab {}; {} thread(s), "
             "median of {}\n",
             b.batch, b.prompt, b.new_tokens, b.layers, b.hidden, b.vocab, b.threads, b.rounds);
  fmt::print("{:<8} {:>14} {:>14} {:>10}\n", "model", "cache tok/s", "no cache tok/s", "speed-up");
  run("gpt2", gpt2, b);
  run("llama", llama, b);
  return 0;
} catch (const loom::Error& e) {
  fmt::print(stderr, "{}\n", e.what());
  return 2;
}
