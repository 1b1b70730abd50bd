#pragma once
// Reader for the IDX format (MNIST, Fashion-MNIST), plain or gzip-compressed, via zlib.
// Format: 2 zero bytes, a type byte (0x08 = unsigned byte), a rank byte, then `rank`
// big-endian uint32 dimensions, then the data.

#include <loom/config/inline.hpp>
#include <loom/core/error.hpp>

#include <torch/torch.h>

#include <filesystem>

namespace loom::data {

/// Reads an unsigned-byte IDX file (".gz" or not) into a uint8 tensor of its shape.
LOOM_INLINE torch::Tensor read_idx(const std::filesystem::path& path);

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/idx.ipp>
#endif
