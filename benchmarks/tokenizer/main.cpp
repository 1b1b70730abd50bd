// benchmarks/tokenizer: tokens per second of loom's tokenizer (loom/data/tokenizer.hpp) on one
// thread, encoding the KJV verses one at a time. benchmarks/tokenizer/run.py runs it beside the
// `tokenizers` package on the same tokenizer.json files and lines.
//
//   build/benchmarks/tokenizer --tokenizer data/kjv/tokenizer.json --text kjv.txt
//   build/benchmarks/tokenizer --tokenizer t.json --text kjv.txt --rounds 5
//   build/benchmarks/tokenizer --tokenizer t.json --text spaces.txt --whole   (one long text)
//
// The text file holds one text per line (build/examples/kjv_text's output); the figure is the
// ids made over the best of `rounds` passes (a pass encodes every line; the first pass also
// fills the BPE's word cache, as tokenizers' own cache is filled by its warm-up). One JSON
// line on stdout: tokens, seconds, tokens_per_s, texts.

#include <loom/config/cli.hpp>
#include <loom/core/error.hpp>
#include <loom/data/tokenizer.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace {

struct BenchArguments {
  std::string tokenizer;  ///< a tokenizer.json, or the folder holding one
  std::string text;       ///< one text per line
  int64_t rounds = 3;     ///< timed passes over the lines (the best is reported)
  bool whole = false;     ///< the whole file is one text (a long pre-token: BPE's merges on 1 MB)
};

}  // namespace

int main(int argc, char** argv) try {
  const auto b = loom::parse_args<BenchArguments>(argc, argv);
  loom::check(!b.tokenizer.empty() && !b.text.empty(), "tokenizer benchmark: --tokenizer and --text are required");
  const auto tok = loom::data::Tokenizer::from_file(b.tokenizer);
  std::ifstream in(b.text);
  loom::check(in.good(), "cannot read {}", b.text);
  std::vector<std::string> lines;
  if (b.whole)
    lines.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  else
    for (std::string line; std::getline(in, line);)
      if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
  (void)tok.encode_batch(std::span<const std::string>(lines.data(), std::min<std::size_t>(lines.size(), 2000)));
  double best = 1e30;
  std::size_t tokens = 0;
  for (int64_t r = 0; r < std::max<int64_t>(b.rounds, 1); ++r) {
    tokens = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const std::string& line : lines) tokens += tok.encode(line).size();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  fmt::print("{{\"tokens\": {}, \"seconds\": {:.4f}, \"tokens_per_s\": {:.1f}, \"texts\": {}}}\n", tokens, best,
             static_cast<double>(tokens) / best, lines.size());
  return 0;
} catch (const loom::Error& e) {
  fmt::print(stderr, "{}\n", e.what());
  return 2;
}
