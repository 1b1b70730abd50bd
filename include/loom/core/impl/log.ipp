#pragma once
// Definitions of core/log.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/log.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace loom {

namespace detail {
inline std::atomic<int>& process_level() {
  static std::atomic<int> level{static_cast<int>(LogLevel::warning)};
  return level;
}
}  // namespace detail

LOOM_INLINE LogLevel log_level() { return static_cast<LogLevel>(detail::process_level().load()); }

LOOM_INLINE void set_log_level(LogLevel level) { detail::process_level().store(static_cast<int>(level)); }

LOOM_INLINE LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warning") return LogLevel::warning;
  if (name == "error") return LogLevel::error;
  if (name == "critical") return LogLevel::critical;
  return log_level();  // passive (validate() refuses other names)
}

LOOM_INLINE LogLevel process_log_level(const TrainingArguments& args, bool logs) {
  return parse_log_level(logs ? args.log_level : args.log_level_replica);
}

namespace detail {
LOOM_INLINE void vlog(LogLevel level, fmt::string_view format, fmt::format_args args) {
  const char* name = level == LogLevel::debug     ? "debug"
                     : level == LogLevel::info    ? "info"
                     : level == LogLevel::warning ? "warning"
                     : level == LogLevel::error   ? "error"
                                                  : "critical";
  const std::string line = fmt::format("loom: {}: {}\n", name, fmt::vformat(format, args));
  std::fputs(line.c_str(), stderr);
}
}  // namespace detail

}  // namespace loom
