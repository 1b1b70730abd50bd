// The causal LM loss at the scored positions only, and chunked (loom/models/causal_lm.hpp,
// issue 41 points 1 and 2), against the full computation: causal_lm_loss over the logits of
// every position, differentiated by autograd.

#include <loom/core/forward_request.hpp>
#include <loom/models/causal_lm.hpp>
#include <loom/models/llama.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <ATen/autocast_mode.h>

#include <array>
#include <optional>
#include <vector>

namespace lm_loss_test {

// Largest |a - b| over the largest |b|.
inline double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

// Labels as instruction data has them: each row scored from a random point on (its prompt
// -100), one row scored nowhere.
inline torch::Tensor prompt_masked(const torch::Tensor& ids, torch::Generator& gen) {
  auto labels = ids.clone();
  const int64_t rows = ids.size(0), seq = ids.size(1);
  const auto start = torch::randint(1, seq - 1, {rows, 1}, gen);
  labels.masked_fill_(torch::arange(seq).unsqueeze(0) < start, -100);
  labels[rows - 1].fill_(-100);
  return labels;
}

// ForCausalLMLoss's targets: position t scored against labels[t + 1].
inline torch::Tensor shifted(const torch::Tensor& labels) {
  return torch::constant_pad_nd(labels, {0, 1}, -100).narrow(-1, 1, labels.size(-1));
}

// A Llama of vocabulary 100, width 32, `layers` layers, seeded.
inline loom::models::LlamaForCausalLM tiny_llama(int64_t layers) {
  loom::models::LlamaConfig config;
  config.vocab_size = 100, config.hidden_size = 32, config.intermediate_size = 64, config.num_hidden_layers = layers;
  config.num_attention_heads = 4, config.num_key_value_heads = 2, config.max_position_embeddings = 64;
  torch::manual_seed(0);
  return loom::models::LlamaForCausalLM(config);
}

struct Case {
  torch::Tensor hidden, weight, labels;
};

inline Case make_case(int64_t batch, int64_t seq, int64_t width, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Case c;
  c.hidden = torch::randn({batch, seq, width}, gen).requires_grad_();
  c.weight = (torch::randn({vocab, width}, gen) * 0.3).requires_grad_();
  c.labels = prompt_masked(torch::randint(0, vocab, {batch, seq}, gen), gen);
  return c;
}

struct Result {
  torch::Tensor loss, d_hidden, d_weight;
};

// The loss, then its gradients scaled by `scale` (as a loss scaler or a micro-batch weight).
template <class F>
Result run(const Case& c, F&& loss_of, double scale = 1.0) {
  c.hidden.mutable_grad() = torch::Tensor();
  c.weight.mutable_grad() = torch::Tensor();
  Result r;
  r.loss = loss_of(c.hidden, c.weight, c.labels);
  (r.loss * scale).backward();
  r.d_hidden = c.hidden.grad().clone();
  if (c.weight.grad().defined()) r.d_weight = c.weight.grad().clone();
  r.loss = r.loss.detach();
  return r;
}

inline torch::Tensor full(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& labels, bool fast) {
  return loom::models::causal_lm_loss(loom::models::lm_head_logits(h, w, fast), labels, fast);
}

inline torch::Tensor full_loss_of(const Case& c, bool fast) {
  torch::NoGradGuard no_grad;
  return full(c.hidden, c.weight, c.labels, fast);
}

TEST_CASE("the causal LM loss at the scored positions only equals the full loss and its gradients") {
  // The tiny sizes of tests/hf/compare.py (bit for bit there, as transformers' unchunked loss),
  // and a larger one, where a product's blocking may differ with its row count.
  for (auto [batch, seq, width, vocab] : std::vector<std::array<int64_t, 4>>{{4, 16, 32, 64}, {4, 96, 64, 1000}}) {
    for (bool fast : {false, true}) {
      CAPTURE(batch);
      CAPTURE(seq);
      CAPTURE(vocab);
      CAPTURE(fast);
      const Case c = make_case(batch, seq, width, vocab, 7);
      const auto reference = run(c, [&](auto& h, auto& w, auto& l) { return full(h, w, l, fast); });
      const auto scored = run(c, [&](auto& h, auto& w, auto& l) {
        return loom::models::scored_causal_lm_loss(h, w, l, fast, /*chunked=*/false);
      });
      // The same value bit for bit: the same rows, reduced in nll_loss's order.
      CHECK(scored.loss.item<float>() == reference.loss.item<float>());
      CHECK(relative(scored.d_hidden, reference.d_hidden) <= 1e-6);
      CHECK(relative(scored.d_weight, reference.d_weight) <= 1e-6);
      if (vocab == 64) {  // compare.py's size: every product the same, bit for bit
        CHECK(torch::equal(scored.d_hidden, reference.d_hidden));
        CHECK(torch::equal(scored.d_weight, reference.d_weight));
      }
      // The unscored positions get no gradient at all.
      const auto unscored = shifted(c.labels).eq(-100);
      CHECK(scored.d_hidden.index({unscored}).abs().max().item<float>() == 0.0f);
    }
  }
}

TEST_CASE("the reference path's loss at the scored positions equals the full loss with 1 to 4 scored tokens") {
  // Padded instruction rows can leave a micro-batch one scored token: a head product of so few
  // rows sums in another order than the full one on the CPU (MKL's sgemm of 1 to 3 rows), so
  // the reference path multiplies at least kMinHeadRows rows (scored ones and unscored ones).
  for (int64_t scored_tokens = 1; scored_tokens <= 4; ++scored_tokens) {
    CAPTURE(scored_tokens);
    Case c = make_case(2, 16, 32, 64, 13);
    c.labels.fill_(-100);
    for (int64_t i = 0; i < scored_tokens; ++i) c.labels[i % 2][3 + i] = 5 + 7 * i;  // position 2 + i scored
    const auto reference = run(c, [&](auto& h, auto& w, auto& l) { return full(h, w, l, false); });
    const auto scored = run(c, [&](auto& h, auto& w, auto& l) {
      return loom::models::scored_causal_lm_loss(h, w, l, /*fast=*/false, /*chunked=*/false);
    });
    CHECK(scored.loss.item<float>() == reference.loss.item<float>());
    CHECK(torch::equal(scored.d_hidden, reference.d_hidden));
    CHECK(torch::equal(scored.d_weight, reference.d_weight));
  }
}

TEST_CASE("linear_cross_entropy (chunked) equals the full loss and gradients; frozen head, no grad, scaled") {
  const Case c = make_case(3, 40, 24, 203, 11);  // 203: not a multiple of 64, so `fast` pads
  for (bool fast : {false, true}) {
    for (int64_t chunk : {int64_t{7}, int64_t{64}, int64_t{0}}) {
      CAPTURE(fast);
      CAPTURE(chunk);
      const auto reference = run(c, [&](auto& h, auto& w, auto& l) { return full(h, w, l, fast); }, 3.0);
      const auto chunked = run(
          c,
          [&](auto& h, auto& w, auto& l) {
            const auto targets = shifted(l).reshape({-1});
            return loom::models::linear_cross_entropy(h.reshape({-1, h.size(-1)}), w, targets, fast, chunk);
          },
          3.0);
      CHECK(relative(chunked.loss, reference.loss) <= 1e-6);
      CHECK(relative(chunked.d_hidden, reference.d_hidden) <= 1e-5);
      CHECK(relative(chunked.d_weight, reference.d_weight) <= 1e-5);
      // Through the scored rows, as the models call it.
      const auto scored = run(
          c, [&](auto& h, auto& w, auto& l) { return loom::models::scored_causal_lm_loss(h, w, l, fast, true); }, 3.0);
      CHECK(relative(scored.loss, reference.loss) <= 1e-6);
      CHECK(relative(scored.d_hidden, reference.d_hidden) <= 1e-5);
      CHECK(relative(scored.d_weight, reference.d_weight) <= 1e-5);
    }
  }
  // A frozen head (LoRA): no weight gradient; the hidden states' gradient as before.
  const Case frozen{c.hidden, c.weight.detach(), c.labels};
  const auto reference = run(frozen, [&](auto& h, auto& w, auto& l) { return full(h, w, l, false); });
  const auto chunked = run(
      frozen, [&](auto& h, auto& w, auto& l) { return loom::models::scored_causal_lm_loss(h, w, l, false, true); });
  CHECK_FALSE(chunked.d_weight.defined());
  CHECK(relative(chunked.d_hidden, reference.d_hidden) <= 1e-5);
  // Without grad mode (evaluation): the loss alone, nothing to differentiate.
  torch::NoGradGuard no_grad;
  const auto loss = loom::models::scored_causal_lm_loss(c.hidden, c.weight, c.labels, true, true);
  CHECK_FALSE(loss.requires_grad());
  CHECK(relative(loss, reference.loss) <= 1e-6);
}

TEST_CASE("token_scores: each label's log-probability, entropy, mean logit and top-1 as the full logits give them") {
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    const Case c = make_case(3, 20, 24, 203, 13);
    torch::NoGradGuard no_grad;
    const auto got = loom::models::token_scores(c.hidden, c.weight, c.labels, fast, /*statistics=*/true, false);
    const auto logits = loom::models::lm_head_logits(c.hidden, c.weight, fast);
    const auto target = shifted(c.labels);
    const auto scored = target.ne(-100);
    const auto log_softmax = torch::log_softmax(logits.to(torch::kFloat), -1);
    const auto full = log_softmax.gather(-1, target.clamp_min(0).unsqueeze(-1)).squeeze(-1).masked_fill(
        scored.logical_not(), 0);
    REQUIRE(got.log_probs.sizes() == c.labels.sizes());
    CHECK(torch::equal(got.log_probs, full));  // the same rows, bit for bit
    CHECK(got.log_probs.masked_select(scored.logical_not()).eq(0).all().item<bool>());
    // The loss is minus their mean over the scored positions.
    CHECK(relative(-got.log_probs.sum() / scored.sum(), full_loss_of(c, fast)) <= 1e-6);
    // The statistics over the vocabulary's columns (not the padding's), at the scored positions.
    const auto shown = logits.narrow(-1, 0, 203).to(torch::kFloat);
    const auto p = torch::softmax(shown, -1);
    const auto entropy = (-(p * torch::log_softmax(shown, -1)).sum(-1)).masked_fill(scored.logical_not(), 0);
    CHECK(relative(got.entropy, entropy) <= 1e-6);
    CHECK(relative(got.mean_logits, shown.mean(-1).masked_fill(scored.logical_not(), 0)) <= 1e-6);
    CHECK(torch::equal(got.is_top1, shown.argmax(-1).eq(target).logical_and(scored)));
    CHECK(got.is_top1.any().item<bool>());  // the case has some: the comparison is not vacuous
    // Chunked: the same values within float32 rounding.
    const auto chunked = loom::models::token_scores(c.hidden, c.weight, c.labels, fast, true, true);
    CHECK(relative(chunked.log_probs, got.log_probs) <= 1e-6);
    CHECK(relative(chunked.entropy, got.entropy) <= 1e-5);
    CHECK(relative(chunked.mean_logits, got.mean_logits) <= 1e-6);
    CHECK(torch::equal(chunked.is_top1, got.is_top1));
  }
  // A model's: the same through its body (DPO sums each completion's).
  auto model = tiny_llama(1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const auto ids = torch::randint(0, 100, {2, 16}, gen);
  const loom::data::CausalLMBatch batch{ids, prompt_masked(ids, gen)};
  torch::NoGradGuard no_grad;
  const auto per_token = model->token_scores(batch).log_probs;
  const auto scored = shifted(batch.labels).ne(-100);
  CHECK(relative(-per_token.sum() / scored.sum(), model->forward(batch).loss) <= 1e-6);
}

TEST_CASE("token_scores chunked: the gradients of weighted log-probabilities equal autograd's through the full logits") {
  // Sizes over one chunk (rows > 64 and an eighth of them), so backward recomputes several.
  const Case c = make_case(4, 150, 32, 301, 21);
  // Per-token weights as DPO's loss gives them (a different factor per position).
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto weights = torch::randn({4, 150}, gen);
  for (bool fast : {false, true}) {
    CAPTURE(fast);
    const auto loss_with = [&](bool chunked) {
      return [&, chunked](auto& h, auto& w, auto& l) {
        return (loom::models::token_scores(h, w, l, fast, false, chunked).log_probs * weights).sum();
      };
    };
    const auto reference = run(c, loss_with(false));
    const auto chunked = run(c, loss_with(true));
    CHECK(relative(chunked.loss, reference.loss) <= 1e-5);
    CHECK(relative(chunked.d_hidden, reference.d_hidden) <= 1e-5);
    CHECK(relative(chunked.d_weight, reference.d_weight) <= 1e-5);
  }
}

TEST_CASE("the chunked loss under bfloat16 autocast computes as the unchunked one does") {
  const Case c = make_case(2, 64, 32, 500, 3);
  at::autocast::set_autocast_enabled(at::kCPU, true);
  at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  const auto reference = run(c, [&](auto& h, auto& w, auto& l) { return full(h, w, l, false); });
  const auto chunked = run(
      c, [&](auto& h, auto& w, auto& l) { return loom::models::scored_causal_lm_loss(h, w, l, false, true); });
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  // Both products in bfloat16 (8 bits of mantissa), the softmax in float32.
  CHECK(relative(chunked.loss, reference.loss) <= 1e-3);
  CHECK(relative(chunked.d_hidden, reference.d_hidden) <= 2e-2);
  CHECK(relative(chunked.d_weight, reference.d_weight) <= 2e-2);
  CHECK((chunked.d_hidden.scalar_type() == torch::kFloat));
}

TEST_CASE("a causal LM asked for its loss alone returns no logits; the rule that chunks it") {
  auto model = tiny_llama(2);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto ids = torch::randint(0, 100, {2, 24}, gen);
  const loom::data::CausalLMBatch batch{ids, prompt_masked(ids, gen)};
  const auto whole = model->forward(batch);
  REQUIRE(whole.logits.defined());
  for (std::optional<bool> chunked : {std::optional<bool>(), std::optional<bool>(false), std::optional<bool>(true)}) {
    loom::ForwardRequestScope request({.logits = false, .chunked_lm_loss = chunked});
    const auto out = model->forward(batch);
    CHECK_FALSE(out.logits.defined());
    if (chunked.value_or(false)) CHECK(relative(out.loss, whole.loss) <= 1e-6);
    else CHECK(out.loss.item<float>() == whole.loss.item<float>());
    // Without labels the logits are what there is to return.
    CHECK(model->forward({ids, {}}).logits.defined());
  }
  CHECK(loom::forward_request().logits);  // the scope restored the default
  // The memory plan's estimate follows the request: no logits saved, and chunked no
  // log-softmax either (2 x 24 tokens, 100 columns: the default keeps it unchunked).
  const double logits = model->activation_bytes(2, 24, 4, false);
  double scored = 0, chunked = 0;
  {
    loom::ForwardRequestScope request({.logits = false, .chunked_lm_loss = std::nullopt});
    scored = model->activation_bytes(2, 24, 4, false);
  }
  {
    loom::ForwardRequestScope request({.logits = false, .chunked_lm_loss = true});
    chunked = model->activation_bytes(2, 24, 4, false);
  }
  CHECK(scored == doctest::Approx(logits + 2 * 24 * 4 * 32));  // the gathered hidden states beside the logits
  CHECK(chunked == doctest::Approx(logits + 2 * 24 * (4 * 32 + 4 * 32 - 8 * 100)));
  // The default chunks above 64 MiB of float32 logits; a chunk is Liger's share, or the hidden
  // size's positions up to an eighth of them, >= 64 rows.
  CHECK_FALSE(loom::chunked_lm_loss_by_default(4096, 4096));
  CHECK(loom::chunked_lm_loss_by_default(4096, 128256));
  CHECK(loom::chunked_lm_loss_rows(4096, 2048, 128256) == 512);  // an eighth
  CHECK(loom::chunked_lm_loss_rows(4096, 256, 128256) == 256);   // the hidden size
  CHECK(loom::chunked_lm_loss_rows(1 << 16, 256, 128256) == 256);
  CHECK(loom::chunked_lm_loss_rows(1 << 20, 64, 128256) == 1024);  // Liger's: 2^20 / 2004, to a power of two
  CHECK(loom::chunked_lm_loss_rows(40, 256, 128256) == 40);
}

}  // namespace lm_loss_test
