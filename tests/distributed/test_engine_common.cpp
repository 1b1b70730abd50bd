// What the sharding engines share (distributed/engine_common.hpp): graph_leaves, the walk of
// a loss's autograd graph that --ddp_find_unused_parameters runs before backward. It must
// find exactly the parameters backward accumulates a gradient into.
#include <doctest/doctest.h>

#include <loom/distributed/checkpointed.hpp>
#include <loom/distributed/engine_common.hpp>

#include <set>
#include <string>

namespace leaves_test {

// `used` always, `shared` twice, `frozen` under no-grad, `detached` through detach(),
// `unused` never.
struct LeavesNetImpl : torch::nn::Module {
  LeavesNetImpl()
      : used(register_module("used", torch::nn::Linear(4, 4))),
        shared(register_module("shared", torch::nn::Linear(4, 4))),
        frozen(register_module("frozen", torch::nn::Linear(4, 4))),
        detached(register_module("detached", torch::nn::Linear(4, 4))),
        unused(register_module("unused", torch::nn::Linear(4, 4))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor f;
    {
      torch::NoGradGuard no_grad;
      f = frozen->forward(x);
    }
    auto h = shared->forward(shared->forward(used->forward(x)));
    return h + f + detached->forward(x).detach();
  }
  torch::nn::Linear used, shared, frozen, detached, unused;
};
TORCH_MODULE(LeavesNet);

// The names of `module`'s parameters that are in `leaves`.
std::set<std::string> names_in(torch::nn::Module& module, const std::unordered_set<const c10::TensorImpl*>& leaves) {
  std::set<std::string> out;
  for (const auto& p : module.named_parameters())
    if (leaves.contains(p.value().unsafeGetTensorImpl())) out.insert(p.key());
  return out;
}

// The names of the parameters that got a gradient from `loss`.
std::set<std::string> with_grad(torch::nn::Module& module, const torch::Tensor& loss) {
  for (auto& p : module.parameters()) p.mutable_grad() = torch::Tensor();
  loss.backward();
  std::set<std::string> out;
  for (const auto& p : module.named_parameters())
    if (p.value().grad().defined()) out.insert(p.key());
  return out;
}

}  // namespace leaves_test

TEST_CASE("graph_leaves finds the parameters backward reaches: not those unused, under no-grad or detached") {
  torch::manual_seed(0);
  leaves_test::LeavesNet net;
  const auto loss = net->forward(torch::randn({3, 4})).sum();
  const auto found = leaves_test::names_in(*net, loom::dist::detail::graph_leaves(loss));
  CHECK(found == std::set<std::string>{"used.weight", "used.bias", "shared.weight", "shared.bias"});
  CHECK(found == leaves_test::with_grad(*net, loss));

  // A loss that is a leaf itself, and one that needs no gradient.
  auto leaf = torch::ones({1}, torch::requires_grad());
  const auto self = loom::dist::detail::graph_leaves(leaf);
  CHECK(self.size() == 1);
  CHECK(self.contains(leaf.unsafeGetTensorImpl()));
  CHECK(loom::dist::detail::graph_leaves(torch::ones({1})).empty());
  CHECK(loom::dist::detail::graph_leaves(torch::Tensor()).empty());
}

TEST_CASE("graph_leaves reaches the parameters of a recomputed block (loom::Checkpointed)") {
  // The recomputation node takes the block's parameters as inputs, so the walk sees them
  // before backward runs the block again.
  torch::manual_seed(0);
  auto block = loom::checkpointed(torch::nn::Linear(4, 4));
  auto other = torch::nn::Linear(4, 4);
  const auto x = torch::randn({3, 4}, torch::requires_grad());
  const auto loss = block->forward(x).sum();
  const auto leaves = loom::dist::detail::graph_leaves(loss);
  for (const auto& p : block->parameters()) CHECK(leaves.contains(p.unsafeGetTensorImpl()));
  for (const auto& p : other->parameters()) CHECK_FALSE(leaves.contains(p.unsafeGetTensorImpl()));
  CHECK(leaves.contains(x.unsafeGetTensorImpl()));
  CHECK(leaves.size() == 3);
}
