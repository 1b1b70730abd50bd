// Activation recomputation (distributed/checkpointed.hpp): the gradients of a recomputed
// forward equal the plain ones (dropout on: the RNG state is replayed), through
// FullShardUnit's switch and the standalone Checkpointed, and on GPT-2's blocks.
#include <doctest/doctest.h>

#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/full_shard_unit.hpp>
#include <loom/models/gpt2.hpp>

#include "support.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ckpt_test {

// Linear -> GELU -> Dropout(0.1) -> Linear with a residual; counts its forward calls.
struct ResBlockImpl : torch::nn::Module {
  explicit ResBlockImpl(int64_t width)
      : a(register_module("a", torch::nn::Linear(width, 4 * width))),
        b(register_module("b", torch::nn::Linear(4 * width, width))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    return x + b->forward(drop->forward(torch::gelu(a->forward(x))));
  }
  torch::nn::Linear a, b;
  torch::nn::Dropout drop;
  int calls = 0;
};
TORCH_MODULE(ResBlock);

// A block of several arguments: a tensor that needs no gradient and a number.
struct MaskedBlockImpl : torch::nn::Module {
  explicit MaskedBlockImpl(int64_t width) : lin(register_module("lin", torch::nn::Linear(width, width))) {}
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& mask, double scale) {
    return x + scale * torch::dropout(torch::tanh(lin->forward(x)), 0.2, is_training()) * mask;
  }
  torch::nn::Linear lin;
};
TORCH_MODULE(MaskedBlock);

// Three blocks, each wrapped in W (FullShardUnit or Checkpointed), under "h.{i}".
template <class W>
struct StackImpl : torch::nn::Module {
  explicit StackImpl(int64_t width) : h(register_module("h", torch::nn::ModuleList())) {
    for (int i = 0; i < 3; ++i) {
      blocks.push_back(W(ResBlock(width)));
      h->push_back(blocks.back());
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& blk : blocks) x = blk->forward(x);
    return x;
  }
  torch::nn::ModuleList h;
  std::vector<W> blocks;
};

// The gradients of one training step from `seed`: the parameters' by name, then the input's;
// and a number drawn after backward (the RNG stream must continue as without recomputation).
struct Step {
  std::vector<std::pair<std::string, torch::Tensor>> grads;
  torch::Tensor next_draw;
};
template <class Model, class Loss>
Step step(Model& model, const torch::Tensor& input, uint64_t seed, Loss loss) {
  for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(seed);
  auto x = input.detach().clone().requires_grad_(true);
  loss(x).backward();
  Step s;
  for (const auto& p : model->named_parameters()) {
    REQUIRE(p.value().grad().defined());
    s.grads.emplace_back(p.key(), p.value().grad().clone());
  }
  s.grads.emplace_back("<input>", x.grad().clone());
  s.next_draw = torch::rand({4});
  return s;
}

double max_diff(const Step& a, const Step& b) {
  REQUIRE(a.grads.size() == b.grads.size());
  double worst = (a.next_draw - b.next_draw).abs().max().item<double>();
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO(a.grads[i].first);
    REQUIRE(a.grads[i].first == b.grads[i].first);
    worst = std::max(worst, (a.grads[i].second - b.grads[i].second).abs().max().item<double>());
  }
  return worst;
}

template <class W>
void check_stack() {
  torch::manual_seed(3);
  auto model = std::make_shared<StackImpl<W>>(8);
  model->train();
  const auto input = torch::randn({5, 8});
  auto loss = [&](const torch::Tensor& x) { return model->forward(x).pow(2).sum(); };

  CHECK(loom::disable_gradient_checkpointing(*model) == (std::is_same_v<W, loom::Checkpointed<ResBlock>> ? 3 : 0));
  const auto plain = step(model, input, 7, loss);
  CHECK(model->blocks[0]->inner()->calls == 1);
  CHECK(loom::enable_gradient_checkpointing(*model) == 3);
  const auto recomputed = step(model, input, 7, loss);
  CHECK(model->blocks[0]->inner()->calls == 3);  // the forward, then once more in backward
  CHECK(max_diff(plain, recomputed) <= 1e-6);
  // Dropout is on: another seed gives other gradients, so the equality above is the RNG replay.
  const auto other = step(model, input, 8, loss);
  CHECK(max_diff(recomputed, other) > 1e-3);

  // In evaluation, and under no-grad, the block only forwards.
  model->eval();
  const int before = model->blocks[0]->inner()->calls;
  model->forward(input.clone().requires_grad_(true)).sum().backward();
  {
    torch::NoGradGuard no_grad;
    model->train();
    model->forward(input);
  }
  CHECK(model->blocks[0]->inner()->calls == before + 2);
}

}  // namespace ckpt_test

TEST_CASE("gradient checkpointing: a FullShardUnit stack's gradients equal the plain ones, dropout on") {
  ckpt_test::check_stack<loom::FullShardUnit<ckpt_test::ResBlock>>();
}

TEST_CASE("gradient checkpointing: loom::Checkpointed gives the plain gradients, names unchanged") {
  ckpt_test::check_stack<loom::Checkpointed<ckpt_test::ResBlock>>();
  ckpt_test::ResBlock plain(4);
  auto wrapped = loom::checkpointed(ckpt_test::ResBlock(4));
  CHECK(wrapped->loom_recompute);
  std::vector<std::string> a, b;
  for (const auto& p : plain->named_parameters()) a.push_back(p.key());
  for (const auto& p : wrapped->named_parameters()) b.push_back(p.key());
  CHECK(a == b);
}

TEST_CASE("gradient checkpointing: several arguments, an input without gradient, parameters still get theirs") {
  torch::manual_seed(5);
  auto block = loom::checkpointed(ckpt_test::MaskedBlock(6));
  block->train();
  const auto x0 = torch::randn({4, 6});
  const auto mask = (torch::rand({4, 6}) > 0.3).to(torch::kFloat);
  auto run = [&](bool recompute, bool input_grad) {
    block->loom_recompute = recompute;
    for (auto& p : block->parameters()) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(9);
    auto x = x0.clone().requires_grad_(input_grad);
    block->forward(x, mask, 0.5).pow(2).sum().backward();
    std::vector<torch::Tensor> g;
    for (auto& p : block->parameters()) g.push_back(p.grad().clone());
    if (input_grad) g.push_back(x.grad().clone());
    return g;
  };
  for (bool input_grad : {true, false}) {
    INFO("input requires grad: " << input_grad);
    const auto plain = run(false, input_grad);
    const auto recomputed = run(true, input_grad);
    REQUIRE(plain.size() == recomputed.size());
    for (std::size_t i = 0; i < plain.size(); ++i) CHECK((plain[i] - recomputed[i]).abs().max().item<double>() <= 1e-6);
  }
}

TEST_CASE("gradient checkpointing: a Checkpointed inside a unit is switched off, a model without wrappers counts 0") {
  struct OuterImpl : torch::nn::Module {
    OuterImpl() : unit(register_module("unit", loom::FullShardUnit<loom::Checkpointed<ckpt_test::ResBlock>>(
                                                    loom::checkpointed(ckpt_test::ResBlock(4))))) {}
    loom::FullShardUnit<loom::Checkpointed<ckpt_test::ResBlock>> unit;
  };
  OuterImpl outer;
  CHECK(outer.unit->inner()->loom_recompute);
  CHECK(loom::enable_gradient_checkpointing(outer) == 1);
  CHECK(outer.unit->loom_recompute);
  CHECK_FALSE(outer.unit->inner()->loom_recompute);
  CHECK(loom::disable_gradient_checkpointing(outer) == 1);
  CHECK_FALSE(outer.unit->loom_recompute);

  torch::nn::Sequential none(torch::nn::Linear(3, 3), torch::nn::ReLU());
  CHECK(loom::enable_gradient_checkpointing(*none) == 0);
}

TEST_CASE("gradient checkpointing: GPT-2 with its blocks recomputed gives the same gradients") {
  loom::models::GPT2Config c;
  c.vocab_size = 64;
  c.n_positions = 16;
  c.n_embd = 32;
  c.n_layer = 3;
  c.n_head = 4;  // dropout 0.1 everywhere, as HF's default
  torch::manual_seed(1);
  loom::models::GPT2LMHeadModel model(c);
  model->train();
  const auto ids = torch::randint(c.vocab_size, {3, 12});
  const loom::data::CausalLMBatch batch{ids, ids};
  auto grads = [&](uint64_t seed) {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();
    torch::manual_seed(seed);
    const auto out = model->forward(batch);
    out.loss.backward();
    std::vector<std::pair<std::string, torch::Tensor>> g;
    for (const auto& p : model->named_parameters()) g.emplace_back(p.key(), p.value().grad().clone());
    return std::make_pair(out.loss.item<double>(), g);
  };
  const auto plain = grads(4);
  CHECK(loom::enable_gradient_checkpointing(*model) == 3);
  const auto recomputed = grads(4);
  CHECK(plain.first == doctest::Approx(recomputed.first).epsilon(1e-12));
  REQUIRE(plain.second.size() == recomputed.second.size());
  double worst = 0;
  for (std::size_t i = 0; i < plain.second.size(); ++i) {
    INFO(plain.second[i].first);
    CHECK(plain.second[i].first == recomputed.second[i].first);
    worst = std::max(worst, (plain.second[i].second - recomputed.second[i].second).abs().max().item<double>());
  }
  CHECK(worst <= 1e-6);
  // Dropout matters here (another seed moves the gradients), so the RNG replay is exercised.
  const auto other = grads(5);
  CHECK((other.second[0].second - recomputed.second[0].second).abs().max().item<double>() > 1e-6);
}
