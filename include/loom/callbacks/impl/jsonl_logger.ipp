#pragma once
// Definitions of callbacks/jsonl_logger.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/jsonl_logger.hpp>
#include <loom/callbacks/log_file.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/metrics.hpp>
#include <loom/core/state.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

namespace loom {

LOOM_INLINE void JsonlLogger::on_train_begin(const TrainingArguments& args, TrainerState& state, TrainerControl&) {
  ready(state, [&] { open_for(args); });
}

LOOM_INLINE void JsonlLogger::on_log(const TrainingArguments& args, TrainerState& state, TrainerControl&,
                                     const Metrics& logs) {
  if (!ready(state, [&] { open_for(args); })) return;
  auto entry = logs.to_json();
  entry["step"] = state.global_step;
  if (args.run_name && !args.run_name->empty()) entry["run_name"] = *args.run_name;
  write(entry.dump() + '\n');
}

LOOM_INLINE void JsonlLogger::open_for(const TrainingArguments& args) {
  open(std::filesystem::path(args.output_dir) / file_name, Mode::append);
}

}  // namespace loom
