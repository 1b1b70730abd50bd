// A character-level GPT-style transformer trained on the King James Bible from Debian's
// bible-kjv-text package, evaluated on the held-out last 5% of the text (eval_loss and
// eval_perplexity = exp(eval_loss)), then used to generate text from a prompt.
//
//   build/examples/char_lm                                  # the defaults below (bf16, ~2 min on 2 cores)
//   build/examples/char_lm --bf16 false --max_steps 50      # fp32, fewer steps
//   build/examples/char_lm --n_layer 2 --n_embd 64 --sample_prompt "And God said"
//   build/examples/char_lm --help                           # every flag
//
// The data file: /usr/lib/bible.data (package bible-kjv-text), in the compressed "EC02"
// format that ../common/kjv.hpp decodes (the format is described there). By default the
// example drops the title line and the references and trains on the verse texts, one per
// line (--keep_references keeps the lines whole). A file that does not start with "EC02" is
// read as plain text, so any text file works too.
//
// The model has no dropout by default, so runs whose batches are split differently
// (gradient accumulation) stay comparable; labels of -100 are ignored by the loss, and
// num_items counts the other labels, so accumulation normalizes by tokens.

#include <loom/loom.hpp>

#include "../common/kjv.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <string>
#include <vector>

/// Flags of this example, beside every TrainingArguments flag.
struct ExampleArguments {
  std::string data_file = "/usr/lib/bible.data";  ///< the bible-kjv-text data file (or any plain-text file)
  bool keep_references = false;      ///< keep each verse's "Ge1:1 " reference and the title line
  int64_t block_size = 128;          ///< characters of context (the length of each training sequence)
  int64_t n_layer = 4;               ///< transformer blocks
  int64_t n_head = 4;                ///< attention heads per block
  int64_t n_embd = 128;              ///< model width
  double dropout = 0.0;              ///< dropout on embeddings, attention weights and residual branches
  bool tie_word_embeddings = true;   ///< the LM head shares the token embedding matrix
  double eval_fraction = 0.05;       ///< the last fraction of the text is held out for evaluation
  std::optional<int64_t> max_train_blocks;  ///< use only the first N training blocks
  std::optional<int64_t> max_eval_blocks;   ///< use only the first N held-out blocks
  int64_t sample_length = 300;             ///< characters generated after training (0: none)
  std::string sample_prompt = "In the beginning";  ///< the generation prompt
  double temperature = 0.8;                ///< sampling temperature (0: greedy)
  int64_t sample_seed = 7;                 ///< seed of the sampling generator
};

// ---- data --------------------------------------------------------------------------------

/// The characters of the text, each mapped to a token id (sorted byte order).
struct Vocabulary {
  std::vector<char> chars;             ///< id -> character
  std::array<int64_t, 256> ids{};      ///< character -> id (-1: not in the text)

  /// The distinct characters of `text`.
  explicit Vocabulary(const std::string& text) {
    std::array<bool, 256> seen{};
    for (char c : text) seen[static_cast<unsigned char>(c)] = true;
    ids.fill(-1);
    for (int c = 0; c < 256; ++c)
      if (seen[static_cast<size_t>(c)]) {
        ids[static_cast<size_t>(c)] = static_cast<int64_t>(chars.size());
        chars.push_back(static_cast<char>(c));
      }
  }
  /// Number of tokens.
  [[nodiscard]] int64_t size() const { return static_cast<int64_t>(chars.size()); }
  /// The ids of `text` as an int64 tensor; fails on a character the vocabulary lacks.
  [[nodiscard]] torch::Tensor encode(std::string_view text) const {
    auto out = torch::empty({static_cast<int64_t>(text.size())}, torch::kLong);
    auto* p = out.data_ptr<int64_t>();
    for (size_t i = 0; i < text.size(); ++i) {
      const int64_t id = ids[static_cast<unsigned char>(text[i])];
      loom::check(id >= 0, "the character {:?} is not in the training text", text[i]);
      p[i] = id;
    }
    return out;
  }
};

/// One batch (and, row by row, one example): a block of characters and the next ones.
struct Batch {
  torch::Tensor input_ids;  ///< int64 [N, T] character ids
  torch::Tensor labels;     ///< int64 [N, T] the next character's id, -100 where ignored
};

/// Non-overlapping blocks of `block_size` characters; labels are the inputs shifted by one.
static loom::data::TensorDataset<Batch> make_blocks(const torch::Tensor& ids, int64_t block_size,
                                                    std::optional<int64_t> limit) {
  int64_t n = (ids.size(0) - 1) / block_size;
  if (limit) n = std::min(n, *limit);
  loom::check(n > 0, "{} characters make no block of {} (lower --block_size)", ids.size(0), block_size);
  auto x = ids.narrow(0, 0, n * block_size).view({n, block_size}).clone();
  auto y = ids.narrow(0, 1, n * block_size).view({n, block_size}).clone();
  return loom::data::TensorDataset<Batch>({x, y});
}

// ---- model -------------------------------------------------------------------------------

/// Hyper-parameters of the transformer.
struct GPTConfig {
  int64_t vocab_size = 0;   ///< tokens
  int64_t block_size = 128; ///< longest context (position embeddings)
  int64_t n_layer = 4;      ///< blocks
  int64_t n_head = 4;       ///< heads
  int64_t n_embd = 128;     ///< width
  double dropout = 0.0;     ///< dropout probability
  bool tie_word_embeddings = true;  ///< share the token embedding with the LM head
};

/// Causal multi-head self-attention through torch's fused scaled_dot_product_attention.
struct CausalSelfAttentionImpl : torch::nn::Module {
  /// Projections for `cfg.n_embd` channels in `cfg.n_head` heads.
  explicit CausalSelfAttentionImpl(const GPTConfig& cfg)
      : n_head(cfg.n_head), dropout(cfg.dropout),
        qkv(register_module("qkv", torch::nn::Linear(cfg.n_embd, 3 * cfg.n_embd))),
        proj(register_module("proj", torch::nn::Linear(cfg.n_embd, cfg.n_embd))) {}

  /// [B, T, C] -> [B, T, C]; position t attends to positions <= t.
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
    auto parts = qkv->forward(x).split(C, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head, C / n_head}).transpose(1, 2); };
    auto y = torch::scaled_dot_product_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), {},
                                                 is_training() ? dropout : 0.0, /*is_causal=*/true);
    y = y.transpose(1, 2).contiguous().view({B, T, C});
    return torch::dropout(proj->forward(y), dropout, is_training());
  }

  int64_t n_head;          ///< heads
  double dropout;          ///< dropout probability
  torch::nn::Linear qkv;   ///< query, key and value projections, fused
  torch::nn::Linear proj;  ///< output projection (a residual branch's last layer)
};
TORCH_MODULE(CausalSelfAttention);

/// A pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) with GELU.
struct BlockImpl : torch::nn::Module {
  /// One block of width `cfg.n_embd`, MLP 4x wider.
  explicit BlockImpl(const GPTConfig& cfg)
      : dropout(cfg.dropout),
        ln_1(register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})))),
        attn(register_module("attn", CausalSelfAttention(cfg))),
        ln_2(register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})))),
        fc(register_module("fc", torch::nn::Linear(cfg.n_embd, 4 * cfg.n_embd))),
        fc_proj(register_module("fc_proj", torch::nn::Linear(4 * cfg.n_embd, cfg.n_embd))) {}

  /// [B, T, C] -> [B, T, C].
  torch::Tensor forward(torch::Tensor x) {
    x = x + attn->forward(ln_1->forward(x));
    auto h = fc_proj->forward(torch::gelu(fc->forward(ln_2->forward(x))));
    return x + torch::dropout(h, dropout, is_training());
  }

  double dropout;                ///< dropout probability
  torch::nn::LayerNorm ln_1;     ///< before attention
  CausalSelfAttention attn;      ///< attention
  torch::nn::LayerNorm ln_2;     ///< before the MLP
  torch::nn::Linear fc;          ///< MLP expansion
  torch::nn::Linear fc_proj;     ///< MLP projection (a residual branch's last layer)
};
TORCH_MODULE(Block);

/// GPT: token + position embeddings, pre-LN blocks, final LayerNorm, LM head.
struct GPTImpl : torch::nn::Module {
  /// A freshly initialized model (GPT-2's scheme: N(0, 0.02), residual projections scaled
  /// by 1/sqrt(2 n_layer), zero biases, unit LayerNorms).
  explicit GPTImpl(const GPTConfig& c)
      : cfg(c),
        wte(register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd))),
        wpe(register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})))) {
    loom::check(c.n_embd % c.n_head == 0, "--n_embd {} is not a multiple of --n_head {}", c.n_embd, c.n_head);
    for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(Block(c));
    if (!c.tie_word_embeddings)
      lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
    torch::NoGradGuard no_grad;
    const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
    for (const auto& item : named_parameters()) {
      const auto& name = item.key();
      auto p = item.value();
      if (name.find("ln_") != std::string::npos) continue;  // LayerNorms keep weight 1, bias 0
      if (name.ends_with(".bias")) p.zero_();
      else if (name.ends_with("proj.weight")) p.normal_(0.0, residual_std);
      else p.normal_(0.0, 0.02);
    }
  }

  /// Logits [B, T, vocab] for ids [B, T] (T <= block_size).
  torch::Tensor forward(const torch::Tensor& ids) {
    const int64_t T = ids.size(1);
    loom::check(T <= cfg.block_size, "sequence of {} exceeds block_size {}", T, cfg.block_size);
    auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(ids.device()));
    auto x = torch::dropout(wte->forward(ids) + wpe->forward(pos), cfg.dropout, is_training());
    for (const auto& block : *blocks) x = block->as<BlockImpl>()->forward(x);
    x = ln_f->forward(x);
    return cfg.tie_word_embeddings ? torch::matmul(x, wte->weight.t()) : lm_head->forward(x);
  }

  /// HF's estimate: 6 x (non-embedding parameters) x tokens, for trainer_state's total_flos.
  [[nodiscard]] double floating_point_ops(const Batch& batch) const {
    int64_t n = 0;
    for (const auto& item : named_parameters())
      if (!item.key().starts_with("wte.") && !item.key().starts_with("wpe.")) n += item.value().numel();
    return 6.0 * static_cast<double>(n) * static_cast<double>(batch.input_ids.numel());
  }

  GPTConfig cfg;                ///< the configuration
  torch::nn::Embedding wte;     ///< token embeddings
  torch::nn::Embedding wpe;     ///< position embeddings
  torch::nn::ModuleList blocks; ///< the transformer blocks
  torch::nn::LayerNorm ln_f;    ///< final LayerNorm
  torch::nn::Linear lm_head{nullptr};  ///< untied LM head (null when tied)
};
TORCH_MODULE(GPT);

/// Next-character cross entropy, mean over the labels that are not -100.
static torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}).to(torch::kFloat), labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kMean));
}

// The precision is the one --bf16 / --fp16 name when the run starts (precision::FromArgs).
/// The trainer: token-level loss, token-count normalization under gradient accumulation.
struct CharLMTrainer : loom::Trainer<CharLMTrainer, GPT, loom::precision::FromArgs> {
  using Trainer::Trainer;

  /// Mean next-character cross entropy of the batch; logits [N, T, vocab].
  loom::ModelOutput compute_loss(GPT& model, Batch& batch) {
    auto logits = model->forward(batch.input_ids);
    return {lm_loss(logits, batch.labels), logits};
  }

  /// The tokens that count in the loss: labels != -100.
  int64_t num_items(const Batch& batch) { return batch.labels.ne(-100).sum().template item<int64_t>(); }
};

/// `length` characters continuing `prompt`: greedy when temperature is 0, else sampled.
static std::string generate(GPT& model, const Vocabulary& vocab, const std::string& prompt, int64_t length,
                            double temperature, int64_t seed, torch::Device device) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  auto ids = vocab.encode(prompt.empty() ? std::string("\n") : prompt).unsqueeze(0).to(device);
  std::string out;
  for (int64_t i = 0; i < length; ++i) {
    const int64_t T = ids.size(1);
    auto context = T > model->cfg.block_size ? ids.narrow(1, T - model->cfg.block_size, model->cfg.block_size) : ids;
    auto logits = model->forward(context).select(1, context.size(1) - 1).to(torch::kFloat).cpu();  // [1, vocab]
    torch::Tensor next;
    if (temperature <= 0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      auto probs = torch::softmax(logits / temperature, -1);
      next = torch::multinomial(probs, 1, /*replacement=*/false, gen);
    }
    out.push_back(vocab.chars[static_cast<size_t>(next.item<int64_t>())]);
    ids = torch::cat({ids, next.to(device)}, 1);
  }
  return out;
}

int main(int argc, char** argv) {
  return loom::run_main([&] {
    // This example's defaults; any flag on the command line overrides them. Sized for about
    // 1.75 minutes of training on 2 idle CPU cores (~16k tokens/s): 800 updates of 16 blocks
    // (2048 tokens; the loss sits near 2.3 for the first ~250 updates, then falls). At this
    // budget a peak rate of 3e-3 ends well below 1e-3 (held-out loss 1.84 against 2.17 at
    // 400 x 4096 tokens), and more, smaller updates beat fewer large ones (1.63 at 800 x 2048).
    loom::TrainingArguments defaults;
    defaults.output_dir = "output/char_lm";
    defaults.bf16 = true;
    defaults.learning_rate = 3e-3;
    defaults.weight_decay = 0.1;
    defaults.adam_beta2 = 0.99;
    defaults.lr_scheduler_type = "cosine";
    defaults.warmup_steps = 40;
    defaults.per_device_train_batch_size = 8;
    defaults.per_device_eval_batch_size = 64;
    defaults.gradient_accumulation_steps = 2;
    defaults.max_steps = 800;
    defaults.logging_steps = 100;
    defaults.eval_strategy = "steps";
    defaults.eval_steps = 400;
    defaults.save_strategy = "no";
    defaults.prediction_loss_only = true;
    auto [example, args] = loom::parse_args(argc, argv, ExampleArguments{}, defaults);
    loom::validate(args);  // report bad flags before reading any data
    loom::check(example.eval_fraction > 0 && example.eval_fraction < 1, "--eval_fraction must lie in (0, 1), got {}",
                example.eval_fraction);
    loom::check(example.block_size > 0, "--block_size must be positive, got {}", example.block_size);
    loom::check(example.n_layer > 0, "--n_layer must be positive, got {}", example.n_layer);
    loom::check(example.n_head > 0, "--n_head must be positive, got {}", example.n_head);
    loom::check(example.n_embd > 0 && example.n_embd % example.n_head == 0,
                "--n_embd must be a positive multiple of --n_head {}, got {}", example.n_head, example.n_embd);
    loom::check(example.dropout >= 0 && example.dropout < 1, "--dropout must lie in [0, 1), got {}", example.dropout);
    loom::check(!example.max_train_blocks || *example.max_train_blocks > 0, "--max_train_blocks must be positive, got {}",
                example.max_train_blocks.value_or(0));
    loom::check(!example.max_eval_blocks || *example.max_eval_blocks > 0, "--max_eval_blocks must be positive, got {}",
                example.max_eval_blocks.value_or(0));
    loom::check(example.sample_length >= 0, "--sample_length must not be negative, got {}", example.sample_length);
    loom::check(example.temperature >= 0, "--temperature must not be negative, got {}", example.temperature);

    loom::set_seed(args.seed);
    int64_t verses = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const std::string text = kjv::load_text(example.data_file, example.keep_references, verses);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Vocabulary vocab(text);
    const auto ids = vocab.encode(text);
    if (example.sample_length > 0) (void)vocab.encode(example.sample_prompt);  // fail now, not after training
    const auto n_eval = static_cast<int64_t>(std::ceil(static_cast<double>(ids.size(0)) * example.eval_fraction));
    const int64_t n_train = ids.size(0) - n_eval;
    auto train_set = make_blocks(ids.narrow(0, 0, n_train), example.block_size, example.max_train_blocks);
    auto eval_set = make_blocks(ids.narrow(0, n_train, n_eval), example.block_size, example.max_eval_blocks);
    fmt::print("char_lm: {} characters ({} verses, {} distinct characters) from {} in {:.2f} s\n", text.size(),
               verses, vocab.size(), example.data_file, load_s);
    fmt::print("char_lm: {} training blocks of {} from the first {} characters, {} held-out blocks from the last {}\n",
               train_set.size(), example.block_size, n_train, eval_set.size(), n_eval);

    GPTConfig cfg;
    cfg.vocab_size = vocab.size();
    cfg.block_size = example.block_size;
    cfg.n_layer = example.n_layer;
    cfg.n_head = example.n_head;
    cfg.n_embd = example.n_embd;
    cfg.dropout = example.dropout;
    cfg.tie_word_embeddings = example.tie_word_embeddings;

    struct Outcome {
      loom::TrainOutput train;
      loom::Metrics eval;
      std::string sample;
    };
    auto outcome = [&] {
      GPT model(cfg);
      int64_t params = 0;
      for (const auto& p : model->parameters()) params += p.numel();
      fmt::print("char_lm: GPT with {} layers, {} heads, width {}: {:.2f} M parameters{}\n", cfg.n_layer, cfg.n_head,
                 cfg.n_embd, static_cast<double>(params) / 1e6, args.bf16 ? ", bf16 autocast" : "");
      CharLMTrainer trainer(args, model, train_set, eval_set);
      Outcome o;
      o.train = trainer.train();
      trainer.save_model();  // output_dir/model.safetensors + training_args.json
      trainer.log_metrics("train", o.train.metrics);
      o.eval = trainer.evaluate();
      if (auto loss = o.eval.get("eval_loss")) o.eval.set("eval_perplexity", std::exp(*loss));
      trainer.log_metrics("eval", o.eval);
      trainer.save_metrics("eval", o.eval);
      if (example.sample_length > 0)
        o.sample = generate(trainer.model(), vocab, example.sample_prompt, example.sample_length, example.temperature,
                            example.sample_seed, trainer.device());
      return o;
    }();

    if (auto sps = outcome.train.metrics.get("train_samples_per_second"))
      fmt::print("training throughput: {:.0f} tokens/s\n", *sps * static_cast<double>(example.block_size));
    if (auto ppl = outcome.eval.get("eval_perplexity")) fmt::print("held-out perplexity: {:.3f}\n", *ppl);
    if (example.sample_length > 0)
      fmt::print("***** sample (temperature {}, seed {}) *****\n{}{}\n", example.temperature, example.sample_seed,
                 example.sample_prompt, outcome.sample);
    fmt::print("outputs in {}\n", args.output_dir);
    return 0;
  });
}
