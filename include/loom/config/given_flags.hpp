#pragma once
// GivenFlags: the settings a parse set explicitly (a command-line flag, or a key of the JSON
// settings file), so that start-up can tell `--lr_scheduler_type linear` (linear being the
// default) from no flag at all. A reflected struct may hold one as a field, as
// TrainingArguments::given does; reflection skips such a field (no flag, no --help line, no
// JSON key, not written by to_json) and loom::parse_args / parse_json_file fill it:
//
//   if (args.given.contains("lr_scheduler_type")) ...

#include <loom/config/inline.hpp>

#include <string>
#include <string_view>
#include <vector>

namespace loom {

/// The field names a parse set explicitly (flags, keys of a JSON settings file): sorted, each once.
class GivenFlags {
 public:
  /// True when the setting `name` (its field name, e.g. "lr_scheduler_type") was given.
  [[nodiscard]] LOOM_INLINE bool contains(std::string_view name) const;
  /// Records `name` as given (once, in sorted place).
  LOOM_INLINE void insert(std::string_view name);
  /// The names given, sorted.
  [[nodiscard]] const std::vector<std::string>& names() const { return names_; }
  /// True when nothing was given.
  [[nodiscard]] bool empty() const { return names_.empty(); }
  /// Records `name` as a transformers.TrainingArguments setting a JSON settings file gave at
  /// HF's default, which loom has no flag for and no use of (sorted, once; the Trainer lists
  /// them at info level at start-up).
  LOOM_INLINE void insert_ignored(std::string_view name);
  /// The settings insert_ignored recorded, sorted.
  [[nodiscard]] const std::vector<std::string>& ignored() const { return ignored_; }
  /// True once apply_launcher_configs has read --deepspeed / --fsdp onto these arguments'
  /// flags: it reads them once, whoever calls it again (validate, finalize, the selector).
  [[nodiscard]] bool launcher_configs_applied() const { return launcher_configs_applied_; }
  /// Records that apply_launcher_configs has run (apply_launcher_configs' own call).
  void mark_launcher_configs_applied() { launcher_configs_applied_ = true; }
  /// Same names (the bookkeeping of apply_launcher_configs aside).
  bool operator==(const GivenFlags& other) const { return names_ == other.names_ && ignored_ == other.ignored_; }

 private:
  std::vector<std::string> names_;
  std::vector<std::string> ignored_;
  bool launcher_configs_applied_ = false;
};

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/given_flags.ipp>
#endif
