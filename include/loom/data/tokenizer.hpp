#pragma once
// Text in and out without Python: Hugging Face's tokenizer.json read and run in C++, with the
// ids of the `tokenizers` package (tests/data/test_tokenizer.cpp checks them on the KJV text).
//
//   auto tok = loom::data::Tokenizer::from_file("data/kjv/tokenizer.json");
//   std::vector<int64_t> ids = tok.encode("In the beginning");
//   std::string text = tok.decode(ids);
//   loom::data::EncodeOptions o;  // HF's tokenizer(texts, padding=True, truncation=True, max_length=128)
//   o.truncation = true;
//   o.max_length = 128;
//   loom::data::SequenceBatch batch = tok(texts, o);  // input_ids, attention_mask
//
// What it runs (anything else in the file is refused with one `loom:` line naming the field):
//   normalizer     BertNormalizer (clean_text, handle_chinese_chars, strip_accents, lowercase),
//                  Lowercase, NFC, NFD, NFKC, NFKD, StripAccents, Prepend, Replace (a string or a
//                  regex), Precompiled (SentencePiece's charsmap: T5, XLM-R), Sequence of these
//   pre_tokenizer  ByteLevel (GPT-2's regex or none), Split (a regex or a string; Isolated,
//                  Removed, MergedWithPrevious, MergedWithNext), BertPreTokenizer, Whitespace,
//                  WhitespaceSplit, Metaspace (prepend_scheme always / first / never, split),
//                  Sequence of these; regexes through PCRE2 (Unicode properties)
//   model          BPE, byte-level (merges by rank, ignore_merges as Llama 3 sets it) or on
//                  characters as SentencePiece's (Llama 2, Mistral, Gemma: byte_fallback to
//                  <0xXX> tokens, fuse_unk, continuing_subword_prefix, end_of_word_suffix);
//                  Unigram (the best-scoring segmentation, byte_fallback); WordPiece (greedy
//                  longest match, its continuing_subword_prefix)
//   post_processor TemplateProcessing (single sequences), BertProcessing, RobertaProcessing,
//                  ByteLevel, Sequence of these
//   decoder        ByteLevel, WordPiece (prefix, cleanup), Replace, ByteFallback, Fuse, Strip,
//                  Metaspace, Sequence of these, none
//   added_tokens   split out before the model (leftmost longest match; lstrip, rstrip,
//                  single_word, normalized as the file says)
// The file's own "truncation" and "padding" are not applied (transformers' rule: each call's
// EncodeOptions decide); its padding's pad_id is the default pad id.
//
// This header does not include PCRE2 or utf8proc; under loom::compiled a program that uses it
// compiles no regex code. It is not part of loom.hpp: a program includes it itself.

#include <loom/config/inline.hpp>
#include <loom/data/padding.hpp>
#include <loom/data/text.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::data {

namespace detail {
struct TokenizerImpl;
}

/// Which end a too long sequence loses (HF's tokenizer.truncation_side).
enum class TruncationSide { right, left };

/// The options of one call, with the names of transformers' `tokenizer(text, ...)`.
struct EncodeOptions {
  bool add_special_tokens = true;                         ///< the post-processor's tokens ([CLS] ... [SEP], <|begin_of_text|>)
  bool truncation = false;                                ///< cut each sequence to max_length ids (special tokens included)
  std::optional<int64_t> max_length;                      ///< the truncation length, and the length of PaddingStrategy::max_length
  TruncationSide truncation_side = TruncationSide::right; ///< which end truncation removes
  PaddingStrategy padding = PaddingStrategy::longest;     ///< the batch's length (operator() only)
  PaddingSide padding_side = PaddingSide::right;          ///< where padding goes (operator() only)
  std::optional<int64_t> pad_to_multiple_of;              ///< round the padded length up (operator() only)
  std::optional<int64_t> pad_token_id;                    ///< the padding id; default: the tokenizer's pad_token_id()
};

/// A tokenizer read from Hugging Face's tokenizer.json (the `tokenizers` package's format).
/// Copies share the read model; every member is const and may be called from several threads.
class Tokenizer {
 public:
  /// Reads `path`: a tokenizer.json, or a folder holding one (its tokenizer_config.json, when
  /// present, names the pad token, as AutoTokenizer reads it).
  LOOM_INLINE static Tokenizer from_file(const std::filesystem::path& path);
  /// Reads a tokenizer.json's text; `where` names it in errors.
  LOOM_INLINE static Tokenizer from_json(std::string_view json_text, std::string_view where = "tokenizer.json");

  /// The ids of `text` (UTF-8), truncated as `options` say (padding is for batches).
  /// HF: tokenizer(text)["input_ids"] / tokenizers' Tokenizer.encode(text).ids.
  [[nodiscard]] LOOM_INLINE std::vector<int64_t> encode(std::string_view text, const EncodeOptions& options = {}) const;
  /// encode() of each text.
  [[nodiscard]] LOOM_INLINE std::vector<std::vector<int64_t>> encode_batch(std::span<const std::string> texts,
                                                                          const EncodeOptions& options = {}) const;
  /// The padded batch of `texts`: input_ids and attention_mask (int64 [batch, length]);
  /// labels undefined. HF: tokenizer(texts, padding=..., truncation=..., max_length=...,
  /// return_tensors="pt").
  [[nodiscard]] LOOM_INLINE SequenceBatch operator()(std::span<const std::string> texts,
                                                     const EncodeOptions& options = {}) const;

  /// The text of `ids` through the file's decoder; special tokens (added tokens marked
  /// special) are left out when `skip_special_tokens` (tokenizers' Tokenizer.decode default).
  /// Bytes that do not form UTF-8 become U+FFFD, as in Python.
  [[nodiscard]] LOOM_INLINE std::string decode(std::span<const int64_t> ids, bool skip_special_tokens = true) const;

  /// The id of a token spelled as in the vocabulary or added_tokens, if any (HF's token_to_id).
  [[nodiscard]] LOOM_INLINE std::optional<int64_t> token_to_id(std::string_view token) const;
  /// The token of `id` as the vocabulary spells it (HF's id_to_token).
  [[nodiscard]] LOOM_INLINE std::string id_to_token(int64_t id) const;
  /// One past the largest id, added tokens included (HF's get_vocab_size(with_added_tokens=True)).
  [[nodiscard]] LOOM_INLINE int64_t vocab_size() const;
  /// The pad id: tokenizer.json's padding.pad_id, else tokenizer_config.json's pad_token (from_file of a folder).
  [[nodiscard]] LOOM_INLINE std::optional<int64_t> pad_token_id() const;
  /// How many ids the post-processor adds to one sequence (HF's num_special_tokens_to_add(False)).
  [[nodiscard]] LOOM_INLINE int64_t num_special_tokens_to_add() const;

 private:
  explicit Tokenizer(std::shared_ptr<const detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const detail::TokenizerImpl> impl_;
};

}  // namespace loom::data

#if defined(LOOM_HEADER_ONLY)
#include <loom/data/impl/tokenizer.ipp>
#endif
