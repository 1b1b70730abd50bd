#pragma once
// The JSON files a run writes outside checkpoints (HF's save_metrics and save_state), through
// config/json_io.hpp's atomic writer.

#include <loom/config/inline.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace loom::detail {

/// `<split>_results.json` in `output_dir`, merged into all_results.json (HF's save_metrics).
LOOM_INLINE void save_metrics(const std::filesystem::path& output_dir, const std::string& split, const Metrics& metrics);
/// trainer_state.json in `output_dir` (HF's save_state).
LOOM_INLINE void save_trainer_state(const std::filesystem::path& output_dir, const TrainerState& state);

}  // namespace loom::detail

#if defined(LOOM_HEADER_ONLY)
#include <loom/trainer/impl/run_files.ipp>
#endif
