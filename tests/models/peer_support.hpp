#pragma once
// What the model tests share about their Python peers (tests/models/hf_*.py): the folders a
// peer script makes, once per run, and the tensors of its safetensors files by name.

#include <torch/torch.h>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom_test {

/// The tensors of a safetensors file, in file order (checkpoint::load_safetensors).
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// The tensor called `name` (a test failure when there is none).
inline torch::Tensor named(const NamedTensors& all, const std::string& name) {
  for (const auto& [key, t] : all)
    if (key == name) return t;
  FAIL("no tensor " << name);
  return {};
}

/// `$LOOM_PYTHON tests/models/<script> make <scratch>/models/<folder>`, run once per test run
/// (its output must contain `marker`); the folder, or nullptr without Python (`check` names
/// what is skipped).
inline const std::filesystem::path* peer_made(const std::string& script, const std::string& folder,
                                              std::string_view marker, std::string_view check) {
  static std::map<std::string, std::optional<std::filesystem::path>> made;
  const char* py = python(check);
  if (py == nullptr) return nullptr;
  if (!made.contains(script)) {
    made[script] = std::nullopt;
    const auto d = fresh_dir("models/" + folder);
    const auto path = (source_dir() / "tests/models" / script).string();
    const auto out = run_capture(std::string(py) + " " + path + " make " + d.string() + " 2>&1");
    INFO(out);
    REQUIRE(out.find(marker) != std::string::npos);
    made[script] = d;
  }
  REQUIRE(made[script].has_value());
  return &*made[script];
}

}  // namespace loom_test
