#pragma once
// Token files written by the tests themselves (no Python): a flat uint16 file and a ragged
// one (ids, uint64 offsets, int64 labels), as examples/text_data/prepare.py writes them.

#include <loom/data/token_file.hpp>

#include "../support.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace loom_test {

/// The little-endian bytes of `values`, each cast to T.
template <class T, class V>
std::string le_bytes(const std::vector<V>& values) {
  std::string out;
  for (const V v : values) {
    const auto u = static_cast<T>(v);
    for (std::size_t b = 0; b < sizeof(T); ++b) out.push_back(static_cast<char>((static_cast<uint64_t>(u) >> (8 * b)) & 0xff));
  }
  return out;
}

/// Writes `sequences` as the ragged files <dir>/<name>.{bin,offsets,labels} (uint16 ids);
/// `labels` may be empty (no labels file).
inline loom::data::RaggedTokenFiles write_ragged(const std::filesystem::path& dir, const std::string& name,
                                                 const std::vector<std::vector<int64_t>>& sequences,
                                                 const std::vector<int64_t>& labels) {
  std::vector<int64_t> ids;
  std::vector<uint64_t> offsets{0};
  for (const auto& s : sequences) {
    ids.insert(ids.end(), s.begin(), s.end());
    offsets.push_back(ids.size());
  }
  loom::data::RaggedTokenFiles files{dir / (name + ".bin"), dir / (name + ".offsets"), {}};
  write_bytes(files.ids, le_bytes<uint16_t>(ids));
  write_bytes(files.offsets, le_bytes<uint64_t>(offsets));
  if (!labels.empty()) {
    files.labels = dir / (name + ".labels");
    write_bytes(files.labels, le_bytes<int64_t>(labels));
  }
  return files;
}

}  // namespace loom_test
