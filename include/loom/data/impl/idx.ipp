#pragma once
// Definitions of data/idx.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/paths.hpp>
#include <loom/core/error.hpp>
#include <loom/data/idx.hpp>

#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace loom::data {

LOOM_INLINE torch::Tensor read_idx(const std::filesystem::path& path) {
  check(path_exists(path, PathKind::file), "dataset file {} does not exist", path.string());
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), &gzclose);
  check(file != nullptr, "cannot open {}", path.string());
  auto read_exact = [&](void* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(file.get(), static_cast<char*>(dst) + done, chunk);
      check(got > 0, "{} is truncated or not an IDX file", path.string());
      done += static_cast<std::size_t>(got);
    }
  };
  std::array<uint8_t, 4> magic{};
  read_exact(magic.data(), magic.size());
  check(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] >= 1 && magic[3] <= 4,
        "{} is not an unsigned-byte IDX file", path.string());
  std::vector<int64_t> shape(magic[3]);
  int64_t total = 1;
  for (auto& d : shape) {
    std::array<uint8_t, 4> b{};
    read_exact(b.data(), b.size());
    d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
    total *= d;
  }
  auto out = torch::empty(shape, torch::kUInt8);
  read_exact(out.data_ptr<uint8_t>(), static_cast<std::size_t>(total));
  return out;
}

}  // namespace loom::data
