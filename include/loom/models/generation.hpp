#pragma once
// Text generation with loom's causal LMs (transformers' GenerationMixin.generate): greedy
// decoding and sampling (temperature, top-k, top-p), max_new_tokens, eos and pad handling,
// batches with left padding, and a key/value cache.
//
//   auto model = loom::models::LlamaForCausalLM::from_pretrained("folder");
//   auto ids = loom::models::generate(model, input_ids, attention_mask, {.max_new_tokens = 32});
//   // ids: [batch, prompt + generated], the prompt first, as transformers returns them
//
// What transformers does, step by step: position ids counted from each row's first real token
// (attention_mask.cumsum(-1) - 1, 0 on the padding), the padding masked in every attention,
// the prompt in one forward and then one token a step against the cache (DynamicCache), the
// last position's logits in float32, then for sampling temperature -> top-k -> top-p (HF's
// order of the logits warpers), softmax and a multinomial draw; rows that produced an eos id
// go on emitting pad_token_id until every row is done or max_new_tokens are out. Greedy
// decoding gives transformers' tokens (tests/models/test_generate.cpp); sampled tokens follow
// the same distribution but not transformers' random stream, so they differ from Python's
// under the same seed. Not implemented: beam search (num_beams > 1 is refused), the other
// logits processors (repetition penalty, min_length, ...), stopping strings.
//
// The model is any module holder whose module has the generation forward of models/gpt2.hpp
// and models/llama.hpp: `next_token_logits(const DecodeStep&)` and
// `check_generation_positions(positions)`, and a `config()` with eos_token_id / pad_token_id.

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/data/text.hpp>
#include <loom/models/causal_lm.hpp>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::models {

/// transformers' GenerationConfig, the fields loom implements, with HF's names and defaults.
struct GenerationConfig {
  std::optional<int64_t> max_new_tokens{};             ///< tokens to generate (none: up to max_length in all)
  int64_t max_length = 20;                             ///< prompt plus generated tokens, when max_new_tokens is none
  bool do_sample = false;                              ///< sample (true) or take the most likely token (greedy)
  double temperature = 1.0;                            ///< sampling: the logits divided by it
  int64_t top_k = 50;                                  ///< sampling: keep the k most likely tokens (0: all)
  double top_p = 1.0;                                  ///< sampling: keep the fewest tokens whose mass reaches top_p
  int64_t num_beams = 1;                               ///< must be 1 (beam search is not implemented)
  std::optional<std::vector<int64_t>> eos_token_id{};  ///< ids that end a row (none: the model config's; empty: none)
  std::optional<int64_t> pad_token_id{};               ///< what ended rows emit (none: the config's, else eos[0])
  bool use_cache = true;                               ///< the key/value cache (false: the whole sequence each step)
  /// (loom's) sampling from a CPU generator seeded with it; none: torch's default generator.
  std::optional<uint64_t> seed{};
};

/// Refuses settings generate() cannot honour (beam search, a non-positive max_new_tokens, and
/// under do_sample a temperature that is not positive, a negative top_k or a top_p outside
/// [0, 1]), each with one `loom:` line; generate() checks the same, so a program can check its
/// flags before it trains.
LOOM_INLINE void check_generation_config(const GenerationConfig& config);

struct GeneratedCompletions;

namespace detail {

/// What generation needs of a model, its type erased so the loop compiles once.
struct GenerationModel {
  std::function<torch::Tensor(const DecodeStep&)> next_token_logits;  ///< float32 [batch, vocab]
  std::function<void(int64_t)> check_positions;                       ///< refuses or warns past the position table
  torch::nn::Module* module = nullptr;                                ///< switched to eval mode for the call
  std::vector<int64_t> eos_token_id;                                  ///< the config's
  std::optional<int64_t> pad_token_id{};                              ///< the config's
};

/// The generation loop (generate's body).
LOOM_INLINE torch::Tensor generate(const GenerationModel& model, const torch::Tensor& input_ids,
                                   const torch::Tensor& attention_mask, const GenerationConfig& config);

/// transformers' _prepare_special_tokens rule for the pad id: the call's, else the config's,
/// else the first eos id (none when there is no eos id either).
inline std::optional<int64_t> pad_token_id(std::optional<int64_t> given, std::optional<int64_t> config,
                                           const std::vector<int64_t>& eos) {
  if (given) return given;
  if (config) return config;
  if (!eos.empty()) return eos.front();
  return std::nullopt;
}

/// `generated` and `references` brought to one width (see GeneratedCompletions).
LOOM_INLINE GeneratedCompletions completions(torch::Tensor generated, torch::Tensor references, int64_t pad_token_id);

/// A config's token ids: none, one, or (a JSON list, Llama 3's eos_token_id) several.
LOOM_INLINE std::vector<int64_t> token_ids(const nlohmann::json& ids);
inline std::vector<int64_t> token_ids(const std::optional<int64_t>& id) {
  return id ? std::vector<int64_t>{*id} : std::vector<int64_t>{};
}

}  // namespace detail

/// HF's logits warpers for sampling, in HF's order: scores / temperature (when not 1), then
/// top-k (when top_k > 0), then top-p (when top_p < 1); removed tokens get -inf. `scores`:
/// float [batch, vocab].
LOOM_INLINE torch::Tensor warp_scores(const torch::Tensor& scores, const GenerationConfig& config);

/// A causal LM the generation loop can drive (GPT2LMHeadModel, LlamaForCausalLM holders).
template <class Model>
concept GenerativeModel = requires(Model& model, const DecodeStep& step) {
  { model->next_token_logits(step) } -> std::same_as<torch::Tensor>;
  model->check_generation_positions(int64_t{});
  model->config().eos_token_id;
  model->config().pad_token_id;
};

/// transformers' model.generate(input_ids, attention_mask=..., generation_config=...): the
/// prompt and the generated tokens, int64 [batch, prompt + generated] (generated: up to
/// max_new_tokens, fewer when every row ended with an eos id first). `attention_mask` (int64
/// [batch, prompt], 0 on left padding) may be undefined: inferred from pad_token_id as HF does.
/// The model runs in eval mode without autograd (its mode is restored after).
template <GenerativeModel Model>
torch::Tensor generate(Model& model, const torch::Tensor& input_ids, const torch::Tensor& attention_mask = {},
                       const GenerationConfig& config = {}) {
  auto* impl = &*model;
  detail::GenerationModel erased{
      [impl](const DecodeStep& step) { return impl->next_token_logits(step); },
      [impl](int64_t positions) { impl->check_generation_positions(positions); },
      impl,
      detail::token_ids(impl->config().eos_token_id),
      impl->config().pad_token_id,
  };
  return detail::generate(erased, input_ids, attention_mask, config);
}


/// A causal-LM batch cut for generation during evaluation (the Trainer's
/// --predict_with_generate): each row's prompt, its tokens before its first labelled one, and
/// its reference, its labelled tokens from the first to the last (the completion, with its eos).
struct PromptsAndReferences {
  torch::Tensor input_ids;       ///< int64 [batch, longest prompt], left-padded with the pad id
  torch::Tensor attention_mask;  ///< int64, the same shape: 0 on the padding
  torch::Tensor references;      ///< int64 [batch, longest reference], right-padded with -100
};

/// `batch` cut into prompts and references (see PromptsAndReferences). Rows of one example
/// each (padded rows); packed windows (position_ids) and a row without a labelled token or
/// without a prompt are a loom::Error.
LOOM_INLINE PromptsAndReferences split_prompts(const data::CausalLMBatch& batch, int64_t pad_token_id);

/// What generation during evaluation hands to compute_metrics: the generated tokens and the
/// references, both [batch, width] (the wider of the two): the generated ones padded with the
/// pad id, the references with -100, so that a token-level exact match counts each reference
/// through its eos and nothing generated after it.
struct GeneratedCompletions {
  torch::Tensor predictions;  ///< int64 generated tokens (without the prompt)
  torch::Tensor references;   ///< int64 reference completions, -100 past their end
};

/// Seq2SeqTrainer's prediction_step generation for a causal LM: each row's completion
/// generated greedily from its prompt (split_prompts), with max_length
/// --generation_max_length (the longest prompt plus the new tokens) or, unset, as many new
/// tokens as the batch's longest reference. The Trainer calls it (found by argument-dependent
/// lookup) under --predict_with_generate.
template <GenerativeModel Model>
GeneratedCompletions evaluation_generate(Model& model, const data::CausalLMBatch& batch,
                                         const TrainingArguments& args) {
  const auto& config = model->config();
  const auto pad = detail::pad_token_id(std::nullopt, config.pad_token_id, detail::token_ids(config.eos_token_id));
  check(pad.has_value(), "--predict_with_generate needs the model config's pad_token_id or eos_token_id (what "
                         "pads the prompts and the rows that ended)");
  auto split = split_prompts(batch, *pad);
  GenerationConfig generation;
  generation.num_beams = args.generation_num_beams.value_or(1);
  const int64_t prompt = split.input_ids.size(1), reference = split.references.size(1);
  if (args.generation_max_length) {
    check(*args.generation_max_length > prompt,
          "--generation_max_length {} leaves no new token after this batch's prompts of {} tokens (left-padded to "
          "the longest); max_length counts the prompt and the new tokens",
          *args.generation_max_length, prompt);
    generation.max_new_tokens = *args.generation_max_length - prompt;
  } else {
    generation.max_new_tokens = reference;
  }
  const auto out = generate(model, split.input_ids, split.attention_mask, generation);
  return detail::completions(out.narrow(1, prompt, out.size(1) - prompt), std::move(split.references), *pad);
}

}  // namespace loom::models

#if defined(LOOM_HEADER_ONLY)
#include <loom/models/impl/generation.ipp>
#endif
