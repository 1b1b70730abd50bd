#pragma once
// Definitions of checkpoint/folders.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/checkpoint/folders.hpp>
#include <loom/config/paths.hpp>
#include <loom/core/error.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace loom::checkpoint {

namespace detail {

LOOM_INLINE std::optional<int64_t> step_of(std::string_view name) {
  constexpr std::string_view prefix = "checkpoint-";
  if (name.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int64_t step = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc{} || ptr != digits.data() + digits.size()) return std::nullopt;
  return step;
}

LOOM_INLINE void fsync_path(const std::filesystem::path& p, bool directory) {
  const int fd = ::open(p.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  check(fd >= 0, "cannot open {} to flush it: {}", p.string(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  // Some file systems refuse fsync on folders (EINVAL); the data itself is what matters.
  check(rc == 0 || (directory && (saved == EINVAL || saved == EBADF)), "cannot flush {}: {}", p.string(),
        std::strerror(saved));
}

LOOM_INLINE void fsync_tree(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> dirs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_symlink()) continue;
    if (entry.is_directory()) dirs.push_back(entry.path());
    else if (entry.is_regular_file()) fsync_path(entry.path(), false);
  }
  std::sort(dirs.begin(), dirs.end(), [](const auto& a, const auto& b) {
    return std::distance(a.begin(), a.end()) > std::distance(b.begin(), b.end());
  });
  for (const auto& d : dirs) fsync_path(d, true);
  fsync_path(root, true);
}

LOOM_INLINE void rename_or_fail(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  check(!ec, "cannot rename {} to {}: {}", from.string(), to.string(), ec.message());
}

LOOM_INLINE void fault_point(std::string_view point) {
  // Parsed once: "<point>[:<n>][@<rank>]". Counting is per point name, so "rotating:2" is the
  // second rotation of the run.
  struct Spec {
    std::string point;
    int64_t occurrence = 1, seen = 0;
    bool armed = false;
  };
  static Spec spec = [] {
    Spec s;
    const char* env = std::getenv("LOOM_FAULT_POINT");
    if (env == nullptr || *env == '\0') return s;
    std::string text(env);
    if (const auto at = text.find('@'); at != std::string::npos) {
      const char* rank = std::getenv("RANK");
      const bool mine = text.substr(at + 1) == (rank != nullptr ? std::string(rank) : std::string("0"));
      text.resize(at);
      if (!mine) return s;
    }
    if (const auto colon = text.find(':'); colon != std::string::npos) {
      s.occurrence = std::max<int64_t>(1, std::atoll(text.c_str() + colon + 1));
      text.resize(colon);
    }
    s.point = text;
    s.armed = true;
    return s;
  }();
  if (!spec.armed || point != spec.point || ++spec.seen != spec.occurrence) return;
  ::kill(::getpid(), SIGKILL);
}

LOOM_INLINE std::string pid_string() { return std::to_string(static_cast<long long>(::getpid())); }
     
     LOOM_INLINE bool same_path(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea);
  const auto cb = std::filesystem::weakly_canonical(b, eb);
  if (!ea && !eb) return ca == cb;
  return a.lexically_normal() == b.lexically_normal();
}

}  // namespace detail

LOOM_INLINE std::filesystem::path checkpoint_dir(const std::filesystem::path& output_dir, int64_t step) {
  check(step >= 0, "checkpoint step must not be negative, got {}", step);
  return output_dir / (std::string(kCheckpointPrefix) + "-" + std::to_string(step));
}

LOOM_INLINE std::vector<std::filesystem::path> sorted_checkpoints(const std::filesystem::path& output_dir) {
  std::vector<std::pair<int64_t, std::filesystem::path>> found;
  std::error_code ec;
  std::filesystem::directory_iterator it(output_dir, ec), end;
  if (ec) return {};
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const auto step = detail::step_of(it->path().filename().string());
    std::error_code dir_ec;
    if (step && std::filesystem::is_directory(it->path(), dir_ec)) found.emplace_back(*step, it->path());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::filesystem::path> out;
  out.reserve(found.size());
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

LOOM_INLINE std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& output_dir) {
  const auto all = sorted_checkpoints(output_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(*it / kTrainerStateFile, ec)) return *it;
  }
  return std::nullopt;
}

LOOM_INLINE std::filesystem::path temporary_checkpoint_dir(const std::filesystem::path& output_dir, int64_t step,
                                                           const std::string& tag) {
  return output_dir / (".tmp-" + std::string(kCheckpointPrefix) + "-" + std::to_string(step) + "-" + tag);
}

LOOM_INLINE std::filesystem::path begin_checkpoint(const std::filesystem::path& output_dir, int64_t step,
                                                   const std::string& tag) {
  check(step >= 0, "checkpoint step must not be negative, got {}", step);
  std::error_code ec;
  std::filesystem::create_directories(output_dir, ec);
  check(!ec, "cannot create output folder {}: {}", output_dir.string(), ec.message());
  const auto tmp = temporary_checkpoint_dir(output_dir, step, tag);
  std::filesystem::remove_all(tmp, ec);  // our own leftover from an earlier failed attempt
  check(!ec, "cannot remove {}: {}", tmp.string(), ec.message());
  std::filesystem::create_directory(tmp, ec);
  check(!ec, "cannot create {}: {}", tmp.string(), ec.message());
  return tmp;
}

LOOM_INLINE void commit_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir) {
  std::error_code ec;
  check(std::filesystem::is_directory(tmp, ec), "temporary checkpoint folder {} does not exist", tmp.string());
  detail::fsync_tree(tmp);
  detail::fault_point("fsynced");
  const auto parent = final_dir.has_parent_path() ? final_dir.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::exists(std::filesystem::symlink_status(final_dir, ec))) {
    detail::rename_or_fail(tmp, final_dir);
    detail::fault_point("renamed");
    detail::fsync_path(parent, true);
    return;
  }
  // rename(2) cannot replace a non-empty folder: move the old one aside first, delete it last.
  const auto old = parent / (".old-" + final_dir.filename().string() + "-" + detail::pid_string());
  std::filesystem::remove_all(old, ec);
  check(!ec, "cannot remove {}: {}", old.string(), ec.message());
  detail::rename_or_fail(final_dir, old);
  detail::fault_point("old_moved");
  detail::rename_or_fail(tmp, final_dir);
  detail::fault_point("renamed");
  detail::fsync_path(parent, true);
  std::filesystem::remove_all(old, ec);
  check(!ec, "cannot remove {}: {}", old.string(), ec.message());
}

LOOM_INLINE std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& output_dir) {
  const std::string tmp_prefix = ".tmp-" + std::string(kCheckpointPrefix) + "-";
  const std::string old_prefix = ".old-" + std::string(kCheckpointPrefix) + "-";
  const std::string deleting_prefix = ".deleting-" + std::string(kCheckpointPrefix) + "-";
  std::vector<std::filesystem::path> tmps, olds;
  std::error_code ec;
  std::filesystem::directory_iterator it(output_dir, ec), end;
  if (ec) return {};
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const std::string name = it->path().filename().string();
    if (name.rfind(tmp_prefix, 0) == 0 || name.rfind(deleting_prefix, 0) == 0) tmps.push_back(it->path());
    else if (name.rfind(old_prefix, 0) == 0) olds.push_back(it->path());
  }
  std::sort(olds.begin(), olds.end());
  std::vector<std::filesystem::path> removed;
  auto remove = [&](const std::filesystem::path& p) {
    std::error_code rm_ec;
    std::filesystem::remove_all(p, rm_ec);
    check(!rm_ec, "cannot remove {}: {}", p.string(), rm_ec.message());
    removed.push_back(p);
  };
  for (const auto& old : olds) {
    // ".old-checkpoint-<step>-<pid>": the name it had is everything before the last '-'.
    const std::string name = old.filename().string();
    const auto dash = name.rfind('-');
    const std::string original = name.substr(5, dash == std::string::npos || dash < 5 ? std::string::npos : dash - 5);
    const auto target = output_dir / original;
    std::error_code st_ec;
    if (detail::step_of(original) && !std::filesystem::exists(std::filesystem::symlink_status(target, st_ec))) {
      detail::rename_or_fail(old, target);
      detail::fsync_path(output_dir, true);
    } else {
      remove(old);
    }
  }
  std::sort(tmps.begin(), tmps.end());
  for (const auto& tmp : tmps) remove(tmp);
  return removed;
}

LOOM_INLINE std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& output_dir,
                                                                  int64_t save_total_limit,
                                                                  std::optional<std::filesystem::path> best_checkpoint) {
  if (save_total_limit <= 0) return {};
  auto sorted = sorted_checkpoints(output_dir);
  // HF's _sorted_checkpoints bubbles the best checkpoint up to the second-to-last place (not
  // the last: the newest stays last so training can resume from it).
  if (best_checkpoint) {
    const auto found = std::find_if(sorted.begin(), sorted.end(),
                                    [&](const auto& p) { return detail::same_path(p, *best_checkpoint); });
    if (found != sorted.end()) {
      for (auto i = static_cast<std::size_t>(found - sorted.begin()); i + 2 < sorted.size(); ++i)
        std::swap(sorted[i], sorted[i + 1]);
    }
  }
  if (static_cast<int64_t>(sorted.size()) <= save_total_limit) return {};
  // With a limit of 1 and a best checkpoint that is not the newest, HF keeps 2 (best + newest).
  // As in HF, this applies whenever a best checkpoint is set, even one outside output_dir.
  int64_t limit = save_total_limit;
  if (best_checkpoint && limit == 1 && !detail::same_path(sorted.back(), *best_checkpoint)) limit = 2;
  const auto n_delete = std::max<int64_t>(0, static_cast<int64_t>(sorted.size()) - limit);
  std::vector<std::filesystem::path> deleted;
  for (int64_t i = 0; i < n_delete; ++i) {
    // Renamed first: a crash mid-delete leaves a dotted folder for the next cleanup, not a
    // half-deleted checkpoint. HF deletes with ignore_errors=True; loom reports only what it deleted.
    const auto& victim = sorted[static_cast<std::size_t>(i)];
    const auto doomed = output_dir / (".deleting-" + victim.filename().string() + "-" + detail::pid_string());
    std::error_code ec;
    std::filesystem::rename(victim, doomed, ec);
    if (ec) continue;
    detail::fault_point("rotating");
    std::filesystem::remove_all(doomed, ec);
    deleted.push_back(victim);
  }
  return deleted;
}

LOOM_INLINE void validate_checkpoint(const std::filesystem::path& dir) {
  check(path_exists(dir, PathKind::folder, "a checkpoint folder"), "checkpoint folder {} does not exist", dir.string());
  std::string missing;
  if (!path_exists(dir / kModelFile, PathKind::file) && !path_exists(dir / kModelIndexFile, PathKind::file) &&
      !path_exists(dir / kAdapterFile, PathKind::file))
    missing = fmt::format("{} (or {}, a sharded model's, or {}, an adapter's)", kModelFile, kModelIndexFile, kAdapterFile);
  if (!path_exists(dir / kTrainerStateFile, PathKind::file))
    missing += (missing.empty() ? "" : ", ") + std::string(kTrainerStateFile);
  check(missing.empty(), "{} is not a complete checkpoint: missing {}", dir.string(), missing);
}

LOOM_INLINE bool claim_output_dir(const std::filesystem::path& output_dir, int rank, bool candidate,
                                  const std::function<void()>& barrier) {
  auto marks = [&] {
    std::vector<std::pair<std::filesystem::path, int>> found;  // (file, rank)
    std::error_code ec;
    for (std::filesystem::directory_iterator it(output_dir, ec), end; !ec && it != end; it.increment(ec)) {
      const auto name = it->path().filename().string();
      if (name.rfind(kNodeMarkPrefix, 0) != 0) continue;
      int other = -1;
      const auto digits = std::string_view(name).substr(kNodeMarkPrefix.size());
      const auto [end_ptr, parse_ec] = std::from_chars(digits.data(), digits.data() + digits.size(), other);
      found.emplace_back(it->path(), parse_ec == std::errc() && end_ptr == digits.data() + digits.size() ? other : -1);
    }
    return found;
  };
  std::error_code ec;
  if (candidate)  // a mark left by a run that was killed mid-way is not a node of this one
    for (const auto& [file, r] : marks()) std::filesystem::remove(file, ec);
  barrier();  // no stale mark is left
  if (candidate) {
    const bool created = std::filesystem::create_directories(output_dir, ec);
    check(!ec, "cannot create the output folder {}: {}", output_dir.string(), ec.message());
    const auto mark = output_dir / (std::string(kNodeMarkPrefix) + std::to_string(rank));
    const int fd = ::open(mark.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    check(fd >= 0, "cannot create {} (a mark telling which nodes share the output folder): {}", mark.string(),
          std::strerror(errno));
    // The mark says whether this claim made the folder, for the one who tidies up.
    const bool written = !created || ::write(fd, "created", 7) == 7;
    ::close(fd);
    check(written, "cannot write {}: {}", mark.string(), std::strerror(errno));
  }
  barrier();  // every candidate's mark is in its folder
  const auto seen = candidate ? marks() : std::vector<std::pair<std::filesystem::path, int>>{};
  bool lowest = candidate;
  for (const auto& [file, r] : seen)
    if (r >= 0 && r < rank) lowest = false;
  barrier();  // every candidate has looked
  if (lowest) {  // the folder's writer tidies up: no mark stays, nor a folder made for the marks alone
    bool made = false;
    for (const auto& [file, r] : seen) {
      std::ifstream in(file);
      std::string text;
      made = (std::getline(in, text) && text == "created") || made;
      in.close();
      std::filesystem::remove(file, ec);
    }
    if (made) std::filesystem::remove(output_dir, ec);  // only when empty: OutputDirLock then makes it
  }
  return lowest;
}

namespace detail {
struct HeldLock {
  int fd = -1;
  int users = 0;
  std::filesystem::path file;
  bool created = false;  // the lock made the folder
};
inline std::mutex& lock_mutex() {
  static std::mutex m;
  return m;
}
inline std::map<std::string, HeldLock>& held_locks() {
  static std::map<std::string, HeldLock> held;
  return held;
}
}  // namespace detail

LOOM_INLINE OutputDirLock::OutputDirLock(const std::filesystem::path& output_dir) {
  std::error_code ec;
  const bool created = std::filesystem::create_directories(output_dir, ec);
  check(!ec, "cannot create the output folder {}: {}", output_dir.string(), ec.message());
  key_ = std::filesystem::weakly_canonical(output_dir, ec).string();
  if (ec) key_ = std::filesystem::absolute(output_dir).string();
  const std::lock_guard<std::mutex> guard(detail::lock_mutex());
  auto& held = detail::held_locks()[key_];
  if (held.users++ > 0) return;
  held.created = created;
  const auto file = std::filesystem::path(key_) / kLockFile;  // `held` goes when a failure erases it
  held.file = file;
  // Open and lock; when the file was replaced meanwhile (the holder removed it as it ended),
  // the lock is on a file no one else will open: try again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int error = errno;
      detail::held_locks().erase(key_);
      fail("cannot open {} (the output folder's run lock): {}", file.string(), std::strerror(error));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      char buffer[32] = {};
      const auto n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
      ::close(fd);
      const std::string pid = n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : std::string("?");
      detail::held_locks().erase(key_);
      fail("output_dir {} is in use by another run (process {} holds {}); wait for it to end, or give another "
           "--output_dir", output_dir.string(), pid, kLockFile);
    }
    struct stat opened {}, named {};
    if (::fstat(fd, &opened) == 0 && ::stat(file.c_str(), &named) == 0 && opened.st_ino == named.st_ino &&
        opened.st_dev == named.st_dev) {
      const auto pid = std::to_string(::getpid());
      if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
        // The pid is for the message of a second run only; the lock holds without it.
      }
      held.fd = fd;
      return;
    }
    ::close(fd);
  }
  detail::held_locks().erase(key_);
  fail("cannot lock {}: it keeps being replaced", file.string());
}

LOOM_INLINE OutputDirLock::~OutputDirLock() {
  const std::lock_guard<std::mutex> guard(detail::lock_mutex());
  auto it = detail::held_locks().find(key_);
  if (it == detail::held_locks().end() || --it->second.users > 0) return;
  // Removed while still locked, so a run that opens the name next gets a fresh file.
  ::unlink(it->second.file.c_str());
  ::close(it->second.fd);
  if (it->second.created) {
    std::error_code ec;
    std::filesystem::remove(it->first, ec);  // only when empty: nothing was written
  }
  detail::held_locks().erase(it);
}

}  // namespace loom::checkpoint
