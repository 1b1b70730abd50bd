#pragma once
// Definitions of checkpoint/safetensors.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/checkpoint/folders.hpp>
#include <loom/checkpoint/safetensors.hpp>
#include <loom/config/json.hpp>
#include <loom/config/json_io.hpp>
#include <loom/config/paths.hpp>
#include <loom/core/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <system_error>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::checkpoint {

namespace detail {

LOOM_INLINE const DtypeInfo* dtype_by_name(std::string_view name) {
  for (const auto& d : kDtypes)
    if (d.name == name) return &d;
  return nullptr;
}

LOOM_INLINE const DtypeInfo* dtype_by_type(torch::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return &d;
  return nullptr;
}

LOOM_INLINE RemoveOnExit::~RemoveOnExit() {
  if (armed) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
}

LOOM_INLINE Parsed parse_header(const std::filesystem::path& path, std::ifstream& in) {
  const std::string where = path.string();
  check(path_exists(path, PathKind::file), "safetensors file {} does not exist", where);
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  check(!ec, "cannot read the size of {}: {}", where, ec.message());
  in.open(path, std::ios::binary);
  check(static_cast<bool>(in), "cannot open {}", where);
  check(file_size >= 8, "{} is not a safetensors file: it has {} bytes, fewer than the 8-byte header length",
        where, file_size);
  std::array<unsigned char, 8> len_bytes{};
  in.read(reinterpret_cast<char*>(len_bytes.data()), 8);
  check(static_cast<bool>(in), "cannot read {}", where);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[static_cast<std::size_t>(i)];
  check(header_len <= file_size - 8,
        "{} is truncated or not a safetensors file: the header length {} exceeds the {} bytes after it", where,
        header_len, file_size - 8);
  // The reference reader's limit (safetensors' MAX_HEADER_SIZE).
  constexpr uint64_t kMaxHeader = 100'000'000;
  check(header_len <= kMaxHeader, "{} is not a safetensors file: its header length {} exceeds the format's limit of {} bytes",
        where, header_len, kMaxHeader);
  std::string header(static_cast<std::size_t>(header_len), '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  check(static_cast<bool>(in), "cannot read the header of {}", where);

  check(nlohmann::ordered_json::accept(header), "{} is not a safetensors file: the header is not valid JSON", where);
  const auto j = json::parse_ordered(header, where + " (header)");  // refuses a tensor named twice
  check(j.is_object(), "{} is not a safetensors file: the header is not a JSON object", where);
  // As the format says: the JSON object starts at the first byte and is padded with spaces only.
  check(header.front() == '{', "{} is corrupt: the header does not start with '{{' (a wrong header length?)", where);
  check(header.find_first_not_of(' ', header.find_last_of('}') + 1) == std::string::npos,
        "{} is corrupt: the header has bytes other than space padding after its JSON object (a wrong header length?)",
        where);

  Parsed out;
  out.data_start = 8 + header_len;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      check(value.is_object() || value.is_null(), "{}: __metadata__ is not an object of strings", where);
      if (value.is_null()) continue;
      for (const auto& [key, text] : value.items()) {
        check(text.is_string(), "{}: __metadata__ entry '{}' is not a string", where, key);
        out.metadata[key] = text.get<std::string>();
      }
      continue;
    }
    check(value.is_object(), "{}: tensor '{}' is not described by a JSON object", where, name);
    check(value.contains("dtype") && value.at("dtype").is_string(), "{}: tensor '{}' has no dtype", where, name);
    const auto dtype_name = value.at("dtype").get<std::string>();
    const DtypeInfo* dtype = dtype_by_name(dtype_name);
    check(dtype != nullptr, "{}: tensor '{}' has unsupported dtype '{}' (loom reads F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)",
          where, name, dtype_name);
    check(value.contains("shape") && value.at("shape").is_array(), "{}: tensor '{}' has no shape", where, name);
    Entry e{name, dtype, {}, 0, 0};
    for (const auto& d : value.at("shape")) {
      check(d.is_number_unsigned(), "{}: tensor '{}' has a shape that is not a list of non-negative integers",
            where, name);
      const auto dim = d.get<uint64_t>();
      check(dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
            "{}: tensor '{}' has a dimension too large", where, name);
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    // Byte count, guarded against overflow (a huge shape cannot match offsets inside the file).
    uint64_t bytes = static_cast<uint64_t>(dtype->size);
    bool too_big = false;
    if (std::find(e.shape.begin(), e.shape.end(), 0) != e.shape.end()) {
      bytes = 0;
    } else {
      for (const auto dim : e.shape) {
        if (bytes > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(dim)) {
          too_big = true;
          break;
        }
        bytes *= static_cast<uint64_t>(dim);
      }
    }
    const auto& offsets = value.contains("data_offsets") ? value.at("data_offsets") : nlohmann::ordered_json();
    check(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
              offsets[1].is_number_unsigned(),
          "{}: tensor '{}' has no data_offsets [begin, end]", where, name);
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    check(e.begin <= e.end && e.end <= data_size,
          "{} is truncated or corrupt: tensor '{}' has data_offsets [{}, {}] outside the {} bytes of data", where,
          name, e.begin, e.end, data_size);
    check(!too_big && e.end - e.begin == bytes,
          "{}: tensor '{}' has data_offsets [{}, {}] ({} bytes) but shape {} of {} needs {} bytes", where, name,
          e.begin, e.end, e.end - e.begin, shape_string(e.shape), dtype->name,
          too_big ? std::string("more than 2^64") : std::to_string(bytes));
    out.entries.push_back(std::move(e));
  }
  // The tensors tile the data exactly, as the reference reader requires: in offset order each
  // starts where the previous one ends, and the last ends at the end of the file.
  std::vector<const Entry*> by_offset;
  for (const auto& e : out.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return std::pair(a->begin, a->end) < std::pair(b->begin, b->end); });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* e : by_offset) {
    check(e->begin == covered,
          "{} is corrupt: tensor '{}' has data_offsets [{}, {}] but {} (tensors must tile the data without gaps "
          "or overlaps)", where, e->name, e->begin, e->end,
          previous ? fmt::format("the previous tensor '{}' ends at {}", previous->name, previous->end)
                   : std::string("the data starts at 0"));
    covered = e->end;
    previous = e;
  }
  check(covered == data_size,
        "{} is corrupt: its tensors cover {} bytes of data but the file holds {} (trailing bytes, or a wrong header "
        "length)", where, covered, data_size);
  return out;
}

}  // namespace detail

LOOM_INLINE void save_safetensors(const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                                  const std::filesystem::path& path,
                                  const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    check(t.defined(), "cannot save {}: tensor '{}' is undefined", path.string(), name);
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  SafetensorsWriter writer(path, specs, metadata);  // checks the names and dtypes
  for (const auto& [name, t] : tensors) writer.write(name, t);  // to the host one at a time
  writer.commit();
}

LOOM_INLINE SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, const std::vector<Spec>& tensors,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), cleanup_{std::filesystem::path()} {
  struct Item {
    const Spec* spec;
    const detail::DtypeInfo* dtype;
  };
  std::vector<Item> items;
  for (const auto& t : tensors) {
    check(t.name != "__metadata__", "cannot save {}: '__metadata__' is reserved and cannot name a tensor",
          path_.string());
    const auto* dtype = detail::dtype_by_type(t.dtype);
    check(dtype != nullptr, "cannot save {}: tensor '{}' has dtype {}, which loom's safetensors writer does not support",
          path_.string(), t.name, std::string(c10::toString(t.dtype)));
    items.push_back({&t, dtype});
  }
  // The Python library's layout: larger elements first, then by name (keeps data aligned).
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.dtype->size != b.dtype->size) return a.dtype->size > b.dtype->size;
    return a.spec->name < b.spec->name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& item : items) {
    uint64_t numel = 1;
    for (const auto d : item.spec->shape) numel *= static_cast<uint64_t>(d);
    const auto bytes = numel * static_cast<uint64_t>(item.dtype->size);
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (const auto d : item.spec->shape) shape.push_back(static_cast<uint64_t>(d));
    header[item.spec->name] = {{"dtype", item.dtype->name}, {"shape", std::move(shape)},
                               {"data_offsets", {offset, offset + bytes}}};
    check(places_.emplace(item.spec->name, Place{offset, bytes, item.spec->dtype, item.spec->shape}).second,
          "cannot save {}: the tensor name '{}' appears twice", path_.string(), item.spec->name);
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  data_start_ = 8 + text.size();

  tmp_ = path_;
  tmp_ += ".tmp";
  cleanup_.path = tmp_;
  out_.open(tmp_, std::ios::binary | std::ios::trunc);
  check(static_cast<bool>(out_), "cannot write {}", tmp_.string());
  std::array<char, 8> len{};
  uint64_t n = text.size();
  for (auto& b : len) b = static_cast<char>(n & 0xff), n >>= 8;
  out_.write(len.data(), 8);
  out_.write(text.data(), static_cast<std::streamsize>(text.size()));
  check(static_cast<bool>(out_), "cannot write {}", tmp_.string());
}

LOOM_INLINE void SafetensorsWriter::write(const std::string& name, const torch::Tensor& t) {
  auto it = places_.find(name);
  check(it != places_.end(), "writing {}: it holds no tensor '{}'", path_.string(), name);
  auto& place = it->second;
  check(!place.written, "writing {}: tensor '{}' was written already", path_.string(), name);
  check(t.defined() && t.sizes() == c10::IntArrayRef(place.shape), "writing {}: tensor '{}' has shape {}, the header {}",
        path_.string(), name, detail::shape_string(t.sizes()), detail::shape_string(place.shape));
  check(t.layout() == torch::kStrided, "cannot save {}: tensor '{}' is not a dense (strided) tensor", path_.string(), name);
  // A tensor whose memory was released (a FullShard rank outside a gather keeps its shard
  // only; the parameters are views of freed storage) has nothing to write.
  const auto needed = (t.storage_offset() + (t.numel() > 0 ? 1 : 0)) * static_cast<int64_t>(t.element_size());
  check(t.numel() == 0 || (t.storage().data() != nullptr && static_cast<int64_t>(t.storage().nbytes()) >= needed),
        "cannot save {}: tensor '{}' holds no data here (its memory is released: under FullShard a rank keeps only "
        "its shard outside a gather; save through Trainer::save_model or Accelerator::save_model, which every rank "
        "calls and which gather the full weights)", path_.string(), name);
  const auto data = t.detach().to(torch::kCPU, place.dtype).contiguous();
  errno = 0;  // what a failing write sets is reported below
  out_.seekp(static_cast<std::streamoff>(data_start_ + place.offset));
  if (place.bytes > 0) out_.write(static_cast<const char*>(data.data_ptr()), static_cast<std::streamsize>(place.bytes));
  const int error = errno;
  // The reason the system gave (ENOSPC: "No space left on device"), when it gave one.
  check(static_cast<bool>(out_), "cannot write {}{}", tmp_.string(),
        error != 0 ? ": " + std::error_code(error, std::generic_category()).message() : std::string());
  place.written = true;
  ++written_;
}

LOOM_INLINE std::vector<std::string> SafetensorsWriter::missing() const {
  std::vector<std::string> out;
  for (const auto& [name, place] : places_)
    if (!place.written) out.push_back(name);
  return out;
}

LOOM_INLINE void SafetensorsWriter::commit() {
  check(complete(), "writing {}: {} of its tensors were never written (the first: {})", path_.string(),
        places_.size() - written_, missing().front());
  errno = 0;
  out_.flush();
  const int error = errno;
  check(static_cast<bool>(out_), "cannot write {}{}", tmp_.string(),
        error != 0 ? ": " + std::error_code(error, std::generic_category()).message() : std::string());
  out_.close();
  detail::fsync_path(tmp_, false);
  detail::fault_point("tensor_file_tmp");
  detail::rename_or_fail(tmp_, path_);
  cleanup_.armed = false;
}

LOOM_INLINE std::vector<std::pair<std::string, torch::Tensor>> load_safetensors(const std::filesystem::path& path) {
  std::ifstream in;
  const auto parsed = detail::parse_header(path, in);
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.reserve(parsed.entries.size());
  for (const auto& e : parsed.entries) {
    // BOOL is read as bytes and compared with 0: a byte other than 0/1 must not become an
    // invalid bool.
    const auto read_type = e.dtype->type == torch::kBool ? torch::kUInt8 : e.dtype->type;
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(read_type));
    const auto bytes = e.end - e.begin;
    if (bytes > 0) {
      in.seekg(static_cast<std::streamoff>(parsed.data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
      check(static_cast<bool>(in), "cannot read tensor '{}' from {}", e.name, path.string());
    }
    if (e.dtype->type == torch::kBool) t = t.ne(0);
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

LOOM_INLINE std::map<std::string, std::string> load_safetensors_metadata(const std::filesystem::path& path) {
  std::ifstream in;
  return detail::parse_header(path, in).metadata;
}

LOOM_INLINE void save_module(const torch::nn::Module& module, const std::filesystem::path& path) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& p : module.named_parameters(true))
    if (p.value().defined()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers(true))
    if (b.value().defined()) tensors.emplace_back(b.key(), b.value());
  save_safetensors(tensors, path);
}

LOOM_INLINE std::vector<TensorLocation> locate_safetensors(const std::filesystem::path& path) {
  std::ifstream in;
  auto parsed = detail::parse_header(path, in);
  std::vector<TensorLocation> out;
  out.reserve(parsed.entries.size());
  for (auto& e : parsed.entries) out.push_back({path, parsed.data_start, std::move(e)});
  return out;
}

LOOM_INLINE torch::Tensor read_tensor(const TensorLocation& at, int64_t begin, int64_t end) {
  const auto& e = at.entry;
  int64_t numel = 1;
  for (const auto d : e.shape) numel *= d;
  if (end < 0) end = numel;
  check(0 <= begin && begin <= end && end <= numel, "elements [{}, {}) of tensor '{}' in {}: it has {}", begin, end,
        e.name, at.file.string(), numel);
  // BOOL is read as bytes and compared with 0: a byte other than 0/1 must not become an
  // invalid bool.
  const auto read_type = e.dtype->type == torch::kBool ? torch::kUInt8 : e.dtype->type;
  const bool whole = begin == 0 && end == numel;
  auto t = whole ? torch::empty(e.shape, torch::TensorOptions().dtype(read_type))
                 : torch::empty({end - begin}, torch::TensorOptions().dtype(read_type));
  const auto bytes = static_cast<uint64_t>(end - begin) * static_cast<uint64_t>(e.dtype->size);
  if (bytes > 0) {
    std::ifstream in(at.file, std::ios::binary);
    check(static_cast<bool>(in), "cannot open {}", at.file.string());
    in.seekg(static_cast<std::streamoff>(at.data_start + e.begin + static_cast<uint64_t>(begin) * static_cast<uint64_t>(e.dtype->size)));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
    check(static_cast<bool>(in), "cannot read tensor '{}' from {}", e.name, at.file.string());
  }
  if (e.dtype->type == torch::kBool) t = t.ne(0);
  return t;
}

LOOM_INLINE void SliceReader::read(const std::string& name, int64_t begin, int64_t end, torch::Tensor& out) const {
  const auto it = where_.find(name);
  check(it != where_.end(), "the weight files hold no tensor for parameter {}", name);
  check(out.dim() == 1 && out.numel() == end - begin, "reading {}: {} elements into a tensor of {}", name, end - begin,
        out.numel());
  torch::NoGradGuard no_grad;
  out.copy_(read_tensor(it->second, begin, end).reshape({-1}));
}

LOOM_INLINE WeightsWriter::WeightsWriter(const std::filesystem::path& dir,
                                         const std::vector<SafetensorsWriter::Spec>& tensors, int64_t max_shard_size,
                                         int64_t total_parameters, const std::map<std::string, std::string>& metadata)
    : dir_(dir), total_parameters_(total_parameters) {
  check(max_shard_size > 0, "max_shard_size must be positive, got {}", max_shard_size);
  // huggingface_hub's split_torch_state_dict_into_shards: greedy, in order; a tensor over the
  // limit gets a file of its own at once, the file being filled goes on after it.
  std::vector<std::vector<SafetensorsWriter::Spec>> groups;
  std::vector<SafetensorsWriter::Spec> current;
  int64_t current_size = 0;
  for (const auto& t : tensors) {
    const auto* dtype = detail::dtype_by_type(t.dtype);
    check(dtype != nullptr, "cannot save {}: tensor '{}' has dtype {}, which loom's safetensors writer does not support",
          dir.string(), t.name, std::string(c10::toString(t.dtype)));
    int64_t size = dtype->size;
    for (const auto d : t.shape) size *= d;
    total_size_ += size;
    if (size > max_shard_size) {
      groups.push_back({t});
      continue;
    }
    if (current_size + size > max_shard_size) {
      groups.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(t);
    current_size += size;
  }
  if (!current.empty()) groups.push_back(std::move(current));
  if (groups.empty()) groups.emplace_back();
  const auto n = groups.size();
  for (std::size_t i = 0; i < n; ++i) {
    files_.push_back(n == 1 ? std::string(kModelFile) : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, n));
    shards_.push_back(std::make_unique<SafetensorsWriter>(dir / files_.back(), groups[i], metadata));
    for (const auto& t : groups[i]) shard_of_[t.name] = i;
  }
}

LOOM_INLINE void WeightsWriter::write(const std::string& name, const torch::Tensor& t) {
  const auto it = shard_of_.find(name);
  check(it != shard_of_.end(), "writing the weights in {}: they hold no tensor '{}'", dir_.string(), name);
  shards_[it->second]->write(name, t);
}

LOOM_INLINE void WeightsWriter::commit() {
  for (auto& s : shards_) s->commit();
  std::set<std::string> written(files_.begin(), files_.end());
  if (files_.size() > 1) {
    nlohmann::json weight_map = nlohmann::json::object();
    for (const auto& [name, i] : shard_of_) weight_map[name] = files_[i];
    const nlohmann::json index = {{"metadata", {{"total_parameters", total_parameters_}, {"total_size", total_size_}}},
                                  {"weight_map", std::move(weight_map)}};
    json::write_file(nlohmann::ordered_json::parse(index.dump()), dir_ / kModelIndexFile);  // keys sorted, as HF's
    written.insert(std::string(kModelIndexFile));
  }
  // Weight files of an earlier save into the same folder would be read instead of (or beside)
  // these: removed.
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.starts_with("model-") && name.ends_with(".safetensors");
    if ((name == kModelFile || name == kModelIndexFile || shard) && !written.contains(name))
      std::filesystem::remove(entry.path());
  }
}

LOOM_INLINE std::vector<TensorLocation> locate_model_weights(const std::filesystem::path& path) {
  const auto index = path.parent_path() / kModelIndexFile;
  if (path_exists(path, PathKind::file) || !path_exists(index, PathKind::file)) return locate_safetensors(path);
  const nlohmann::json j = json::read_file(index);
  const json::Fields f(j, index.string());
  const nlohmann::json& map = f.object("weight_map");
  if (map.empty()) f.fail("weight_map", "is empty");
  std::map<std::string, std::set<std::string>> by_file;  // shard file -> the names it must hold
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->is_string())
      f.fail("weight_map", "must map each tensor name to a file name; '" + it.key() + "' maps to " + it->dump());
    const auto file = it->get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos)
      f.fail("weight_map", "maps '" + it.key() + "' to \"" + file + "\", which is not a file name in the folder");
    by_file[file].insert(it.key());
  }
  for (const auto& [file, names] : by_file)
    check(path_exists(path.parent_path() / file, PathKind::file), "{}: weight_map names {} (for {}), which does not exist",
          index.string(), file, *names.begin());
  std::vector<TensorLocation> out;
  for (auto& [file, names] : by_file) {
    const auto shard = path.parent_path() / file;
    for (auto& at : locate_safetensors(shard)) {
      check(names.erase(at.entry.name) == 1, "{} holds {}, which {} does not map to it", shard.string(), at.entry.name,
            kModelIndexFile);
      out.push_back(std::move(at));
    }
    check(names.empty(), "{}: weight_map puts {} in {}, which does not hold it", index.string(), *names.begin(), file);
  }
  return out;
}

LOOM_INLINE bool has_model_weights(const std::filesystem::path& dir) {
  return path_exists(dir / kModelFile, PathKind::file) || path_exists(dir / kModelIndexFile, PathKind::file);
}

LOOM_INLINE void load_module(torch::nn::Module& module, const std::filesystem::path& path,
                             const std::function<void(std::shared_ptr<const SliceReader>)>& storage_less) {
  const auto file = locate_model_weights(path);
  std::unordered_map<std::string, const TensorLocation*> by_name;
  for (const auto& at : file) by_name.emplace(at.entry.name, &at);

  std::vector<std::pair<torch::Tensor, const TensorLocation*>> copies;
  std::vector<std::pair<std::string, const TensorLocation*>> deferred;  // read when materialized
  std::set<std::string> model_names;
  std::vector<std::string> missing, shapes;
  auto visit = [&](const std::string& name, const torch::Tensor& target) {
    if (!target.defined()) return;
    model_names.insert(name);
    const auto it = by_name.find(name);
    if (it == by_name.end()) {
      missing.push_back(name);
    } else if (c10::IntArrayRef(it->second->entry.shape) != target.sizes()) {
      shapes.push_back("shape of " + name + " is " + detail::shape_string(it->second->entry.shape) +
                       " in the file but " + detail::shape_string(target.sizes()) + " in the model");
    } else if (holds_no_storage(target)) {
      deferred.emplace_back(name, it->second);
    } else {
      copies.emplace_back(target, it->second);
    }
  };
  for (const auto& p : module.named_parameters(true)) visit(p.key(), p.value());
  for (const auto& b : module.named_buffers(true)) visit(b.key(), b.value());
  std::vector<std::string> unexpected;
  for (const auto& at : file)
    if (!model_names.count(at.entry.name)) unexpected.push_back(at.entry.name);

  if (!missing.empty() || !unexpected.empty() || !shapes.empty()) {
    auto join = [](const std::vector<std::string>& v, std::string_view sep) {
      std::string s;
      for (const auto& x : v) s += (s.empty() ? "" : std::string(sep)) + x;
      return s;
    };
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back("missing " + join(missing, ", "));
    if (!unexpected.empty()) parts.push_back("unexpected " + join(unexpected, ", "));
    parts.insert(parts.end(), shapes.begin(), shapes.end());
    fail("{} does not match the model: {}", path.string(), join(parts, "; "));
  }
  if (!deferred.empty()) {
    auto reader = std::make_shared<SliceReader>();
    for (const auto& [name, at] : deferred) reader->add(name, *at);
    if (storage_less) {
      storage_less(std::move(reader));
    } else {
      auto* values = dynamic_cast<DeferredValues*>(&module);
      check(values != nullptr, "{}: parameter {} holds no memory, and the model gives no values for it (build the "
            "model itself under loom::DeferredInit)", path.string(), deferred.front().first);
      values->read_weights_from(std::move(reader));
    }
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, at] : copies) target.copy_(read_tensor(*at));
}

}  // namespace loom::checkpoint
