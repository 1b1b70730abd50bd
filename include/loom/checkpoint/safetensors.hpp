#pragma once
// safetensors reader/writer (the format of HF's model.safetensors), and module save/load.
//
// Format: an 8-byte little-endian u64 N, N bytes of JSON header, then the data buffer.
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets into the data buffer) plus an optional "__metadata__" object of strings; it is
// padded with spaces to a multiple of 8 bytes. Data is raw little-endian, row-major.
//
// Writer: like the Python library, "__metadata__" comes first and tensors are laid out by
// element size (largest first) then name, so every tensor starts aligned to its element
// size. Reader: tolerant of any layout a valid writer may choose (gaps, any order), strict
// about everything that could read out of bounds or misinterpret bytes.

#include <loom/checkpoint/folders.hpp>
#include <loom/config/inline.hpp>
#include <loom/core/deferred.hpp>
#include <loom/core/error.hpp>

#include <torch/torch.h>

#include <array>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::checkpoint {

static_assert(std::endian::native == std::endian::little,
              "loom: the safetensors reader/writer assumes a little-endian host");

namespace detail {

struct DtypeInfo {
  std::string_view name;
  torch::ScalarType type;
  int64_t size;
};

inline constexpr std::array<DtypeInfo, 10> kDtypes = {{
    {"F64", torch::kFloat64, 8},
    {"F32", torch::kFloat32, 4},
    {"F16", torch::kFloat16, 2},
    {"BF16", torch::kBFloat16, 2},
    {"I64", torch::kInt64, 8},
    {"I32", torch::kInt32, 4},
    {"I16", torch::kInt16, 2},
    {"I8", torch::kInt8, 1},
    {"U8", torch::kUInt8, 1},
    {"BOOL", torch::kBool, 1},
}};

// The entry of kDtypes with this safetensors name, or nullptr.
LOOM_INLINE const DtypeInfo* dtype_by_name(std::string_view name);

// The entry of kDtypes with this torch dtype, or nullptr.
LOOM_INLINE const DtypeInfo* dtype_by_type(torch::ScalarType type);

template <class Shape>
std::string shape_string(const Shape& shape) {
  std::string s = "[";
  bool first = true;
  for (const auto d : shape) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

// Removes a file on scope exit unless released (the .tmp file of a failed write).
struct RemoveOnExit {
  std::filesystem::path path;
  bool armed = true;
  ~RemoveOnExit();
};

struct Entry {
  std::string name;
  const DtypeInfo* dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

struct Parsed {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // file offset of the data buffer
};

// Reads and checks the header: after this every entry lies inside the file and has exactly
// shape x dtype bytes, so reading the data cannot run out of bounds.
LOOM_INLINE Parsed parse_header(const std::filesystem::path& path, std::ifstream& in);

}  // namespace detail

/// A safetensors file written a tensor at a time, in any order: the header (every tensor's
/// name, dtype and shape, laid out as save_safetensors lays them out) is written first, then
/// each tensor's bytes at its place; commit() makes the file durable and renames `path`.tmp to
/// `path`. What streams a model unit by unit (FullShard's save) without holding it whole.
/// Destroyed without commit(), the .tmp file is removed.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  LOOM_INLINE SafetensorsWriter(std::filesystem::path path, const std::vector<Spec>& tensors,
                                const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  /// Writes tensor `name` (its spec's shape; any device, converted to the spec's dtype); once.
  LOOM_INLINE void write(const std::string& name, const torch::Tensor& t);
  /// True once every tensor has been written.
  [[nodiscard]] bool complete() const { return written_ == places_.size(); }
  /// The names not written yet.
  [[nodiscard]] LOOM_INLINE std::vector<std::string> missing() const;
  /// Every tensor written: flushes, syncs and renames the file into place.
  LOOM_INLINE void commit();

 private:
  struct Place {
    uint64_t offset, bytes;
    torch::ScalarType dtype;
    std::vector<int64_t> shape;
    bool written = false;
  };
  std::filesystem::path path_, tmp_;
  std::ofstream out_;
  uint64_t data_start_ = 0;
  std::map<std::string, Place> places_;
  std::size_t written_ = 0;
  detail::RemoveOnExit cleanup_;
};

/// A model's weights written a tensor at a time, in save_pretrained's layout: one
/// model.safetensors up to `max_shard_size` bytes, else model-0000i-of-0000n.safetensors
/// filled greedily in the order of `tensors` (huggingface_hub's split: a tensor over the limit
/// gets a file of its own) and model.safetensors.index.json ({"metadata": {"total_parameters",
/// "total_size"}, "weight_map"}, sorted keys). commit() renames every file into place, the index
/// last, and removes the weight files of an earlier save in `dir` that this one did not write.
class WeightsWriter {
 public:
  LOOM_INLINE WeightsWriter(const std::filesystem::path& dir, const std::vector<SafetensorsWriter::Spec>& tensors,
                            int64_t max_shard_size, int64_t total_parameters,
                            const std::map<std::string, std::string>& metadata = {});
  /// Writes tensor `name` into its file (SafetensorsWriter::write).
  LOOM_INLINE void write(const std::string& name, const torch::Tensor& t);
  /// Every tensor written: each file committed, then the index (when there are several).
  LOOM_INLINE void commit();
  /// The file names, in order (one: model.safetensors).
  [[nodiscard]] const std::vector<std::string>& files() const { return files_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsWriter>> shards_;
  std::vector<std::string> files_;
  std::unordered_map<std::string, std::size_t> shard_of_;
  int64_t total_size_ = 0, total_parameters_ = 0;
};

/// Writes `tensors` (any device, layout or strides) and string `metadata` to a safetensors
/// file at `path`, via `path`.tmp and a rename; names must be unique.
LOOM_INLINE void save_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                  const std::filesystem::path& path,
                                  const std::map<std::string, std::string>& metadata = {});

/// Reads every tensor of a safetensors file, as CPU tensors in header order.
LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> load_safetensors(const std::filesystem::path& path);

/// Reads the "__metadata__" strings of a safetensors file (empty when it has none).
LOOM_INLINE std::map<std::string, std::string> load_safetensors_metadata(const std::filesystem::path& path);

/// Where one tensor lies in a safetensors file, known from the header alone.
struct TensorLocation {
  std::filesystem::path file;
  uint64_t data_start = 0;  ///< the file offset of the data buffer
  detail::Entry entry;      ///< name, dtype, shape, byte range in the data buffer
};

/// Every tensor of a safetensors file, located from its (checked) header; no data is read.
LOOM_INLINE std::vector<TensorLocation> locate_safetensors(const std::filesystem::path& path);

/// Reads elements [begin, end) of the flattened tensor at `at` (end < 0: to its last), as a
/// 1-D CPU tensor of the stored dtype; the whole tensor in its shape when the range is all of it.
LOOM_INLINE torch::Tensor read_tensor(const TensorLocation& at, int64_t begin = 0, int64_t end = -1);

/// Where every tensor of a model's weights saved at `path` (model.safetensors) lies: that file,
/// or, when it is absent and the index (model.safetensors.index.json) is beside it, the shards
/// the index names (each must hold exactly the names mapped to it). Headers only.
LOOM_INLINE std::vector<TensorLocation> locate_model_weights(const std::filesystem::path& path);

/// True when `dir` holds a model's weights: model.safetensors or the shards' index.
LOOM_INLINE bool has_model_weights(const std::filesystem::path& dir);

/// A WeightReader over located tensors, each under the name the model gives it: what a model
/// built under DeferredInit reads its parameters' slices from.
class SliceReader final : public WeightReader {
 public:
  void add(const std::string& model_name, TensorLocation at) { where_.insert_or_assign(model_name, std::move(at)); }
  LOOM_INLINE void read(const std::string& name, int64_t begin, int64_t end, torch::Tensor& out) const override;
  [[nodiscard]] bool empty() const { return where_.empty(); }

 private:
  std::unordered_map<std::string, TensorLocation> where_;
};

/// Writes the module's named parameters and buffers (libtorch names, e.g. "fc.weight") to `path`.
LOOM_INLINE void save_module(const torch::nn::Module& module, const std::filesystem::path& path);

/// Copies a file written by save_module (or Python's save_file of a matching state_dict; or the
/// shards of model.safetensors.index.json beside `path`, when `path` is absent) into
/// the module's parameters and buffers, converting dtype and device; every name and shape must
/// match, else one loom::Error lists all differences and the module is left untouched. Tensors
/// are read one at a time. A storage-less parameter (core/deferred.hpp) is not read: the module,
/// a model built under DeferredInit, reads its slices from the file when it is materialized.
/// `storage_less`, when given, takes the reader of those parameters' slices instead (FullShard's
/// load fills its shards from it).
LOOM_INLINE void load_module(torch::nn::Module& module, const std::filesystem::path& path,
                             const std::function<void(std::shared_ptr<const SliceReader>)>& storage_less = {});

}  // namespace loom::checkpoint

#if defined(LOOM_HEADER_ONLY)
#include <loom/checkpoint/impl/safetensors.ipp>
#endif
