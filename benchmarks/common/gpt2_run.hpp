#pragma once
// What the CPU benchmarks on a random GPT-2 share (checkpointing, eval_memory): the model's
// config from a few sizes, and running one configuration in a process of its own (the program
// starts itself with the internal flags that select it, so no run inherits another's heap) and
// reading back the figures it wrote.

#include <loom/loom.hpp>
#include <loom/models/gpt2.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

/// A random GPT-2 of `layers` blocks, hidden size `n_embd` (heads of 64), `block` positions.
inline loom::models::GPT2Config gpt2_config(int64_t vocab, int64_t block, int64_t n_embd, int64_t layers) {
  loom::models::GPT2Config c;
  c.vocab_size = vocab;
  c.n_positions = block;
  c.n_embd = n_embd;
  c.n_layer = layers;
  c.n_head = std::max<int64_t>(1, n_embd / 64);
  return c;
}

/// Runs this program again as `argv[0] <internal> --result <result> <argv[1..]>` and returns
/// the `count` numbers the run wrote to `result`; `what` names the run in the error.
inline std::vector<double> run_in_own_process(int argc, char** argv, const std::string& internal,
                                              const std::string& result, std::size_t count, const std::string& what) {
  std::string cmd = fmt::format("'{}' {} --result '{}'", argv[0], internal, result);
  for (int i = 1; i < argc; ++i) cmd += fmt::format(" '{}'", argv[i]);
  std::fflush(stdout);
  loom::check(std::system(cmd.c_str()) == 0, "the {} run failed: {}", what, cmd);
  std::vector<double> figures(count);
  std::ifstream in(result);
  for (auto& f : figures) loom::check(static_cast<bool>(in >> f), "too few figures in {}", result);
  return figures;
}

}  // namespace bench
