#pragma once
// Definitions of callbacks/log_file.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/callbacks/log_file.hpp>
#include <loom/config/training_arguments.hpp>
#include <loom/core/error.hpp>
#include <loom/core/state.hpp>

#include <filesystem>
#include <fstream>
#include <ios>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace loom {

LOOM_INLINE void LogFile::on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) { close(); }

LOOM_INLINE void LogFile::close() {
  if (out_.is_open()) out_.close();
}

LOOM_INLINE void LogFile::open(std::filesystem::path path, Mode mode, std::string_view kind) {
  path_ = std::move(path);
  std::error_code ec;
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path(), ec);
  out_.open(path_, mode == Mode::append ? std::ios::out | std::ios::app
                                        : std::ios::out | std::ios::binary | std::ios::trunc);
  if (out_) return;
  out_ = std::ofstream();
  fail("cannot {} {}{}{}{}", mode == Mode::append ? "open" : "create", kind, path_.string(),
       mode == Mode::append ? " for appending" : "", ec ? " (" + ec.message() + ")" : std::string());
}

LOOM_INLINE void LogFile::write(std::string_view bytes) {
  out_.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out_.flush();
  check(static_cast<bool>(out_), "cannot write {}", path_.string());
}

}  // namespace loom
