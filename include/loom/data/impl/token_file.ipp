#pragma once
// Definitions of data/token_file.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/config/json.hpp>
#include <loom/config/paths.hpp>
#include <loom/core/error.hpp>
#include <loom/data/token_file.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

namespace loom::data {

namespace detail {


// The first of the `n` ids (of type T) of `bytes` that is >= limit, or -1: the largest of each
// chunk first (a loop the compiler vectorizes), the position only in a chunk that fails.
template <class T>
int64_t first_at_or_above(const std::byte* bytes, int64_t n, uint64_t limit) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    T largest = 0;
    for (int64_t i = begin; i < end; ++i) largest = std::max(largest, load_le<T>(bytes, i));
    if (largest < limit) continue;
    for (int64_t i = begin; i < end; ++i)
      if (load_le<T>(bytes, i) >= limit) return i;
  }
  return -1;
}

}  // namespace detail

LOOM_INLINE LabelKind label_kind(std::string_view problem_type) {
  if (problem_type == "single_label_classification") return LabelKind::class_id;
  if (problem_type == "multi_label_classification") return LabelKind::multi_hot;
  if (problem_type == "regression") return LabelKind::regression;
  fail("a problem_type is \"single_label_classification\", \"multi_label_classification\" or \"regression\" "
       "(HF's names), got \"{}\"", problem_type);
}

LOOM_INLINE std::string_view problem_type_name(LabelKind kind) {
  switch (kind) {
    case LabelKind::class_id: return "single_label_classification";
    case LabelKind::multi_hot: return "multi_label_classification";
    case LabelKind::regression: return "regression";
  }
  return "?";
}

LOOM_INLINE TokenDtype token_dtype(std::string_view name) {
  if (name == "uint16") return TokenDtype::uint16;
  if (name == "uint32") return TokenDtype::uint32;
  fail("a token file's dtype is \"uint16\" or \"uint32\", got \"{}\"", name);
}

// ---- MappedFile ------------------------------------------------------------------------

LOOM_INLINE MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  check_path(path, PathKind::file);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "cannot open {} ({})", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot read the size of {} ({})", path.string(), std::strerror(err));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the mapping keeps the file
    check(p != MAP_FAILED, "cannot map {} into memory ({})", path.string(), std::strerror(err));
    data_ = static_cast<const std::byte*>(p);
  } else {
    ::close(fd);
  }
}

LOOM_INLINE MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

LOOM_INLINE MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

LOOM_INLINE MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

LOOM_INLINE void MappedFile::release(std::size_t begin, std::size_t end) const {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t first = (begin + page - 1) / page * page, last = std::min(end, size_) / page * page;
  if (data_ == nullptr || first >= last) return;
  // Advice only: a failure leaves the pages where they are, which changes nothing read.
  (void)::madvise(const_cast<std::byte*>(data_) + first, last - first, MADV_DONTNEED);
}

// ---- TokenFile -------------------------------------------------------------------------

LOOM_INLINE TokenFile::TokenFile(const std::filesystem::path& path, TokenDtype dtype) : map_(path), dtype_(dtype) {
  const std::size_t bytes = map_.bytes().size();
  const std::size_t width = element_size(dtype);
  check(bytes % width == 0, "{}: {} bytes is not a whole number of {} token ids ({} bytes each); is the dtype right?",
        path.string(), bytes, dtype == TokenDtype::uint16 ? "uint16" : "uint32", width);
  size_ = static_cast<int64_t>(bytes / width);
}

LOOM_INLINE void TokenFile::read(int64_t begin, int64_t count, int64_t* out) const {
  check(begin >= 0 && count >= 0 && begin + count <= size_, "{}: ids [{}, {}) lie outside the file's {} ids",
        path().string(), begin, begin + count, size_);
  const std::byte* bytes = map_.bytes().data();
  if (dtype_ == TokenDtype::uint16) {
    for (int64_t k = 0; k < count; ++k) out[k] = detail::load_le<uint16_t>(bytes, begin + k);
  } else {
    for (int64_t k = 0; k < count; ++k) out[k] = detail::load_le<uint32_t>(bytes, begin + k);
  }
}

LOOM_INLINE torch::Tensor TokenFile::slice(int64_t begin, int64_t count) const {
  auto out = torch::empty({count}, torch::kLong);
  read(begin, count, out.data_ptr<int64_t>());
  return out;
}

LOOM_INLINE void TokenFile::check_ids_below(int64_t vocab_size) const {
  check(vocab_size > 0, "{}: vocab_size must be positive, got {}", path().string(), vocab_size);
  const std::byte* bytes = map_.bytes().data();
  const auto limit = static_cast<uint64_t>(vocab_size);
  const int64_t at = dtype_ == TokenDtype::uint16 ? detail::first_at_or_above<uint16_t>(bytes, size_, limit)
                                                  : detail::first_at_or_above<uint32_t>(bytes, size_, limit);
  if (at >= 0) {
    int64_t id = 0;
    read(at, 1, &id);
    fail("{}: token id {} at position {} is not below the vocabulary size {}", path().string(), id, at, vocab_size);
  }
}

// ---- TokenFileDataset ------------------------------------------------------------------

LOOM_INLINE TokenFileDataset::TokenFileDataset(const std::filesystem::path& file, const TokenFileOptions& options)
    : block_size_(options.block_size), stride_(options.stride.value_or(options.block_size)) {
  check(block_size_ > 0, "TokenFileDataset({}): block_size must be positive, got {}", file.string(), block_size_);
  check(stride_ > 0, "TokenFileDataset({}): stride must be positive, got {}", file.string(), stride_);
  file_ = std::make_shared<const TokenFile>(file, options.dtype);
  check(file_->size() >= block_size_, "{}: {} tokens, fewer than one block of {}", file.string(), file_->size(),
        block_size_);
  if (options.vocab_size) file_->check_ids_below(*options.vocab_size);
  windows_ = (file_->size() - block_size_) / stride_ + 1;
}

LOOM_INLINE CausalLMBatch TokenFileDataset::get_batch(std::span<const int64_t> indices) const {
  const auto rows = static_cast<int64_t>(indices.size());
  auto ids = torch::empty({rows, block_size_}, torch::kLong);
  int64_t* out = ids.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = indices[static_cast<std::size_t>(r)];
    check(i >= 0 && i < windows_, "{}: window {} out of range [0, {})", file_->path().string(), i, windows_);
    file_->read(i * stride_, block_size_, out + r * block_size_);
  }
  auto labels = ids.clone();
  return {std::move(ids), std::move(labels)};
}

// ---- TokenSequenceDataset --------------------------------------------------------------

namespace detail {
LOOM_INLINE int64_t checked_offsets(const MappedFile& offsets, const TokenFile& ids, bool allow_empty) {
  const auto off = offsets.bytes();
  const auto name = offsets.path().string();
  check(off.size() % 8 == 0 && off.size() >= 8, "{}: {} bytes is not a list of uint64 offsets (8 bytes each, at "
        "least one)", name, off.size());
  const auto n = static_cast<int64_t>(off.size() / 8) - 1;
  uint64_t previous = load_le<uint64_t>(off.data(), 0);
  check(previous == 0, "{}: the first offset must be 0, got {}", name, previous);
  for (int64_t i = 1; i <= n; ++i) {
    const auto o = load_le<uint64_t>(off.data(), i);
    check(o >= previous, "{}: offset {} ({}) is smaller than offset {} ({})", name, i, o, i - 1, previous);
    // An example without a token has nothing a model can read (a batch of them has no width).
    check(allow_empty || o > previous, "{}: example {} is empty (offsets {} and {} are both {}); every example needs "
          "a token", name, i - 1, i - 1, i, o);
    previous = o;
  }
  check(previous == static_cast<uint64_t>(ids.size()), "{}: the last offset is {} but {} holds {} ids", name, previous,
        ids.path().string(), ids.size());
  return n;
}
}  // namespace detail

LOOM_INLINE TokenSequenceDataset::TokenSequenceDataset(const RaggedTokenFiles& files, TokenSequenceOptions options)
    : max_length_(options.max_length), labels_per_token_(options.labels_per_token),
      label_kind_(options.label_kind), collator_(std::move(options.collator)) {
  check(!max_length_ || *max_length_ > 0, "TokenSequenceDataset({}): max_length must be positive, got {}",
        files.ids.string(), max_length_.value_or(0));
  ids_ = std::make_shared<const TokenFile>(files.ids, options.dtype);
  offsets_ = std::make_shared<const MappedFile>(files.offsets);
  // Empty examples pad like any other; a file of nothing else has nothing to batch.
  size_ = detail::checked_offsets(*offsets_, *ids_, /*allow_empty=*/true);
  check(size_ == 0 || ids_->size() > 0, "{}: all {} examples are empty (every offset is 0); an example needs a token",
        files.offsets.string(), size_);
  if (!files.labels.empty() && label_kind_ != LabelKind::class_id) {
    // float32 rows of num_labels values (multi-hot or regression targets), one per example.
    const auto kind = problem_type_name(label_kind_);
    check(!labels_per_token_, "TokenSequenceDataset({}): {} labels are one row per example, not per token",
          files.labels.string(), kind);
    check(options.num_labels.has_value() && *options.num_labels > 0, "TokenSequenceDataset({}): {} labels need "
          "num_labels (the values per example), got {}", files.labels.string(), kind,
          options.num_labels ? std::to_string(*options.num_labels) : std::string("none"));
    label_width_ = *options.num_labels;
    labels_ = std::make_shared<const MappedFile>(files.labels);
    const std::size_t bytes = labels_->bytes().size();
    check(bytes % 4 == 0 && static_cast<int64_t>(bytes / 4) == size_ * label_width_, "{}: {} bytes, expected {} "
          "float32 labels ({}: {} per example, {} examples in {})", files.labels.string(), bytes,
          size_ * label_width_, kind, label_width_, size_, files.offsets.string());
    check_float_labels(files.labels);
  } else if (!files.labels.empty()) {
    labels_ = std::make_shared<const MappedFile>(files.labels);
    const std::size_t bytes = labels_->bytes().size();
    const int64_t expected = labels_per_token_ ? ids_->size() : size_;
    check(bytes % 8 == 0 && static_cast<int64_t>(bytes / 8) == expected, "{}: {} bytes, expected {} int64 labels "
          "(one per {}: {})", files.labels.string(), bytes, expected, labels_per_token_ ? "id" : "example",
          labels_per_token_ ? files.ids.string() : files.offsets.string());
    if (options.num_labels) check_labels_below(files.labels, *options.num_labels);
  } else {
    check(!labels_per_token_, "TokenSequenceDataset({}): labels_per_token without a labels file", files.ids.string());
  }
  if (options.vocab_size) ids_->check_ids_below(*options.vocab_size);
}

LOOM_INLINE void TokenSequenceDataset::check_labels_below(const std::filesystem::path& file, int64_t num_labels) const {
  check(num_labels > 0, "{}: num_labels must be positive, got {}", file.string(), num_labels);
  const std::byte* bytes = labels_->bytes().data();
  const auto n = static_cast<int64_t>(labels_->bytes().size() / 8);
  const std::byte* offsets = offsets_->bytes().data();
  int64_t example = 0;  // per-token labels: the example holding id k
  for (int64_t k = 0; k < n; ++k) {
    const auto label = static_cast<int64_t>(detail::load_le<uint64_t>(bytes, k));
    if (label >= 0 && label < num_labels) continue;
    if (!labels_per_token_) {
      fail("{}: example {} has label {}, outside [0, {}) (the model's num_labels)", file.string(), k, label,
           num_labels);
    }
    if (label == -100) continue;  // HF's ignored position
    while (static_cast<int64_t>(detail::load_le<uint64_t>(offsets, example + 1)) <= k) ++example;
    fail("{}: example {} has label {} at id {}, neither -100 (ignored) nor in [0, {}) (the model's num_labels)",
         file.string(), example, label, k, num_labels);
  }
}

LOOM_INLINE void TokenSequenceDataset::check_float_labels(const std::filesystem::path& file) const {
  const std::byte* bytes = labels_->bytes().data();
  const int64_t n = size_ * label_width_;
  for (int64_t k = 0; k < n; ++k) {
    const auto v = std::bit_cast<float>(detail::load_le<uint32_t>(bytes, k));
    if (!std::isfinite(v)) {
      fail("{}: example {} has label {} at column {}; {} labels must be finite", file.string(), k / label_width_, v,
           k % label_width_, problem_type_name(label_kind_));
    }
    if (label_kind_ == LabelKind::multi_hot && v != 0.0f && v != 1.0f) {
      fail("{}: example {} has label {} at column {}; multi_label_classification labels are 0 or 1 (multi-hot)",
           file.string(), k / label_width_, v, k % label_width_);
    }
  }
}

LOOM_INLINE std::pair<int64_t, int64_t> TokenSequenceDataset::span_of(int64_t i) const {
  check(i >= 0 && i < size_, "{}: example {} out of range [0, {})", ids_->path().string(), i, size_);
  const auto begin = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i));
  auto end = static_cast<int64_t>(detail::load_le<uint64_t>(offsets_->bytes().data(), i + 1));
  if (max_length_) end = std::min(end, begin + *max_length_);
  return {begin, end};
}

LOOM_INLINE TokenSequence TokenSequenceDataset::get(int64_t i) const {
  const auto [begin, end] = span_of(i);
  TokenSequence out{ids_->slice(begin, end - begin), {}};
  if (labels_ == nullptr) return out;
  const std::byte* labels = labels_->bytes().data();
  if (label_kind_ != LabelKind::class_id) {
    // One regression target: a 0-dim label, so that a batch's labels are [B] (HF's squeeze).
    const bool scalar = label_kind_ == LabelKind::regression && label_width_ == 1;
    out.labels = scalar ? torch::empty({}, torch::kFloat) : torch::empty({label_width_}, torch::kFloat);
    auto* p = out.labels.data_ptr<float>();
    for (int64_t k = 0; k < label_width_; ++k)
      p[k] = std::bit_cast<float>(detail::load_le<uint32_t>(labels, i * label_width_ + k));
  } else if (labels_per_token_) {
    out.labels = torch::empty({end - begin}, torch::kLong);
    auto* p = out.labels.data_ptr<int64_t>();
    for (int64_t k = begin; k < end; ++k) p[k - begin] = static_cast<int64_t>(detail::load_le<uint64_t>(labels, k));
  } else {
    out.labels = torch::scalar_tensor(static_cast<int64_t>(detail::load_le<uint64_t>(labels, i)), torch::kLong);
  }
  return out;
}

LOOM_INLINE int64_t TokenSequenceDataset::length(int64_t i) const {
  const auto [begin, end] = span_of(i);
  return end - begin;
}

LOOM_INLINE torch::Tensor TokenSequenceDataset::lengths() const {
  auto out = torch::empty({size_}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < size_; ++i) p[i] = length(i);
  return out;
}

LOOM_INLINE int64_t TokenSequenceDataset::max_sequence_length() const {
  int64_t longest = 0;
  for (int64_t i = 0; i < size_; ++i) longest = std::max(longest, length(i));
  return longest == 0 ? 0 : collator_.padded_length(longest);
}

// ---- meta.json -------------------------------------------------------------------------

LOOM_INLINE const std::filesystem::path& TokenFileMeta::lm_file(std::string_view split) const {
  if (const auto it = lm.find(std::string(split)); it != lm.end()) return it->second;
  std::string have;
  for (const auto& [name, path] : lm) have += (have.empty() ? "" : ", ") + name;
  fail("{}: no causal-LM split '{}' (there are: {})", (folder / "meta.json").string(), split,
       have.empty() ? "none" : have);
}

LOOM_INLINE const SftFiles& TokenFileMeta::sft_files(std::string_view split) const {
  if (const auto it = sft.find(std::string(split)); it != sft.end()) return it->second;
  std::string have;
  for (const auto& [name, files] : sft) have += (have.empty() ? "" : ", ") + name;
  fail("{}: no instruction (sft) split '{}' (there are: {})", (folder / "meta.json").string(), split,
       have.empty() ? "none" : have);
}

LOOM_INLINE const PreferenceFiles& TokenFileMeta::preference_files(std::string_view split) const {
  if (const auto it = preference.find(std::string(split)); it != preference.end()) return it->second;
  std::string have;
  for (const auto& [name, files] : preference) have += (have.empty() ? "" : ", ") + name;
  fail("{}: no preference split '{}' (there are: {})", (folder / "meta.json").string(), split,
       have.empty() ? "none" : have);
}

LOOM_INLINE const RaggedTokenFiles& TokenFileMeta::classification_files(std::string_view split) const {
  if (const auto it = classification.find(std::string(split)); it != classification.end()) return it->second;
  std::string have;
  for (const auto& [name, files] : classification) have += (have.empty() ? "" : ", ") + name;
  fail("{}: no classification split '{}' (there are: {})", (folder / "meta.json").string(), split,
       have.empty() ? "none" : have);
}

LOOM_INLINE TokenSequenceOptions TokenFileMeta::sequence_options(std::optional<int64_t> max_length) const {
  TokenSequenceOptions o;
  o.dtype = dtype;
  o.max_length = max_length;
  o.vocab_size = vocab_size;
  o.collator.pad_token_id = pad_token_id.value_or(0);
  o.label_kind = label_kind;
  if (!label_names.empty()) o.num_labels = static_cast<int64_t>(label_names.size());
  return o;
}

LOOM_INLINE TokenFileMeta read_token_meta(const std::filesystem::path& meta_json) {
  const auto j = json::read_file(meta_json);
  const std::string where = meta_json.string();
  const json::Fields f(j, where);
  TokenFileMeta meta;
  meta.folder = meta_json.parent_path();
  const std::string dtype = f.string("dtype");
  if (dtype != "uint16" && dtype != "uint32") f.fail("dtype", "must be \"uint16\" or \"uint32\", got \"" + dtype + "\"");
  meta.dtype = token_dtype(dtype);
  meta.vocab_size = f.integer("vocab_size", 1, meta.dtype == TokenDtype::uint16 ? int64_t{1} << 16 : int64_t{1} << 32);
  meta.tokenizer_file = meta.folder / f.optional_string("tokenizer_file").value_or("tokenizer.json");
  // Special tokens are tokens: inside the vocabulary (an eos_token_id beyond it would be copied
  // into a saved config.json and index past the embedding table).
  const auto token_id = [&](const char* key) -> std::optional<int64_t> {
    if (!f.has(key)) return std::nullopt;
    return f.integer(key, 0, meta.vocab_size - 1);
  };
  meta.eos_token_id = token_id("eos_token_id");
  meta.pad_token_id = token_id("pad_token_id");
  meta.cls_token_id = token_id("cls_token_id");
  meta.sep_token_id = token_id("sep_token_id");
  meta.mask_token_id = token_id("mask_token_id");
  if (f.has("lm")) {
    const auto& lm = f.object("lm");
    for (auto it = lm.begin(); it != lm.end(); ++it)
      meta.lm[it.key()] = meta.folder / json::Fields(it.value(), where + ": lm." + it.key()).string("file");
  }
  if (f.has("classification")) {
    const auto& cls = f.object("classification");
    const json::Fields c(cls, where + ": classification");
    if (c.has("label_names")) {
      for (const auto& name : c.array("label_names")) {
        if (!name.is_string()) c.fail("label_names", "must hold strings, got " + name.dump());
        meta.label_names.push_back(name.get<std::string>());
      }
    }
    if (const auto problem = c.optional_string("problem_type")) {
      if (*problem != "single_label_classification" && *problem != "multi_label_classification" &&
          *problem != "regression")
        c.fail("problem_type", "must be \"single_label_classification\", \"multi_label_classification\" or "
               "\"regression\" (HF's names), got \"" + *problem + "\"");
      meta.label_kind = label_kind(*problem);
    }
    const std::string want_dtype = meta.label_kind == LabelKind::class_id ? "int64" : "float32";
    if (const auto dtype = c.optional_string("label_dtype"); dtype && *dtype != want_dtype)
      c.fail("label_dtype", "is \"" + *dtype + "\" but problem_type " +
             std::string(problem_type_name(meta.label_kind)) + " stores labels as \"" + want_dtype + "\"");
    if (meta.label_kind != LabelKind::class_id && meta.label_names.empty())
      c.fail("label_names", "must name the " + std::string(problem_type_name(meta.label_kind)) +
             " labels (one per value of an example's label row)");
    for (auto it = cls.begin(); it != cls.end(); ++it) {
      if (!it.value().is_object()) continue;  // the splits are the objects; the rest describes the task
      const json::Fields s(it.value(), where + ": classification." + it.key());
      RaggedTokenFiles files{meta.folder / s.string("ids"), meta.folder / s.string("offsets"), {}};
      if (const auto labels = s.optional_string("labels")) files.labels = meta.folder / *labels;
      meta.classification[it.key()] = std::move(files);
    }
  }
  if (f.has("sft")) {
    const auto& sft = f.object("sft");
    for (auto it = sft.begin(); it != sft.end(); ++it) {
      if (!it.value().is_object()) continue;  // the splits are the objects; "format" describes them
      const json::Fields s(it.value(), where + ": sft." + it.key());
      meta.sft[it.key()] = {meta.folder / s.string("ids"), meta.folder / s.string("offsets"),
                            meta.folder / s.string("mask")};
    }
  }
  if (f.has("preference")) {
    const auto& pref = f.object("preference");
    for (auto it = pref.begin(); it != pref.end(); ++it) {
      if (!it.value().is_object()) continue;  // the splits are the objects; "format" and "margin" describe them
      const std::string at = where + ": preference." + it.key();
      const json::Fields s(it.value(), at);
      const auto side = [&](const char* name) {
        const json::Fields x(s.object(name), at + "." + name);
        return SftFiles{meta.folder / x.string("ids"), meta.folder / x.string("offsets"), meta.folder / x.string("mask")};
      };
      PreferenceFiles files{side("chosen"), side("rejected"), std::nullopt};
      if (const auto margin = s.optional_string("margin")) files.margin = meta.folder / *margin;
      meta.preference[it.key()] = std::move(files);
    }
  }
  return meta;
}

}  // namespace loom::data
