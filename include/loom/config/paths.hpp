#pragma once
// The one check of a path a user hands over (a model folder, a data folder, a settings file,
// a checkpoint): std::filesystem's error codes turned into one `loom:` line that names the
// path and the problem (a symlink loop, a permission, a file where a folder belongs and the
// other way round), instead of a filesystem_error escaping a reader. Every reader of
// user-given folders and files goes through it before it opens anything.

#include <loom/config/inline.hpp>

#include <filesystem>
#include <string_view>

namespace loom {

/// What a path must be.
enum class PathKind { file, folder };

/// True when `path` is a `kind` that can be read; false when nothing is there (a missing
/// entry, or a parent that is missing or a file). Every other case is a loom::Error naming the
/// path: a symlink loop, no permission to reach or read it, the other kind (a folder where a
/// file belongs: "is a folder, not a file"), or another entry (a socket, a device). `hint`,
/// when not empty, is added in parentheses (what the path should hold).
LOOM_INLINE bool path_exists(const std::filesystem::path& path, PathKind kind, std::string_view hint = {});

/// path_exists, with a missing path a loom::Error too: "<path> does not exist (<hint>)".
LOOM_INLINE void check_path(const std::filesystem::path& path, PathKind kind, std::string_view hint = {});

}  // namespace loom

#if defined(LOOM_HEADER_ONLY)
#include <loom/config/impl/paths.ipp>
#endif
