// Optimizers and decay groups: the multi-tensor AdamW paths against libtorch's own
// torch::optim::AdamW, HF's decay/no-decay split, global-norm clipping.
#include <loom/optim/optimizer.hpp>
#include <loom/optim/param_groups.hpp>

#include <doctest/doctest.h>

#include <algorithm>

namespace {
struct TinyImpl : torch::nn::Module {
  TinyImpl()
      : fc(register_module("fc", torch::nn::Linear(4, 8))),
        ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})))),
        out(register_module("out", torch::nn::Linear(8, 2))) {
    scale = register_parameter("scale", torch::ones({2}));
    final_norm = register_module("final_norm", torch::nn::Linear(2, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return final_norm->forward(out->forward(ln->forward(fc->forward(x))) * scale);
  }
  torch::nn::Linear fc;
  torch::nn::LayerNorm ln;
  torch::nn::Linear out;
  torch::nn::Linear final_norm{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Tiny);

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Trains a copy of `init` for `steps` AdamW steps with the given algorithm; returns final params.
std::vector<torch::Tensor> run_loom(Tiny init, loom::optim::Algorithm algo, int steps) {
  auto groups = loom::optim::decay_groups(*init, 0.1);
  loom::optim::OptimizerOptions options;
  options.algorithm = algo;
  loom::optim::Optimizer opt(groups, options);
  torch::manual_seed(3);
  for (int s = 0; s < steps; ++s) {
    auto loss = init->forward(torch::randn({16, 4})).pow(2).mean();
    opt.zero_grad();
    loss.backward();
    opt.step(1e-2);
  }
  std::vector<torch::Tensor> out;
  for (auto& p : init->parameters()) out.push_back(p.detach().clone());
  return out;
}

Tiny clone_of(const Tiny& m) {
  Tiny c;
  auto src = m->parameters();
  auto dst = c->parameters();
  torch::NoGradGuard g;
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  return c;
}
}  // namespace

TEST_CASE("decay groups exclude biases and normalization parameters, as HF") {
  Tiny m;
  const auto names = loom::optim::decay_parameter_names(*m);
  CHECK(contains(names, "fc.weight"));
  CHECK(contains(names, "out.weight"));
  CHECK(contains(names, "scale"));
  CHECK_FALSE(contains(names, "fc.bias"));
  CHECK_FALSE(contains(names, "ln.weight"));  // inside a LayerNorm module
  CHECK_FALSE(contains(names, "ln.bias"));
  CHECK_FALSE(contains(names, "final_norm.weight"));  // a "_norm" name component
  CHECK_FALSE(contains(names, "final_norm.bias"));
  auto groups = loom::optim::decay_groups(*m, 0.01);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].weight_decay == doctest::Approx(0.01));
  CHECK(groups[1].weight_decay == 0.0);
  CHECK(groups[0].params.size() + groups[1].params.size() == m->parameters().size());
}

TEST_CASE("fused and foreach AdamW match libtorch's torch::optim::AdamW with the same groups") {
  torch::manual_seed(0);
  Tiny base;
  auto fused = run_loom(clone_of(base), loom::optim::Algorithm::adamw_fused, 5);
  auto foreach_ = run_loom(clone_of(base), loom::optim::Algorithm::adamw_foreach, 5);

  // Reference: libtorch's per-parameter AdamW with the same two groups.
  Tiny ref = clone_of(base);
  auto groups = loom::optim::decay_groups(*ref, 0.1);
  std::vector<torch::optim::OptimizerParamGroup> ref_groups;
  for (auto& g : groups) {
    auto o = std::make_unique<torch::optim::AdamWOptions>(1e-2);
    o->weight_decay(g.weight_decay).eps(1e-8).betas({0.9, 0.999});
    ref_groups.emplace_back(g.params, std::move(o));
  }
  torch::optim::AdamW ref_opt(ref_groups);
  torch::manual_seed(3);
  for (int s = 0; s < 5; ++s) {
    auto loss = ref->forward(torch::randn({16, 4})).pow(2).mean();
    ref_opt.zero_grad();
    loss.backward();
    ref_opt.step();
  }
  auto expected = ref->parameters();
  REQUIRE(expected.size() == fused.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    CHECK(torch::allclose(fused[i], expected[i], 1e-5, 1e-6));
    CHECK(torch::allclose(foreach_[i], expected[i], 1e-5, 1e-6));
  }
  // And the run moved the weights at all.
  CHECK_FALSE(torch::allclose(fused[0], base->parameters()[0]));
}

TEST_CASE("parameters without gradients are left alone; zero_grad drops gradients") {
  Tiny m;
  auto before = m->out->weight.detach().clone();
  loom::optim::Optimizer opt(loom::optim::decay_groups(*m, 0.0), {});
  m->fc->weight.mutable_grad() = torch::ones_like(m->fc->weight);
  opt.step(0.1);
  CHECK(torch::equal(m->out->weight, before));
  opt.zero_grad();
  CHECK_FALSE(m->fc->weight.grad().defined());
  CHECK_THROWS_AS(loom::optim::algorithm_from_name("adam"), loom::Error);
}

TEST_CASE("clip_grad_norm returns the pre-clip global norm and scales to max_norm") {
  auto a = torch::zeros({3}, torch::requires_grad());
  auto b = torch::zeros({4}, torch::requires_grad());
  a.mutable_grad() = torch::tensor({3.0f, 0.0f, 0.0f});
  b.mutable_grad() = torch::tensor({0.0f, 4.0f, 0.0f, 0.0f});
  auto norm = loom::optim::clip_grad_norm({a, b}, 1.0);
  CHECK(norm.item<double>() == doctest::Approx(5.0));
  const double after = std::sqrt(a.grad().pow(2).sum().item<double>() + b.grad().pow(2).sum().item<double>());
  CHECK(after == doctest::Approx(1.0).epsilon(1e-5));
  // Below the limit nothing changes.
  a.mutable_grad() = torch::tensor({0.3f, 0.0f, 0.0f});
  b.mutable_grad() = torch::tensor({0.0f, 0.4f, 0.0f, 0.0f});
  loom::optim::clip_grad_norm({a, b}, 1.0);
  CHECK(a.grad()[0].item<float>() == doctest::Approx(0.3f));
}

TEST_CASE("clip_grad_norm: a fused group is normed as one tensor, its concatenation, in its first member's place") {
  // Gradients with many digits: the norm of one 2x4096 tensor and that of the two pieces'
  // norms differ in the last bits, which is what the groups are for (transformers' fused experts).
  torch::manual_seed(3);
  std::vector<torch::Tensor> p;
  for (const int64_t n : {5, 4096, 7, 4096}) {
    p.push_back(torch::zeros({n}, torch::requires_grad()));
    p.back().mutable_grad() = torch::randn({n});
  }
  const auto grads = [&] { std::vector<torch::Tensor> g; for (const auto& t : p) g.push_back(t.grad().clone()); return g; }();
  // Group {1, 3}: the norms taken are p0, cat(p1, p3), p2, in that order.
  const auto expected = torch::linalg_vector_norm(
      torch::stack(at::_foreach_norm({grads[0], torch::cat({grads[1], grads[3]}), grads[2]}, 2)), 2);
  const auto norm = loom::optim::clip_grad_norm(p, 1.0, {{1, 3}});
  CHECK(torch::equal(norm, expected));
  const auto coef = torch::clamp_max(1.0 / (expected + 1e-6), 1.0);
  for (std::size_t i = 0; i < p.size(); ++i) CHECK(torch::equal(p[i].grad(), grads[i] * coef));
  // Without the group: each tensor on its own, another float.
  for (std::size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = grads[i].clone();
  const auto unfused = loom::optim::clip_grad_norm(p, 0.0);
  CHECK(torch::equal(unfused, torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2)));
  CHECK_FALSE(torch::equal(unfused, expected));
}
