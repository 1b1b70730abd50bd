#pragma once
// Token files, as people prepare text for training (examples/text_data/prepare.py writes
// them with Hugging Face's `tokenizers`), memory-mapped:
//
// - a flat token file: the ids of a whole corpus one after another, little-endian uint16
//   (uint32 when the vocabulary does not fit), no header: the nanoGPT / llm.c convention
//   (np.fromfile(path, np.uint16) reads it). TokenFileDataset serves it as causal-LM
//   windows of block_size tokens: HF run_clm's group_texts (non-overlapping chunks, the
//   remainder dropped, labels = input_ids; the model shifts) applied to the whole file at
//   once (run_clm applies it to each map batch of 1000 texts, so it drops a remainder per
//   batch), or windows every `stride` tokens.
// - a ragged token file: variable-length examples, three files: the ids (as above), uint64
//   offsets (n + 1 values: example i is ids [offsets[i], offsets[i+1])) and labels, whose
//   kind is HF's problem_type (LabelKind): int64 class ids (one per example, or one per
//   token), or little-endian float32, num_labels per example, row after row (multi-label:
//   0/1 multi-hot rows; regression: the targets). TokenSequenceDataset serves its examples,
//   truncated to max_length, and pads batches with DataCollatorWithPadding (data/padding.hpp).
// - meta.json beside them (read_token_meta) names the files, the element type, the
//   vocabulary size and the special token ids.
//
// The mappings are read-only and shared: copies of a dataset (the Trainer's AnyDataset, a
// DataLoader per rank) read the same pages, and get/get_batch may run on several threads.

#include <loom/config/inline.hpp>
#include <loom/data/padding.hpp>
#include <loom/data/text.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::data {

/// The element type of a token file (little-endian, unsigned).
enum class TokenDtype { uint16, uint32 };

/// "uint16" or "uint32" (numpy's names, as meta.json writes them); anything else is a loom::Error.
LOOM_INLINE TokenDtype token_dtype(std::string_view name);
/// Bytes per token id.
[[nodiscard]] constexpr std::size_t element_size(TokenDtype dtype) { return dtype == TokenDtype::uint16 ? 2 : 4; }

/// A whole file mapped read-only into memory (POSIX mmap), unmapped at destruction. Move-only.
class MappedFile {
 public:
  /// Maps `path`; a missing file, a folder or a file that cannot be opened or mapped is a loom::Error naming it.
  LOOM_INLINE explicit MappedFile(const std::filesystem::path& path);
  LOOM_INLINE ~MappedFile();
  LOOM_INLINE MappedFile(MappedFile&& other) noexcept;
  LOOM_INLINE MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The file's bytes (empty for an empty file).
  [[nodiscard]] std::span<const std::byte> bytes() const { return {data_, size_}; }
  /// The file mapped.
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }
  /// Drops this process's pages of bytes [begin, end) (the whole pages inside; madvise
  /// MADV_DONTNEED): they leave its resident memory and are read from the file again if
  /// touched, so the contents seen never change. A reader streaming through a file larger
  /// than memory calls it behind itself.
  LOOM_INLINE void release(std::size_t begin, std::size_t end) const;

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A memory-mapped file of token ids of one element type.
class TokenFile {
 public:
  /// Maps `path`; its size must be a multiple of the element size (a loom::Error naming the file otherwise).
  LOOM_INLINE TokenFile(const std::filesystem::path& path, TokenDtype dtype);
  /// Number of token ids.
  [[nodiscard]] int64_t size() const { return size_; }
  /// The element type.
  [[nodiscard]] TokenDtype dtype() const { return dtype_; }
  /// The file.
  [[nodiscard]] const std::filesystem::path& path() const { return map_.path(); }
  /// Copies ids [begin, begin + count) into `out` as int64 (the range must lie in the file).
  LOOM_INLINE void read(int64_t begin, int64_t count, int64_t* out) const;
  /// Ids [begin, begin + count) as a new int64 tensor.
  [[nodiscard]] LOOM_INLINE torch::Tensor slice(int64_t begin, int64_t count) const;
  /// Drops this process's pages of ids [begin, end) (MappedFile::release).
  void release(int64_t begin, int64_t end) const {
    const auto width = static_cast<int64_t>(element_size(dtype_));
    map_.release(static_cast<std::size_t>(std::max<int64_t>(begin, 0) * width),
                 static_cast<std::size_t>(std::min(end, size_) * width));
  }
  /// Fails with a loom::Error naming the file, the position and the id unless every id is
  /// below `vocab_size` (one pass over the file).
  LOOM_INLINE void check_ids_below(int64_t vocab_size) const;

 private:
  MappedFile map_;
  TokenDtype dtype_;
  int64_t size_ = 0;
};

/// How TokenFileDataset cuts a token file into windows.
struct TokenFileOptions {
  TokenDtype dtype = TokenDtype::uint16;  ///< the file's element type (meta.json's "dtype")
  int64_t block_size = 1024;              ///< tokens per window (HF run_clm's block_size)
  std::optional<int64_t> stride;          ///< window starts this far apart (default: block_size, no overlap)
  std::optional<int64_t> vocab_size;      ///< when given, every id must be below it (checked once at open)
};

/// Causal-LM windows of a flat token file: window i is ids [i * stride, i * stride +
/// block_size); with the default stride, HF run_clm's group_texts (the ids cut into
/// non-overlapping blocks, the remainder dropped). Batches are CausalLMBatch with labels equal
/// to input_ids (a copy): the model shifts them, as HF's *ForCausalLM do.
class TokenFileDataset {
 public:
  /// Maps `file`. A loom::Error names the file when it is missing, its size is not a multiple
  /// of the element size, it holds fewer tokens than one block, or an id is >= vocab_size.
  LOOM_INLINE TokenFileDataset(const std::filesystem::path& file, const TokenFileOptions& options);
  /// Number of windows.
  [[nodiscard]] int64_t size() const { return windows_; }
  /// Tokens per window.
  [[nodiscard]] int64_t block_size() const { return block_size_; }
  /// Distance between window starts.
  [[nodiscard]] int64_t stride() const { return stride_; }
  /// The mapped file.
  [[nodiscard]] const TokenFile& file() const { return *file_; }
  /// Windows `indices`: input_ids and labels int64 [indices.size(), block_size].
  [[nodiscard]] LOOM_INLINE CausalLMBatch get_batch(std::span<const int64_t> indices) const;

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t block_size_ = 0;
  int64_t stride_ = 0;
  int64_t windows_ = 0;
};

/// The three files of a ragged token file.
struct RaggedTokenFiles {
  std::filesystem::path ids;      ///< the examples' ids, one after another
  std::filesystem::path offsets;  ///< uint64, n + 1 values: 0, the end of example 0, ..., the number of ids
  std::filesystem::path labels;   ///< the labels (LabelKind says how they are stored); empty: no labels
};

/// What a label file holds: HF's problem_type, which meta.json's classification section
/// names ("problem_type"; absent: single_label_classification).
enum class LabelKind {
  class_id,    ///< single_label_classification: int64 class ids, one per example (or per id)
  multi_hot,   ///< multi_label_classification: float32, num_labels values of 0 or 1 per example
  regression,  ///< regression: float32, num_labels finite targets per example
};

/// The LabelKind of HF's problem_type name; another name is a loom::Error listing HF's three.
LOOM_INLINE LabelKind label_kind(std::string_view problem_type);
/// HF's problem_type name of `kind` ("single_label_classification", ...).
[[nodiscard]] LOOM_INLINE std::string_view problem_type_name(LabelKind kind);

/// How TokenSequenceDataset reads a ragged token file.
struct TokenSequenceOptions {
  TokenDtype dtype = TokenDtype::uint16;  ///< the ids' element type (meta.json's "dtype")
  std::optional<int64_t> max_length;      ///< truncation: an example keeps its first max_length ids
  std::optional<int64_t> vocab_size;      ///< when given, every id must be below it (checked once at open)
  bool labels_per_token = false;          ///< the labels file holds one label per id (token classification)
  /// What the labels file holds; float kinds take num_labels values per example and no labels_per_token.
  LabelKind label_kind = LabelKind::class_id;
  /// The model's label count. class_id: when given, every label must lie in [0, num_labels)
  /// (per-token labels may also be -100, HF's ignored index). multi_hot and regression: required,
  /// the values per example. Checked once at open.
  std::optional<int64_t> num_labels;
  DataCollatorWithPadding collator;       ///< how collate() pads a batch (set its pad_token_id)
};

/// Variable-length examples of a ragged token file, each a TokenSequence (int64 input_ids,
/// truncated to max_length; its label: a 0-dim int64 class id, its per-token int64 labels, a
/// float [num_labels] row (multi-label, or regression with several targets) or a 0-dim float
/// (regression with one target)), batched into SequenceBatch by the options'
/// DataCollatorWithPadding through collate() (labels int64 [B], int64 [B, T], float [B,
/// num_labels] or float [B]): the Trainer, DataLoader and AnyDataset call it.
/// with_collator() replaces the collator.
class TokenSequenceDataset {
 public:
  /// Maps the files and checks them (offsets start at 0, never decrease and end at the number
  /// of ids; one label per example or per id, or num_labels floats per example; ids below
  /// vocab_size; class ids below num_labels; float labels finite, multi-hot ones 0 or 1):
  /// a loom::Error names the file (and the example).
  LOOM_INLINE TokenSequenceDataset(const RaggedTokenFiles& files, TokenSequenceOptions options);
  /// Number of examples.
  [[nodiscard]] int64_t size() const { return size_; }
  /// Example `i`.
  [[nodiscard]] LOOM_INLINE TokenSequence get(int64_t i) const;
  /// One padded batch of `examples`.
  [[nodiscard]] SequenceBatch collate(const std::vector<TokenSequence>& examples) const { return collator_(examples); }
  /// The length of example `i` after truncation.
  [[nodiscard]] LOOM_INLINE int64_t length(int64_t i) const;
  /// Every example's length after truncation, int64 [size()] (for length-grouped sampling).
  [[nodiscard]] LOOM_INLINE torch::Tensor lengths() const;
  /// The longest batch row collate() can make: the longest example after truncation, padded
  /// as the collator pads (the memory plan's sequence length); 0 without examples.
  [[nodiscard]] LOOM_INLINE int64_t max_sequence_length() const;
  /// The collator collate() uses.
  [[nodiscard]] const DataCollatorWithPadding& collator() const { return collator_; }

 private:
  LOOM_INLINE std::pair<int64_t, int64_t> span_of(int64_t i) const;  // [begin, end) in the ids, truncated
  // Fails naming `file`, the example and the label unless every label is in [0, num_labels) (or -100 per token).
  LOOM_INLINE void check_labels_below(const std::filesystem::path& file, int64_t num_labels) const;
  // Float labels: fails naming `file`, the example and the column unless each is finite (and 0 or 1 for multi_hot).
  LOOM_INLINE void check_float_labels(const std::filesystem::path& file) const;
  std::shared_ptr<const TokenFile> ids_;
  std::shared_ptr<const MappedFile> offsets_;
  std::shared_ptr<const MappedFile> labels_;  // null without labels
  int64_t size_ = 0;
  std::optional<int64_t> max_length_;
  bool labels_per_token_ = false;
  LabelKind label_kind_ = LabelKind::class_id;
  int64_t label_width_ = 1;  // float labels per example
  DataCollatorWithPadding collator_;
};

/// The three files of an instruction (SFT) split: ragged examples as RaggedTokenFiles' ids and
/// offsets, and a loss mask, uint8, one per id: 1 on completion tokens (the loss counts them),
/// 0 on prompt tokens (labelled -100). data/sft.hpp's SftDataset reads them.
struct SftFiles {
  std::filesystem::path ids, offsets, mask;
};

/// A split of preference pairs (prepare.py --preference): the chosen and the rejected side,
/// each as instruction files (the prompt, then the completion under mask 1), pair i being
/// example i of both; and the margins, float32 little-endian, one a pair, when the data has them.
struct PreferenceFiles {
  SftFiles chosen, rejected;
  std::optional<std::filesystem::path> margin;
};

namespace detail {
/// The little-endian unsigned integer of type T at element `i` of `bytes`.
template <class T>
T load_le(const std::byte* bytes, int64_t i) {
  T v;
  std::memcpy(&v, bytes + static_cast<std::size_t>(i) * sizeof(T), sizeof(T));
  if constexpr (std::endian::native == std::endian::big) {
    T swapped = 0;
    for (std::size_t b = 0; b < sizeof(T); ++b) swapped = static_cast<T>((swapped << 8) | ((v >> (8 * b)) & 0xff));
    v = swapped;
  }
  return v;
}
/// The number of examples of a ragged file's offsets (n + 1 uint64 values from 0, never
/// decreasing, and increasing unless `allow_empty`: no example is empty, ending at the number
/// of ids in `ids`); a loom::Error names the file otherwise.
LOOM_INLINE int64_t checked_offsets(const MappedFile& offsets, const TokenFile& ids, bool allow_empty);
}  // namespace detail

/// What meta.json (written by examples/text_data/prepare.py) says about a folder of token files.
struct TokenFileMeta {
  std::filesystem::path folder;               ///< the folder of meta.json; the paths below lie in it
  TokenDtype dtype = TokenDtype::uint16;      ///< "dtype"
  int64_t vocab_size = 0;                     ///< "vocab_size"
  std::filesystem::path tokenizer_file;       ///< "tokenizer_file" (tokenizer.json)
  std::optional<int64_t> eos_token_id;        ///< "eos_token_id": separates documents in the flat files
  std::optional<int64_t> pad_token_id;        ///< "pad_token_id"
  std::optional<int64_t> cls_token_id;        ///< "cls_token_id"
  std::optional<int64_t> sep_token_id;        ///< "sep_token_id"
  std::optional<int64_t> mask_token_id;       ///< "mask_token_id" (masked-LM data, data/mlm.hpp)
  std::map<std::string, std::filesystem::path> lm;          ///< "lm": split -> flat token file
  std::map<std::string, RaggedTokenFiles> classification;  ///< "classification": split -> ragged files
  std::map<std::string, SftFiles> sft;                      ///< "sft": split -> instruction files with loss masks
  std::map<std::string, PreferenceFiles> preference;        ///< "preference": split -> the pairs' files
  std::vector<std::string> label_names;       ///< "classification"."label_names"
  /// "classification"."problem_type" (HF's name; absent: single_label_classification), with
  /// "label_dtype" ("int64" for class ids, "float32" otherwise) checked against it when given.
  LabelKind label_kind = LabelKind::class_id;

  /// The flat token file of `split` ("train", "val"); a loom::Error lists the splits there are.
  [[nodiscard]] LOOM_INLINE const std::filesystem::path& lm_file(std::string_view split) const;
  /// The instruction files of split `split` ("train", "val").
  [[nodiscard]] LOOM_INLINE const SftFiles& sft_files(std::string_view split) const;
  /// The preference files of split `split` ("train", "val").
  [[nodiscard]] LOOM_INLINE const PreferenceFiles& preference_files(std::string_view split) const;
  /// The ragged files of classification split `split`.
  [[nodiscard]] LOOM_INLINE const RaggedTokenFiles& classification_files(std::string_view split) const;
  /// TokenFileOptions for windows of `block_size`, with this folder's dtype and vocab_size.
  [[nodiscard]] TokenFileOptions lm_options(int64_t block_size) const {
    return {.dtype = dtype, .block_size = block_size, .stride = {}, .vocab_size = vocab_size};
  }
  /// TokenSequenceOptions with this folder's dtype, vocab_size, pad id and label kind (and
  /// num_labels, the number of label_names when there are any), truncating to `max_length`.
  [[nodiscard]] LOOM_INLINE TokenSequenceOptions sequence_options(std::optional<int64_t> max_length = {}) const;
};

/// Reads `meta_json` strictly (config/json.hpp): dtype and vocab_size are required, "lm" and
/// "classification" optional; every error names the file and the field.
LOOM_INLINE TokenFileMeta read_token_meta(const std::filesystem::path& meta_json);

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/token_file.ipp>
#endif
