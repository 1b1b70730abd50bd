// Text in, text out for the causal-LM examples (gpt2, llama_sft): --prompt "..." is encoded
// with the data folder's tokenizer.json (loom::data::Tokenizer), continued by
// loom::models::generate (greedy by default; --do_sample with --temperature / --top_k /
// --top_p), and the new tokens are decoded and printed, as transformers' pipeline("text-generation")
// prints a completion.
#pragma once

#include <loom/config/field_help.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/data/tokenizer.hpp>
#include <loom/models/generation.hpp>

#include "hf_example.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace hf_example {

/// Generation flags of the causal-LM examples (HF's GenerationConfig names).
struct GenerateArguments {
  std::string prompt;          ///< text to continue once training and evaluation are done ("": none)
  int64_t max_new_tokens = 48; ///< tokens to generate after the prompt
  bool do_sample = false;      ///< sample (true) or take the most likely token (greedy)
  double temperature = 1.0;    ///< sampling: the logits divided by it
  int64_t top_k = 50;          ///< sampling: keep the k most likely tokens (0: all)
  double top_p = 1.0;          ///< sampling: keep the fewest tokens whose mass reaches top_p

  static constexpr loom::FieldHelp field_help[] = {
      {"prompt", "text to continue after training and evaluation, printed with its completion; given alone "
                 "(no --do_train / --do_eval), the run only generates"},
      {"max_new_tokens", "tokens to generate after --prompt (the completion stops earlier at the end-of-text id)"},
      {"do_sample", "sample the completion (seeded by --seed) instead of taking the most likely token"},
      {"temperature", "sampling: the logits are divided by it"},
      {"top_k", "sampling: keep the k most likely tokens (0: all)"},
      {"top_p", "sampling: keep the fewest most likely tokens whose probability reaches top_p"},
  };
  static constexpr std::string_view help_heading = "generation";

  /// True when the run was given a prompt.
  [[nodiscard]] bool wanted() const { return !prompt.empty(); }

  /// The GenerationConfig these flags describe; bad values are refused by generate's own checks.
  [[nodiscard]] loom::models::GenerationConfig config(uint64_t seed) const {
    loom::models::GenerationConfig c;
    c.max_new_tokens = max_new_tokens;
    c.do_sample = do_sample;
    c.temperature = temperature;
    c.top_k = top_k;
    c.top_p = top_p;
    if (do_sample) c.seed = seed;
    return c;
  }
};

/// Up-front checks, before any data or model is read; true when the run only generates (a
/// prompt without --do_train / --do_eval / --do_predict), to be handed to apply_script_rules.
inline bool generate_only(const GenerateArguments& g, const loom::TrainingArguments& args) {
  loom::check(g.max_new_tokens > 0, "--max_new_tokens must be positive, got {}", g.max_new_tokens);
  // The sampling flags as generate() will check them, now rather than after training.
  if (g.wanted()) loom::models::check_generation_config(g.config(static_cast<uint64_t>(args.seed)));
  return runs_alone(g.wanted(), args);
}

/// Refuses --prompt under a policy whose forward is collective (FullShard: every rank holds a
/// shard, and one process generating alone would wait for the others), before training starts.
inline void check_generation_policy(const GenerateArguments& g, const loom::TrainingArguments& args) {
  if (loom::sharding_chosen(args).shards_parameters)
    loom::check(!g.wanted(), "--prompt is not supported under --sharding full_shard (the parameters are sharded "
                             "across the ranks): generate from the saved model in one process, without --do_train");
}

/// The completion of `text` by `model` (a loom::models causal LM) as text: `text` encoded with
/// `tokenizer` (its post-processor's special tokens included, as the training data was
/// prepared), the generated ids after the prompt decoded without special tokens.
template <class Model>
std::string complete(Model& model, const loom::data::Tokenizer& tokenizer, const std::string& text,
                     const loom::models::GenerationConfig& config) {
  const auto ids = tokenizer.encode(text);
  loom::check(!ids.empty(), "--prompt {:?} encodes to no tokens", text);
  const auto device = model->parameters().front().device();
  const auto input_ids =
      torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong).unsqueeze(0).to(device);
  const auto out = loom::models::generate(model, input_ids, torch::ones_like(input_ids), config);
  const auto row = out[0].slice(0, input_ids.size(1)).to(torch::kCPU).contiguous();
  const std::span<const int64_t> generated(row.template data_ptr<int64_t>(), static_cast<size_t>(row.numel()));
  return tokenizer.decode(generated);
}

/// Prints `prompt` and its completion, labelled with `program`.
template <class Model>
void print_completion(Model& model, const std::filesystem::path& tokenizer_file, const std::string& prompt,
                      const GenerateArguments& g, uint64_t seed, std::string_view program) {
  const auto tokenizer = loom::data::Tokenizer::from_file(tokenizer_file);
  const auto completion = complete(model, tokenizer, prompt, g.config(seed));
  fmt::print("{}: prompt {:?}\n{}: completion {:?}\n", program, prompt, program, completion);
}

}  // namespace hf_example
