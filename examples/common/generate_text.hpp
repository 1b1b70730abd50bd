// Text in, text out for the causal-LM examples (gpt2, llama_sft): --prompt "..." is encoded
// with the data folder's tokenizer.json (loom::data::Tokenizer), continued by
// loom::models::generate (greedy by default; --do_sample with --temperature / --top_k /
// --top_p), and the new tokens are decoded and printed, as transformers' pipeline("text-generation")
// prints a completion. --predict_file PROMPTS.jsonl does the same for every line of a file, in
// batches of --per_device_eval_batch_size (left-padded, with the key/value cache), into
// <output_dir>/predictions.jsonl.
#pragma once

#include <loom/config/field_help.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/data/tokenizer.hpp>
#include <loom/models/generation.hpp>

#include "hf_example.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <loom/config/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace hf_example {

/// Generation flags of the causal-LM examples (HF's GenerationConfig names).
struct GenerateArguments {
  std::string prompt;          ///< text to continue once training and evaluation are done ("": none)
  std::string predict_file;    ///< JSON Lines of {"prompt": ...}: each continued, into <output_dir>/predictions.jsonl ("": none)
  int64_t max_new_tokens = 48; ///< tokens to generate after the prompt
  bool do_sample = false;      ///< sample (true) or take the most likely token (greedy)
  double temperature = 1.0;    ///< sampling: the logits divided by it
  int64_t top_k = 50;          ///< sampling: keep the k most likely tokens (0: all)
  double top_p = 1.0;          ///< sampling: keep the fewest tokens whose mass reaches top_p

  static constexpr loom::FieldHelp field_help[] = {
      {"prompt", "text to continue after training and evaluation, printed with its completion; given alone "
                 "(no --do_train / --do_eval), the run only generates"},
      {"predict_file",
       "JSON Lines of {\"prompt\": ...}: every prompt continued, in batches of --per_device_eval_batch_size "
       "(left-padded, with the key/value cache), into <output_dir>/predictions.jsonl (prompt, completion, token "
       "counts); given alone, the run only generates"},
      {"max_new_tokens", "tokens to generate after --prompt (the completion stops earlier at the end-of-text id)"},
      {"do_sample", "sample the completion (seeded by --seed) instead of taking the most likely token"},
      {"temperature", "sampling: the logits are divided by it"},
      {"top_k", "sampling: keep the k most likely tokens (0: all)"},
      {"top_p", "sampling: keep the fewest most likely tokens whose probability reaches top_p"},
  };
  static constexpr std::string_view help_heading = "generation";

  /// True when the run was given a prompt or a file of them.
  [[nodiscard]] bool wanted() const { return !prompt.empty() || !predict_file.empty(); }

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

/// Refuses --prompt under a policy whose forward is collective (FullShard: every rank holds a
/// shard, and one process generating alone would wait for the others), before training starts.
inline void check_generation_policy(const GenerateArguments& g, const loom::TrainingArguments& args) {
  if (loom::sharding_chosen(args).shards_parameters)
    loom::check(!g.wanted(), "--prompt and --predict_file are not supported under --sharding full_shard (the "
                             "parameters are sharded across the ranks): generate from the saved model in one process, "
                             "without --do_train");
}

/// A tokenizer that will encode prompts for a model of `model_vocab` ids: refused when it gives
/// ids past the model's vocabulary (the first forward would fail on an index otherwise).
inline void check_tokenizer_fits(const loom::data::Tokenizer& tokenizer, const std::filesystem::path& file,
                                 int64_t model_vocab) {
  loom::check(tokenizer.vocab_size() <= model_vocab,
              "{}: this tokenizer gives ids up to {}, past the model's vocabulary of {} ids (config.json's "
              "vocab_size): the tokenizer and the model do not belong together",
              file.string(), tokenizer.vocab_size() - 1, model_vocab);
}

/// At start-up, before any training: the tokenizer that --prompt, --predict_file or
/// --predict_with_generate will use, read and checked against the model.
inline void check_generation_tokenizer(const GenerateArguments& g, const loom::TrainingArguments& args,
                                       const std::filesystem::path& file, int64_t model_vocab) {
  if (!g.wanted() && !args.predict_with_generate) return;
  check_tokenizer_fits(loom::data::Tokenizer::from_file(file), file, model_vocab);
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

/// Python's str.strip() on UTF-8 text: the characters str.isspace() takes (ASCII's six, the
/// separators U+001C-U+001F, and Unicode's spaces) removed from both ends, as HF evaluate's
/// exact_match sees a stripped text.
inline std::string python_strip(std::string_view t) {
  // The length of the space character at the start of `s` (0: none).
  const auto space_at = [](std::string_view s) -> std::size_t {
    if (s.empty()) return 0;
    const auto b = [&](std::size_t i) { return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u; };
    const unsigned c = b(0);
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    if (c == 0xC2 && (b(1) == 0x85 || b(1) == 0xA0)) return 2;                                      // U+0085, U+00A0
    if (c == 0xE1 && b(1) == 0x9A && b(2) == 0x80) return 3;                                         // U+1680
    if (c == 0xE2 && b(1) == 0x80 && (b(2) <= 0x8A || b(2) == 0xA8 || b(2) == 0xA9 || b(2) == 0xAF)) return 3;
    if (c == 0xE2 && b(1) == 0x81 && b(2) == 0x9F) return 3;                                         // U+205F
    if (c == 0xE3 && b(1) == 0x80 && b(2) == 0x80) return 3;                                         // U+3000
    return 0;
  };
  while (const auto n = space_at(t)) t.remove_prefix(n);
  while (!t.empty()) {
    std::size_t start = t.size() - 1;  // the last character's first byte
    while (start > 0 && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) --start;
    if (space_at(t.substr(start)) != t.size() - start) break;
    t.remove_suffix(t.size() - start);
  }
  return std::string(t);
}

/// The prompts of a --predict_file (JSON Lines, each an object with a string "prompt"), each
/// through `prepare` (the program's rule, such as a newline at the end); a loom::Error names
/// FILE:LINE of a line that is not one, or whose prompt is empty.
inline std::vector<std::string> read_prompts(const std::string& file,
                                             const std::function<std::string(std::string)>& prepare) {
  loom::check(loom::path_exists(file, loom::PathKind::file, "--predict_file"), "--predict_file {}: no such file",
              file);
  std::ifstream in(file, std::ios::binary);
  loom::check(static_cast<bool>(in), "--predict_file {}: cannot be read", file);
  std::vector<std::string> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines, as JSON Lines readers skip
    nlohmann::json j;
    try {
      j = loom::json::parse(line, fmt::format("{}:{}", file, number));
    } catch (const loom::Error&) {
      throw;
    } catch (const std::exception& e) {
      loom::fail("{}:{}: not a JSON object ({})", file, number, e.what());
    }
    loom::check(j.is_object() && j.contains("prompt") && j["prompt"].is_string(),
                "{}:{}: each line must be an object with a string \"prompt\"", file, number);
    auto prompt = j["prompt"].get<std::string>();
    loom::check(!prompt.empty(), "{}:{}: the prompt is empty", file, number);
    prompts.push_back(prepare(std::move(prompt)));
  }
  loom::check(!prompts.empty(), "--predict_file {} holds no prompt", file);
  return prompts;
}

/// Up-front checks, before any data or model is read; true when the run only generates (a
/// prompt without --do_train / --do_eval / --do_predict), to be handed to apply_script_rules.
inline bool generate_only(const GenerateArguments& g, const loom::TrainingArguments& args) {
  loom::check(g.max_new_tokens > 0, "--max_new_tokens must be positive, got {}", g.max_new_tokens);
  // The sampling flags as generate() will check them, now rather than after training.
  if (g.wanted()) loom::models::check_generation_config(g.config(static_cast<uint64_t>(args.seed)));
  // The prompts file as it will be read, now rather than after training.
  if (!g.predict_file.empty()) (void)read_prompts(g.predict_file, [](std::string p) { return p; });
  return runs_alone(g.wanted(), args);
}

/// Every prompt continued by `model`, `batch` at a time (left-padded with the tokenizer's pad
/// id, else the config's eos; the key/value cache), into `out` as JSON Lines: the prompt, its
/// completion (decoded without special tokens), the prompt's tokens and the completion's (up
/// to and with its end-of-text id). Written beside and renamed into place when complete.
/// Returns the completions.
template <class Model>
std::vector<std::string> predict_prompts(Model& model, const loom::data::Tokenizer& tokenizer,
                                         const std::vector<std::string>& prompts,
                                         const loom::models::GenerationConfig& config, int64_t batch,
                                         const std::filesystem::path& out) {
  loom::check(batch > 0, "--per_device_eval_batch_size must be positive, got {}", batch);
  const auto device = model->parameters().front().device();
  // The ids that end a row, as generate reads them: the call's, else the model config's.
  const auto stops = config.eos_token_id.value_or(loom::models::detail::token_ids(model->config().eos_token_id));
  const int64_t pad = tokenizer.pad_token_id().value_or(stops.empty() ? 0 : stops.front());
  std::vector<std::string> completions;
  std::filesystem::create_directories(out.parent_path());
  const auto partial = out.parent_path() / (out.filename().string() + ".partial");
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    loom::check(static_cast<bool>(file), "cannot write {}", partial.string());
    for (std::size_t start = 0; start < prompts.size(); start += static_cast<std::size_t>(batch)) {
      const std::size_t end = std::min(prompts.size(), start + static_cast<std::size_t>(batch));
      std::vector<std::vector<int64_t>> ids;
      int64_t width = 0;
      for (std::size_t i = start; i < end; ++i) {
        ids.push_back(tokenizer.encode(prompts[i]));
        loom::check(!ids.back().empty(), "--predict_file: prompt {} ({:?}) encodes to no tokens", i + 1, prompts[i]);
        width = std::max<int64_t>(width, static_cast<int64_t>(ids.back().size()));
      }
      const auto rows = static_cast<int64_t>(ids.size());
      auto input_ids = torch::full({rows, width}, pad, torch::kLong);
      auto mask = torch::zeros({rows, width}, torch::kLong);
      for (int64_t r = 0; r < rows; ++r) {  // left padding: each prompt ends at the last column
        const auto& row = ids[static_cast<std::size_t>(r)];
        const auto n = static_cast<int64_t>(row.size());
        input_ids[r].narrow(0, width - n, n).copy_(torch::tensor(row, torch::kLong));
        mask[r].narrow(0, width - n, n).fill_(1);
      }
      const auto generated =
          loom::models::generate(model, input_ids.to(device), mask.to(device), config).slice(1, width).to(torch::kCPU);
      for (int64_t r = 0; r < rows; ++r) {
        const auto row = generated[r].contiguous();
        std::vector<int64_t> tokens(row.template data_ptr<int64_t>(), row.template data_ptr<int64_t>() + row.numel());
        // The completion ends at its first end-of-text id (generate pads the rows that ended).
        const auto stop = std::find_if(tokens.begin(), tokens.end(), [&](int64_t t) {
          return std::find(stops.begin(), stops.end(), t) != stops.end();
        });
        if (stop != tokens.end()) tokens.erase(stop + 1, tokens.end());
        auto text = tokenizer.decode(tokens);
        const auto i = start + static_cast<std::size_t>(r);
        file << nlohmann::json{{"prompt", prompts[i]},
                               {"completion", text},
                               {"prompt_tokens", ids[static_cast<std::size_t>(r)].size()},
                               {"completion_tokens", tokens.size()}}
                    .dump()
             << "\n";
        completions.push_back(std::move(text));
      }
    }
    file.flush();
    loom::check(static_cast<bool>(file), "writing {} failed", partial.string());
  }
  std::filesystem::rename(partial, out);
  return completions;
}

/// What the generation flags ask for once training and evaluation are done, on the main
/// process: --prompt's completion printed, and --predict_file's completions written to
/// <output_dir>/predictions.jsonl. `prepare` is the program's rule for a prompt.
template <class Model>
void generate_outputs(Model& model, const std::filesystem::path& tokenizer_file, const GenerateArguments& g,
                      const loom::TrainingArguments& args, std::string_view program,
                      const std::function<std::string(std::string)>& prepare) {
  const auto tokenizer = loom::data::Tokenizer::from_file(tokenizer_file);
  check_tokenizer_fits(tokenizer, tokenizer_file, model->config().vocab_size);
  const auto config = g.config(static_cast<uint64_t>(args.seed));
  if (!g.prompt.empty()) {
    const auto prompt = prepare(g.prompt);
    fmt::print("{}: prompt {:?}\n{}: completion {:?}\n", program, prompt, program,
               complete(model, tokenizer, prompt, config));
  }
  if (!g.predict_file.empty()) {
    const auto prompts = read_prompts(g.predict_file, prepare);
    const auto out = std::filesystem::path(args.output_dir) / "predictions.jsonl";
    (void)predict_prompts(model, tokenizer, prompts, config, args.per_device_eval_batch_size, out);
    fmt::print("{}: {} completions of {} -> {}\n", program, prompts.size(), g.predict_file, out.string());
  }
}

}  // namespace hf_example
