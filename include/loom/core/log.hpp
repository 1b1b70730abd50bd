#pragma once
// Verbosity of loom's own messages (HF's --log_level / --log_level_replica): one level for
// the process, set by the Trainer at start-up, below which messages are dropped. Levels and
// their numbers are Python logging's, as transformers uses them; "passive" leaves the level
// where it is (warning, transformers' default, until something sets it).

#include <loom/config/inline.hpp>
#include <loom/config/training_arguments.hpp>

#include <fmt/format.h>

#include <string_view>

namespace loom {

/// A message's importance (Python logging's numbers).
enum class LogLevel : int { debug = 10, info = 20, warning = 30, error = 40, critical = 50 };

/// The process's level: messages below it are not printed (default: warning).
LOOM_INLINE LogLevel log_level();
/// Whether a message of `level` is printed.
inline bool log_enabled(LogLevel level) { return static_cast<int>(level) >= static_cast<int>(log_level()); }
/// Sets the process's level.
LOOM_INLINE void set_log_level(LogLevel level);
/// The level `name` means (debug, info, warning, error, critical); passive: the current one.
LOOM_INLINE LogLevel parse_log_level(std::string_view name);
/// HF's get_process_log_level: --log_level on a process that logs (`logs`: the main process
/// of the job or, with log_on_each_node, of its node), --log_level_replica on the others.
LOOM_INLINE LogLevel process_log_level(const TrainingArguments& args, bool logs);

namespace detail {
/// Prints "loom: <level>: <message>" to stderr (the type-erased body of log_message).
LOOM_INLINE void vlog(LogLevel level, fmt::string_view format, fmt::format_args args);
}  // namespace detail

/// Prints a {fmt}-formatted message to stderr when `level` reaches the process's level.
template <class... Args>
void log_message(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) detail::vlog(level, format.get(), fmt::make_format_args(args...));
}

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/core/impl/log.ipp>
#endif
