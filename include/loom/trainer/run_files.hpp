#pragma once
// The JSON files a run writes outside checkpoints (HF's save_metrics and save_state), and the
// JSON file helpers the trainer components share.

#include <loom/config/inline.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace loom::detail {

/// Writes `j` (sorted keys, as HF's json.dumps(sort_keys=True)) through a temporary file.
LOOM_INLINE void write_json_file(const std::filesystem::path& path, const nlohmann::json& j, int indent);
/// `<split>_results.json` in `output_dir`, merged into all_results.json (HF's save_metrics).
LOOM_INLINE void save_metrics(const std::filesystem::path& output_dir, const std::string& split, const Metrics& metrics);
/// trainer_state.json in `output_dir` (HF's save_state).
LOOM_INLINE void save_trainer_state(const std::filesystem::path& output_dir, const TrainerState& state);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/run_files.ipp>
#endif
