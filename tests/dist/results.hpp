#pragma once
// What the dist tests read back from a worker's output folder (tests/dist/main.cpp's worker):
// the logged values of trainer_state.json and the final weights save_model wrote to
// <out>/result.model. Shared by the dist test files.

#include <loom/checkpoint/safetensors.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace dist_test {

/// The values of `key` in `out`/trainer_state.json's log_history, in order ("loss": every
/// logged training loss).
inline std::vector<double> logged(const std::filesystem::path& out, const std::string& key) {
  std::ifstream in(out / "trainer_state.json");
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  std::vector<double> values;
  for (const auto& e : j.at("log_history"))
    if (e.contains(key)) values.push_back(e.at(key).get<double>());
  return values;
}

/// The final weights the worker saved in `out`/result.model, by name (a LoRA run's adapter).
inline std::map<std::string, torch::Tensor> weights(const std::filesystem::path& out) {
  std::map<std::string, torch::Tensor> m;
  const auto full = out / "result.model" / "model.safetensors";
  for (auto& [k, t] : loom::checkpoint::load_safetensors(std::filesystem::exists(full)
                                                             ? full
                                                             : out / "result.model" / "adapter_model.safetensors"))
    m[k] = t;
  return m;
}

/// The largest relative difference between two runs' final weights (per tensor, by norm).
inline double weight_difference(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto wa = weights(a), wb = weights(b);
  REQUIRE(wa.size() == wb.size());
  double worst = 0;
  for (const auto& [k, t] : wa) {
    REQUIRE(wb.contains(k));
    worst = std::max(worst, ((t - wb.at(k)).norm() / wb.at(k).norm().clamp_min(1e-12)).item<double>());
  }
  return worst;
}

}  // namespace dist_test
