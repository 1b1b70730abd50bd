#pragma once
#include <loom/config/json_io.hpp>
#include <loom/core/error.hpp>
#include <loom/trainer/run_files.hpp>

#include <fstream>

namespace loom::detail {

LOOM_INLINE void save_metrics(const std::filesystem::path& dir, const std::string& split, const Metrics& metrics) {
  std::filesystem::create_directories(dir);
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : metrics) j[k] = v;
  write_json_file(dir / (split + "_results.json"), j, 4);
  nlohmann::json all = nlohmann::json::object();
  if (std::filesystem::exists(dir / "all_results.json")) {
    std::ifstream in(dir / "all_results.json");
    all = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!all.is_object()) all = nlohmann::json::object();
  }
  all.update(j);
  write_json_file(dir / "all_results.json", all, 4);
}

LOOM_INLINE void save_trainer_state(const std::filesystem::path& dir, const TrainerState& state) {
  std::filesystem::create_directories(dir);
  write_json_file(dir / "trainer_state.json", nlohmann::json(state.to_json()), 2);
}

}  // namespace loom::detail
