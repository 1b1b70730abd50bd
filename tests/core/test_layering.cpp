// The dependency rule of docs/architecture.md, checked on the real headers:
//   policy <- config <- core <- {precision, schedule, optim, distributed, data,
//                                checkpoint, metrics, callbacks} <- peft <- {accelerate, models} <- trainer
//   <- methods
// A header (or its impl/*.ipp) may include its own folder and folders to its left; the
// braced folders never include each other.
#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>

namespace {
int rank_of(const std::string& folder) {
  static const std::map<std::string, int> ranks{
      {"policy", 0},   {"config", 1},      {"core", 2},  {"precision", 3}, {"schedule", 3},
      {"optim", 3},    {"distributed", 3}, {"data", 3},    {"checkpoint", 3}, {"metrics", 3},
      {"callbacks", 3}, {"accelerate", 5}, {"models", 5},  {"peft", 4}, {"trainer", 6},
      {"methods", 7},   {"loom.hpp", 8}};
  auto it = ranks.find(folder);
  return it == ranks.end() ? -1 : it->second;
}
}  // namespace

TEST_CASE("headers include only their own layer and the layers below") {
  const std::filesystem::path root = loom_test::source_dir() / "include" / "loom";
  const std::regex include_re(R"(^\s*#\s*include\s*<loom/([A-Za-z_.]+)(/[^>]*)?>)");
  int headers = 0, includes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    // Headers and the impl/*.ipp files they include (compiled once under LOOM_SEPARATE_COMPILATION).
    const auto ext = entry.path().extension();
    if (!entry.is_regular_file() || (ext != ".hpp" && ext != ".ipp")) continue;
    ++headers;
    const auto rel = std::filesystem::relative(entry.path(), root);
    const std::string from = rel.begin()->string();
    const int from_rank = rank_of(from);
    INFO("header " << rel.string());
    REQUIRE(from_rank >= 0);  // every folder is placed in the rule
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      ++includes;
      const std::string to = m[1].str();
      const int to_rank = rank_of(to);
      INFO("includes loom/" << to);
      REQUIRE(to_rank >= 0);
      if (to == from) continue;
      CHECK(to_rank < from_rank);
    }
  }
  CHECK(headers > 20);
  CHECK(includes > 40);
}

TEST_CASE("the Trainer's front end stays within 500 lines (docs/architecture.md)") {
  std::ifstream in(loom_test::source_dir() / "include" / "loom" / "trainer" / "trainer.hpp");
  REQUIRE(in.good());
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  CHECK(lines > 100);
  CHECK(lines <= 500);
}
