#pragma once
// Definitions of config/paths.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/error.hpp>
#include <loom/config/paths.hpp>

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace loom {

namespace detail {

inline std::string with_hint(std::string message, std::string_view hint) {
  if (!hint.empty()) message += " (" + std::string(hint) + ")";
  return message;
}

}  // namespace detail

LOOM_INLINE bool path_exists(const std::filesystem::path& path, PathKind kind, std::string_view hint) {
  namespace fs = std::filesystem;
  const std::string name = path.string();
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec) {
    const int code = ec.value();
    if (code == ENOENT || code == ENOTDIR) return false;
    if (code == ELOOP)
      throw Error(detail::with_hint("loom: " + name + " cannot be reached: too many levels of symbolic links "
                                    "(a symlink loop)", hint));
    if (code == EACCES || code == EPERM)
      throw Error(detail::with_hint("loom: " + name + " cannot be reached: permission denied on a folder on the way",
                                    hint));
    throw Error(detail::with_hint("loom: " + name + " cannot be reached: " + ec.message(), hint));
  }
  if (st.type() == fs::file_type::not_found) return false;
  const bool folder = st.type() == fs::file_type::directory;
  const bool file = st.type() == fs::file_type::regular;
  if (kind == PathKind::folder && file) throw Error(detail::with_hint("loom: " + name + " is a file, not a folder", hint));
  if (kind == PathKind::file && folder) throw Error(detail::with_hint("loom: " + name + " is a folder, not a file", hint));
  if (!folder && !file)
    throw Error(detail::with_hint("loom: " + name + " is neither a file nor a folder (a device, socket or pipe)", hint));
  // A folder must be listed and entered, a file read.
  if (::access(path.c_str(), folder ? (R_OK | X_OK) : R_OK) != 0 && (errno == EACCES || errno == EPERM))
    throw Error(detail::with_hint("loom: " + name + ": permission denied (the " + (folder ? "folder" : "file") +
                                      " cannot be " + (folder ? "listed" : "read") + ")",
                                  hint));
  return true;
}

LOOM_INLINE void check_path(const std::filesystem::path& path, PathKind kind, std::string_view hint) {
  if (!path_exists(path, kind, hint)) throw Error(detail::with_hint("loom: " + path.string() + " does not exist", hint));
}

}  // namespace loom
