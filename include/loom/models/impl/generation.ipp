#pragma once
// Definitions of models/generation.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/core/log.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/generation.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

namespace loom::models {

namespace detail {

LOOM_INLINE std::vector<int64_t> token_ids(const nlohmann::json& ids) {
  if (ids.is_null()) return {};
  if (ids.is_number_integer()) return {ids.get<int64_t>()};
  check(ids.is_array(), "generate: the config's token id {} is neither a number nor a list of numbers", ids.dump());
  std::vector<int64_t> out;
  for (const auto& id : ids) {
    check(id.is_number_integer(), "generate: the config's token ids {} hold a value that is not an integer",
          ids.dump());
    out.push_back(id.get<int64_t>());
  }
  return out;
}

}  // namespace detail

LOOM_INLINE void check_generation_config(const GenerationConfig& c) {
  check(c.num_beams == 1,
        "generate: num_beams is {}; loom implements greedy decoding and sampling only (num_beams 1), not beam search",
        c.num_beams);
  check(!c.max_new_tokens || *c.max_new_tokens > 0, "generate: max_new_tokens must be positive, got {}",
        c.max_new_tokens.value_or(0));
  if (c.do_sample) {
    check(c.temperature > 0.0, "generate: temperature must be positive when do_sample is true, got {}",
          c.temperature);
    check(c.top_k >= 0, "generate: top_k must be 0 (off) or positive, got {}", c.top_k);
    check(c.top_p >= 0.0 && c.top_p <= 1.0, "generate: top_p must be in [0, 1], got {}", c.top_p);
  }
}

namespace detail {

// Checks the settings and the inputs before any forward (each refusal a loom: line).
inline void check_generation(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                             const GenerationConfig& c) {
  check_generation_config(c);
  check(input_ids.defined() && input_ids.dim() == 2 && input_ids.size(0) > 0 && input_ids.size(1) > 0 &&
            input_ids.scalar_type() == torch::kLong,
        "generate: input_ids must be int64 of shape [batch, seq] with batch and seq at least 1, got {} {}",
        input_ids.defined() ? c10::toString(input_ids.scalar_type()) : "undefined",
        input_ids.defined() ? c10::str(input_ids.sizes()) : "");
  if (attention_mask.defined())
    check(attention_mask.sizes() == input_ids.sizes(),
          "generate: attention_mask of shape {} does not match input_ids of shape {}", c10::str(attention_mask.sizes()),
          c10::str(input_ids.sizes()));
}

}  // namespace detail

LOOM_INLINE torch::Tensor warp_scores(const torch::Tensor& scores, const GenerationConfig& c) {
  constexpr double removed = -std::numeric_limits<double>::infinity();
  auto out = scores;
  if (c.temperature != 1.0) out = out / c.temperature;  // TemperatureLogitsWarper
  if (c.top_k != 0) {                                    // TopKLogitsWarper (min_tokens_to_keep 1)
    const int64_t k = std::min(std::max<int64_t>(c.top_k, 1), out.size(-1));
    const auto kth = std::get<0>(torch::topk(out, k)).narrow(-1, k - 1, 1);
    out = out.masked_fill(out < kth, removed);
  }
  if (c.top_p < 1.0) {  // TopPLogitsWarper: drop the least likely tokens whose mass is at most 1 - top_p
    const auto [sorted, indices] = torch::sort(out, /*dim=*/-1, /*descending=*/false);
    const auto cumulative = sorted.softmax(-1).cumsum(-1);
    auto remove = cumulative <= (1.0 - c.top_p);
    remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);
    out = out.masked_fill(remove.scatter(1, indices, remove), removed);
  }
  return out;
}

namespace detail {

LOOM_INLINE torch::Tensor generate(const GenerationModel& model, const torch::Tensor& input_ids,
                                   const torch::Tensor& attention_mask, const GenerationConfig& c) {
  check_generation(input_ids, attention_mask, c);
  const int64_t batch = input_ids.size(0), prompt = input_ids.size(1);
  const auto device = input_ids.device();

  // _prepare_special_tokens: the config's ids unless the call gives them; pad defaults to
  // the first eos id.
  const std::vector<int64_t> eos = c.eos_token_id.value_or(model.eos_token_id);
  const std::optional<int64_t> pad = pad_token_id(c.pad_token_id, model.pad_token_id, eos);

  const int64_t new_tokens = c.max_new_tokens.value_or(c.max_length - prompt);
  check(new_tokens > 0,
        "generate: the prompt has {} tokens and max_length is {}, which leaves none to generate; set max_new_tokens",
        prompt, c.max_length);

  // _prepare_attention_mask_for_generation: the pad tokens of the prompt, when pad is not an eos id.
  auto mask = attention_mask.defined() ? attention_mask.to(torch::kLong) : torch::Tensor();
  if (!mask.defined()) {
    const bool infer =
        pad && std::find(eos.begin(), eos.end(), *pad) == eos.end() && input_ids.eq(*pad).any().item<bool>();
    mask = infer ? input_ids.ne(*pad).to(torch::kLong) : torch::ones_like(input_ids);
  }
  const auto real = mask.sum(1);
  check(real.min().item<int64_t>() > 0, "generate: a row of attention_mask has no token (all 0)");
  if (batch > 1 && mask.select(1, prompt - 1).eq(0).any().item<bool>())
    log_message(LogLevel::warning,
                "generate: right-padding detected in a causal LM's prompt (attention_mask ends in 0): generated tokens "
                "would follow the padding; pad the prompts on the left");
  // The positions the model is given: the longest row's prompt and every generated token but the last.
  model.check_positions(real.max().item<int64_t>() + new_tokens - 1);

  // _prepare_position_ids_for_generation: counted from each row's first real token.
  auto positions = mask.cumsum(-1) - 1;
  positions = positions.masked_fill(mask.eq(0), 0);
  // HF drops an all-ones mask (no padding): causal attention then needs no mask.
  const bool padded = mask.eq(0).any().item<bool>();

  // Eval mode and no graph for the call (restored after, also on an exception).
  torch::NoGradGuard no_grad;
  struct ModeGuard {
    torch::nn::Module* m;
    bool was;
    ~ModeGuard() { m->train(was); }
  } mode{model.module, model.module->is_training()};
  model.module->eval();

  std::optional<at::Generator> generator;
  if (c.do_sample && c.seed) generator = at::make_generator<at::CPUGeneratorImpl>(*c.seed);
  const auto eos_ids = torch::tensor(eos, torch::TensorOptions().dtype(torch::kLong)).to(device);

  KVCache cache;
  auto sequences = input_ids;
  auto unfinished = torch::ones({batch}, input_ids.options().dtype(torch::kLong));
  for (int64_t step = 0; step < new_tokens; ++step) {
    DecodeStep inputs;
    if (c.use_cache && step > 0) {
      const int64_t seen = sequences.size(1);
      inputs = DecodeStep{sequences.narrow(1, seen - 1, 1), positions.narrow(1, seen - 1, 1), {}, &cache};
    } else {
      inputs = DecodeStep{sequences, positions, {}, c.use_cache ? &cache : nullptr};
    }
    if (padded) inputs.attention_mask = mask;
    const auto logits = model.next_token_logits(inputs);

    torch::Tensor next;
    if (c.do_sample) {
      const auto probs = warp_scores(logits, c).softmax(-1);
      // One check a step (beside the end-of-text one): multinomial would stop with a generic
      // error on the CPU and a device-side assert on CUDA.
      if (!torch::isfinite(probs).all().item<bool>()) {
        check(torch::isfinite(logits).all().item<bool>(),
              "generate: the model's next-token logits hold NaN or infinity at generated token {}; sampling has no "
              "probabilities to draw from (greedy decoding would pick an arbitrary token)",
              step + 1);
        fail("generate: temperature {} overflows float32: the logits divided by it are infinite, so the sampling "
             "probabilities are undefined (transformers stops here too); use a larger temperature, or do_sample "
             "false for the argmax it tends to",
             c.temperature);
      }
      next = generator ? torch::multinomial(probs.cpu(), 1, false, *generator).to(device)
                       : torch::multinomial(probs, 1);
      next = next.squeeze(1);
    } else {
      next = logits.argmax(-1);
    }
    if (!eos.empty()) next = next * unfinished + *pad * (1 - unfinished);

    sequences = torch::cat({sequences, next.unsqueeze(1)}, 1);
    mask = torch::cat({mask, mask.new_ones({batch, 1})}, 1);
    positions = torch::cat({positions, positions.narrow(1, positions.size(1) - 1, 1) + 1}, 1);
    if (!eos.empty()) {
      unfinished = unfinished.logical_and(torch::isin(next, eos_ids).logical_not()).to(torch::kLong);
      if (unfinished.max().item<int64_t>() == 0) break;
    }
  }
  return sequences;
}

LOOM_INLINE GeneratedCompletions completions(torch::Tensor generated, torch::Tensor references, int64_t pad_token_id) {
  const int64_t width = std::max(generated.size(1), references.size(1));
  const auto widen = [&](const torch::Tensor& t, int64_t fill) {
    if (t.size(1) == width) return t;
    auto out = torch::full({t.size(0), width}, fill, t.options());
    out.narrow(1, 0, t.size(1)).copy_(t);
    return out;
  };
  return {widen(generated, pad_token_id), widen(references.to(generated.device()), -100)};
}

}  // namespace detail

LOOM_INLINE PromptsAndReferences split_prompts(const data::CausalLMBatch& batch, int64_t pad_token_id) {
  check(!batch.position_ids.defined(),
        "--predict_with_generate needs one example per row; this batch packs several (position_ids): evaluate on "
        "padded rows");
  check(batch.input_ids.defined() && batch.labels.defined() && batch.input_ids.dim() == 2 &&
            batch.labels.sizes() == batch.input_ids.sizes(),
        "--predict_with_generate needs a causal-LM batch with input_ids and labels of one shape [batch, seq]");
  const auto ids = batch.input_ids.to(torch::kCPU, torch::kLong);
  const auto labels = batch.labels.to(torch::kCPU, torch::kLong);
  const int64_t rows = ids.size(0), seq = ids.size(1);
  std::vector<int64_t> first(static_cast<std::size_t>(rows)), last(static_cast<std::size_t>(rows));
  const auto* l = labels.data_ptr<int64_t>();
  int64_t prompt_width = 0, reference_width = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t f = -1, e = -1;
    for (int64_t t = 0; t < seq; ++t)
      if (l[r * seq + t] != -100) {
        if (f < 0) f = t;
        e = t;
      }
    check(f >= 0, "--predict_with_generate: row {} of the batch has no labelled token, so no completion to generate "
                  "(its labels are all -100)", r);
    check(f > 0, "--predict_with_generate: row {} of the batch is labelled from its first token, so it has no prompt "
                 "to generate from (the prompt's labels are -100)", r);
    first[static_cast<std::size_t>(r)] = f;
    last[static_cast<std::size_t>(r)] = e;
    prompt_width = std::max(prompt_width, f);
    reference_width = std::max(reference_width, e - f + 1);
  }
  PromptsAndReferences out;
  out.input_ids = torch::full({rows, prompt_width}, pad_token_id, torch::kLong);
  out.attention_mask = torch::zeros({rows, prompt_width}, torch::kLong);
  out.references = torch::full({rows, reference_width}, -100, torch::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t f = first[static_cast<std::size_t>(r)], e = last[static_cast<std::size_t>(r)];
    out.input_ids[r].narrow(0, prompt_width - f, f).copy_(ids[r].narrow(0, 0, f));
    out.attention_mask[r].narrow(0, prompt_width - f, f).fill_(1);
    out.references[r].narrow(0, 0, e - f + 1).copy_(ids[r].narrow(0, f, e - f + 1));
  }
  const auto device = batch.input_ids.device();
  out.input_ids = out.input_ids.to(device);
  out.attention_mask = out.attention_mask.to(device);
  out.references = out.references.to(device);
  return out;
}


}  // namespace loom::models
