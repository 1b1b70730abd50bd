#pragma once
// Definitions of data/tokenizer.hpp (compiled once with LOOM_SEPARATE_COMPILATION). The
// pipeline is the `tokenizers` package's: added tokens split out of the raw text, the
// normalizer, added tokens marked `normalized` split out of the normalized text, the
// pre-tokenizer, the model on each piece, truncation, the post-processor's special tokens.
// Regexes go through PCRE2 (UTF + UCP, JIT), Unicode properties and normal forms through
// utf8proc. A byte-level BPE works on raw bytes: its vocabulary is read back from GPT-2's
// byte-to-character alphabet once, so no piece is ever mapped to that alphabet.

#include <loom/config/json.hpp>
#include <loom/core/error.hpp>
#include <loom/data/tokenizer.hpp>

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <utf8proc.h>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace loom::data::detail {

namespace tok {

// --- UTF-8 ------------------------------------------------------------------------------

/// The length of the valid UTF-8 sequence at s[i], or 0 when none starts there; `maximal`
/// receives the length of its longest valid prefix (the maximal subpart the Unicode
/// standard replaces by one U+FFFD, as Python and Rust do).
inline std::size_t utf8_sequence(std::string_view s, std::size_t i, std::size_t& maximal) {
  const auto b = static_cast<unsigned char>(s[i]);
  maximal = 1;
  if (b < 0x80) return 1;
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) need = 1;
  else if (b == 0xE0) need = 2, lo = 0xA0;
  else if (b == 0xED) need = 2, hi = 0x9F;
  else if (b >= 0xE1 && b <= 0xEF) need = 2;
  else if (b == 0xF0) need = 3, lo = 0x90;
  else if (b == 0xF4) need = 3, hi = 0x8F;
  else if (b >= 0xF1 && b <= 0xF3) need = 3;
  else return 0;
  for (std::size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
    maximal = k + 1;
  }
  return need + 1;
}

/// The code point at s[i] (valid UTF-8), advancing i past it.
inline char32_t next_cp(std::string_view s, std::size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) return ++i, b;
  const std::size_t n = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
  char32_t cp = b & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

inline void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

/// `bytes` as UTF-8, each maximal invalid subpart replaced by U+FFFD (Rust's from_utf8_lossy).
inline std::string lossy_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    std::size_t maximal = 0;
    const std::size_t n = utf8_sequence(bytes, i, maximal);
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += maximal;
    }
  }
  return out;
}

inline void check_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t maximal = 0;
    const std::size_t n = utf8_sequence(text, i, maximal);
    check(n > 0, "Tokenizer: the text is not valid UTF-8 (byte {} of {})", i, text.size());
    i += n;
  }
}

// --- Unicode properties (utf8proc), with the definitions of Rust's std and `tokenizers` ---

inline int category(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }

/// Rust's char::is_whitespace (the White_Space property).
inline bool is_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
/// BertNormalizer's control characters: categories Cc, Cf, Cs and Co, except \t \n \r. Not Cn:
/// `tokenizers` keeps an unassigned code point (its category tables count "other" as Cc, Cf,
/// Co and Cs), which then goes to the model (WordPiece: [UNK]).
inline bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
         k == UTF8PROC_CATEGORY_CO;
}
/// BertPreTokenizer's punctuation: ASCII punctuation or a Unicode P* category.
inline bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  const int k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}
inline bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}
/// The letters of Other_Alphabetic outside L, M and N: circled and squared Latin letters (So),
/// word characters to Rust's regex and to Oniguruma. The one list of them: is_alphabetic_symbol
/// tests a character, and the regex classes (onig_word, rust_word) spell the same ranges.
inline constexpr std::array<std::pair<char32_t, char32_t>, 4> kAlphabeticSymbols = {
    {{0x24B6, 0x24E9}, {0x1F130, 0x1F149}, {0x1F150, 0x1F169}, {0x1F170, 0x1F189}}};
inline bool is_alphabetic_symbol(char32_t c) {
  return std::ranges::any_of(kAlphabeticSymbols, [c](const auto& r) { return c >= r.first && c <= r.second; });
}
/// Rust regex's \w (`single_word` added tokens: tokenizers' ^\w and \w$): Alphabetic, marks,
/// decimal digits, connector punctuation and the joiners U+200C/U+200D; not the other numbers
/// (No: U+00B2, U+00BD, U+2460, ...).
inline bool is_word_char(char32_t c) {
  const int k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_ND) || k == UTF8PROC_CATEGORY_NL ||
         k == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D || is_alphabetic_symbol(c);
}
/// Rust's char::to_lowercase: the simple mapping, and U+0130's two-character one.
inline void append_lower(std::string& out, char32_t c) {
  if (c == 0x130) {
    out.append("i\xCC\x87");
    return;
  }
  append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

/// utf8proc_map with `options` (a normal form).
inline std::string normal_form(std::string_view s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  check(n >= 0, "Tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<const char*>(out), static_cast<std::size_t>(n));
  std::free(out);
  return result;
}

/// Each code point of `s` through `f(out, cp)`.
template <class F>
std::string map_chars(std::string_view s, F&& f) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (std::size_t i = 0; i < s.size();) f(out, next_cp(s, i));
  return out;
}

/// NFD of `s` without its marks: the nonspacing ones (Mn, BertNormalizer) or all (M*).
inline std::string strip_marks(std::string_view s, bool nonspacing_only) {
  std::string decomposed = normal_form(s, UTF8PROC_DECOMPOSE);
  return map_chars(decomposed, [&](std::string& out, char32_t c) {
    const int k = category(c);
    const bool mark = nonspacing_only ? k == UTF8PROC_CATEGORY_MN
                                      : (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME);
    if (!mark) append_utf8(out, c);
  });
}

// --- GPT-2's byte-to-character alphabet ---------------------------------------------------

struct ByteAlphabet {
  std::array<char32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code point -> byte, -1 outside the alphabet
  ByteAlphabet() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      to_byte[to_cp[static_cast<std::size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
  /// The bytes a token of the alphabet stands for, or nothing when a character is outside it.
  [[nodiscard]] std::optional<std::string> bytes_of(std::string_view token) const {
    std::string out;
    for (std::size_t i = 0; i < token.size();) {
      const char32_t c = next_cp(token, i);
      if (c >= to_byte.size() || to_byte[c] < 0) return std::nullopt;
      out.push_back(static_cast<char>(to_byte[c]));
    }
    return out;
  }
};
inline const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

/// GPT-2's pre-tokenizer pattern (tokenizers' ByteLevel with use_regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// --- string-keyed maps with string_view lookups -------------------------------------------

struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// --- PCRE2 ------------------------------------------------------------------------------

/// Oniguruma's \s (tokenizers' regexes run in Oniguruma): the White_Space property, as a PCRE2
/// class's contents. PCRE2's \s adds U+180E (Mongolian vowel separator, a space before Unicode 6.3).
inline constexpr std::string_view kOnigSpace =
    R"(\t\n\x0B\f\r\x20\x85\xA0\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
/// Its complement (\S inside a class).
inline constexpr std::string_view kOnigNonSpace =
    R"(\x00-\x08\x0E-\x1F\x21-\x84\x86-\x9F\xA1-\x{167F}\x{1681}-\x{1FFF}\x{200B}-\x{2027}\x{202A}-\x{202E})"
    R"(\x{2030}-\x{205E}\x{2060}-\x{2FFF}\x{3001}-\x{10FFFF})";
/// kAlphabeticSymbols as the ranges of a PCRE2 class.
inline std::string alphabetic_symbol_ranges() {
  std::string out;
  for (const auto& [first, last] : kAlphabeticSymbols)
    out += fmt::format("\\x{{{:X}}}-\\x{{{:X}}}", static_cast<uint32_t>(first), static_cast<uint32_t>(last));
  return out;
}
/// Oniguruma's \w as a PCRE2 class's contents: letters, marks, decimal and letter numbers,
/// connector punctuation, the circled and squared Latin letters (Other_Alphabetic) and, from
/// Latin-1, U+00B2 U+00B3 U+00B9 U+00BC-U+00BE; PCRE2's \w is L, N and '_' (all numbers, no marks).
inline const std::string& onig_word() {
  static const std::string word = R"(\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\xB2\xB3\xB9\xBC-\xBE)" + alphabetic_symbol_ranges();
  return word;
}
/// Rust regex's \w (tokenizers' Whitespace pre-tokenizer): Oniguruma's without the Latin-1
/// numbers, with the joiners U+200C and U+200D.
inline const std::string& rust_word() {
  static const std::string word = R"(\p{L}\p{M}\p{Nd}\p{Nl}\p{Pc}\x{200C}\x{200D})" + alphabetic_symbol_ranges();
  return word;
}

/// A tokenizer.json regex (Oniguruma's syntax) for PCRE2: \s \S \w \W \b \B \h \H spelled out
/// with Oniguruma's classes, in and out of brackets (\W inside brackets stays PCRE2's: its
/// complement has no class spelling); a bracket nested in a bracket (Oniguruma's union, as in
/// BLOOM's [^(\s|[.,!?…。，、।۔،])]+) joined into its parent; a negated nested bracket and the
/// intersection && refused (PCRE2 has neither); the rest as it is.
inline std::string onig_to_pcre2(std::string_view p, std::string_view where) {
  const auto refuse = [&](std::string_view what) {
    fail("{}: the regex '{}' uses {}, which loom does not read (PCRE2 has no such class)", where, p, what);
  };
  const std::string word = "[" + onig_word() + "]";
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  int depth = 0;  // of brackets, nested ones counted
  for (std::size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E: literal text
        const std::size_t end = p.find("\\E", i + 2);
        const std::size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (in_class) {
        if (e == 's') out.append(kOnigSpace);
        else if (e == 'S') out.append(kOnigNonSpace);
        else if (e == 'w') out.append(onig_word());
        else if (e == 'h') out.append("0-9a-fA-F");
        else out.append(p.substr(i, 2));
      } else {
        if (e == 's') out.append("[").append(kOnigSpace).append("]");
        else if (e == 'S') out.append("[^").append(kOnigSpace).append("]");
        else if (e == 'w') out.append(word);
        else if (e == 'W') out.append("[^").append(onig_word()).append("]");
        else if (e == 'b') out.append("(?:(?<=" + word + ")(?!" + word + ")|(?<!" + word + ")(?=" + word + "))");
        else if (e == 'B') out.append("(?:(?<=" + word + ")(?=" + word + ")|(?<!" + word + ")(?!" + word + "))");
        else if (e == 'h') out.append("[0-9a-fA-F]");
        else if (e == 'H') out.append("[^0-9a-fA-F]");
        else out.append(p.substr(i, 2));
      }
      i += 2;
      continue;
    }
    ++i;
    if (!in_class && c == '[') {
      out.push_back(c);
      in_class = true;
      depth = 1;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);  // a leading ']' is literal
    } else if (in_class && c == '[' && i < p.size() && p[i] == ':') {  // [:alpha:]
      const std::size_t end = p.find(":]", i);
      out.push_back(c);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
      }
    } else if (in_class && c == '[') {  // a nested bracket: its members join the parent's
      if (i < p.size() && p[i] == '^') refuse("a negated bracket inside a bracket");
      ++depth;
    } else if (in_class && c == '&' && i < p.size() && p[i] == '&') {
      refuse("the class intersection &&");
    } else if (in_class && c == ']') {
      if (--depth == 0) {
        in_class = false;
        out.push_back(c);
      }
    } else {
      out.push_back(c);
    }
  }
  return out;
}

/// A compiled pattern; find_all() may be called from several threads.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, std::string_view where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL takes no UCP
    const std::string translated = literal ? pattern : onig_to_pcre2(pattern, where);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &error, &offset,
                          nullptr);
    if (code_ == nullptr) {
      // the error and offset in the file's spelling, when that does not compile either
      int plain_error = 0;
      PCRE2_SIZE plain_offset = 0;
      if (pcre2_code* plain = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                                            &plain_error, &plain_offset, nullptr))
        pcre2_code_free(plain);
      else
        error = plain_error, offset = plain_offset;
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail("{}: the regex '{}' does not compile in PCRE2 (offset {}: {})", where, pattern, offset,
           reinterpret_cast<const char*>(message.data()));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT, pcre2_match interprets
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  /// The [start, end) spans of the non-empty matches in `s` (valid UTF-8), left to right.
  void find_all(std::string_view s, std::vector<std::pair<std::size_t, std::size_t>>& out) const {
    struct Scratch {
      pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
      pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
      pcre2_match_context* context = pcre2_match_context_create(nullptr);
      Scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
      ~Scratch() {
        pcre2_match_context_free(context);
        pcre2_jit_stack_free(stack);
        pcre2_match_data_free(data);
      }
    };
    thread_local Scratch scratch;
    out.clear();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t at = 0;
    while (at <= s.size()) {
      const int rc = pcre2_match(code_, subject, s.size(), at, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      check(rc >= 0, "Tokenizer: PCRE2 match failed (error {})", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        at = ov[1];
      } else {  // an empty match: step over one character
        if (ov[0] >= s.size()) break;
        std::size_t i = ov[0];
        next_cp(s, i);
        at = i;
      }
    }
  }

 private:
  pcre2_code* code_ = nullptr;
};

// --- reading the file -------------------------------------------------------------------

[[noreturn]] inline void unsupported(std::string_view where, std::string_view field, std::string_view what,
                                     std::string_view supported) {
  fail("{}: {} {} is not supported (loom reads {})", where, field, what, supported);
}
inline std::string type_of(const nlohmann::json& j, std::string_view where, std::string_view field) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    fail("{}: {} must be an object with a string \"type\"", where, field);
  return j["type"].get<std::string>();
}
/// A field of the wrong JSON type, named by its key; read_tokenizer puts the file before it.
struct WrongType : std::runtime_error {
  using std::runtime_error::runtime_error;
};
inline bool flag(const nlohmann::json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) throw WrongType(fmt::format("'{}' must be true or false, got {}", key, j[key].dump()));
  return j[key].get<bool>();
}
/// The largest id loom reads, one past: 2^24, some 64 times the largest vocabulary in use (the
/// token table is indexed by id, so a stray 2^31 would ask for gigabytes).
inline constexpr int64_t kIdLimit = int64_t{1} << 24;

// --- normalizers -------------------------------------------------------------------------

/// A Split / Replace pattern: {"String": ...} (literal) or {"Regex": ...}.
inline std::shared_ptr<const Regex> read_pattern(const nlohmann::json& j, std::string_view where, const std::string& field) {
  check(j.contains("pattern") && j["pattern"].is_object() &&
            ((j["pattern"].contains("Regex") && j["pattern"]["Regex"].is_string()) ||
             (j["pattern"].contains("String") && j["pattern"]["String"].is_string())),
        "{}: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where, field);
  const bool literal = j["pattern"].contains("String");
  return std::make_shared<const Regex>(j["pattern"][literal ? "String" : "Regex"].get<std::string>(), literal, where);
}

/// A string field of `j` that must be there.
inline std::string required_string(const nlohmann::json& j, const char* key, std::string_view where, const std::string& field) {
  check(j.contains(key) && j[key].is_string(), "{}: {}.{} must be a string", where, field, key);
  return j[key].get<std::string>();
}

/// Every match of `pattern` in `s` replaced by `content` (tokenizers' Replace).
inline std::string replace_all(std::string_view s, const Regex& pattern, std::string_view content) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  pattern.find_all(s, spans);
  if (spans.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  std::size_t last = 0;
  for (const auto& [start, end] : spans) {
    out.append(s.substr(last, start - last));
    out.append(content);
    last = end;
  }
  out.append(s.substr(last));
  return out;
}

/// Standard base64 (with or without '=' padding) to bytes; none when it is not base64.
inline std::optional<std::string> base64_decode(std::string_view text) {
  const auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  for (const char c : text) {
    const int v = value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return out;
}

/// SentencePiece's normalization rules as tokenizers' Precompiled normalizer reads them from
/// precompiled_charsmap: [u32 trie size in bytes][a Darts double-array trie of u32 units][the
/// replacement strings, each ending in NUL]. A chunk of text is replaced by the string of the
/// shortest rule that is a prefix of it (tokenizers' spm_precompiled takes the first match).
struct Charsmap {
  std::vector<uint32_t> units;
  std::string replacements;

  static Charsmap read(std::string_view base64, std::string_view where, const std::string& field) {
    const auto blob = base64_decode(base64);
    check(blob.has_value() && blob->size() >= 4, "{}: {}.precompiled_charsmap is not base64 of a SentencePiece charsmap",
          where, field);
    uint32_t trie_bytes = 0;
    for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>((*blob)[static_cast<std::size_t>(i)]);
    check(trie_bytes % 4 == 0 && trie_bytes <= blob->size() - 4, "{}: {}.precompiled_charsmap holds a trie of {} bytes "
          "in {} (not a SentencePiece charsmap)", where, field, trie_bytes, blob->size());
    Charsmap m;
    m.units.resize(trie_bytes / 4);
    for (std::size_t u = 0; u < m.units.size(); ++u) {
      uint32_t v = 0;
      for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>((*blob)[4 + u * 4 + static_cast<std::size_t>(i)]);
      m.units[u] = v;
    }
    m.replacements = blob->substr(4 + trie_bytes);
    return m;
  }

  /// The replacement of the shortest rule that prefixes `chunk`, if any.
  [[nodiscard]] std::optional<std::string_view> transform(std::string_view chunk) const {
    if (units.empty()) return std::nullopt;
    const auto offset = [](uint32_t unit) -> std::size_t { return (unit >> 10) << ((unit & (1U << 9)) >> 6); };
    std::size_t node = offset(units[0]);
    for (const char ch : chunk) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == 0) return std::nullopt;
      node ^= c;
      if (node >= units.size()) return std::nullopt;
      const uint32_t unit = units[node];
      if ((unit & ((1U << 31) | 0xFFU)) != c) return std::nullopt;  // the unit's label
      node ^= offset(unit);
      if (node >= units.size()) return std::nullopt;
      if (((unit >> 8) & 1U) != 0) {  // a rule ends here: its value is where its replacement starts
        const std::size_t start = units[node] & ((1U << 31) - 1);
        if (start > replacements.size()) return std::nullopt;
        const std::size_t end = replacements.find('\0', start);
        return std::string_view(replacements).substr(start, (end == std::string::npos ? replacements.size() : end) - start);
      }
    }
    return std::nullopt;
  }

  /// tokenizers' Precompiled::normalize: each extended grapheme cluster shorter than 6 bytes
  /// replaced whole when a rule prefixes it, else each character by its own rule or kept.
  [[nodiscard]] std::string apply(std::string_view s) const {
    std::string out;
    out.reserve(s.size());
    const auto emit = [&](std::string_view grapheme) {
      if (grapheme.size() < 6)
        if (const auto whole = transform(grapheme)) {
          out.append(*whole);
          return;
        }
      for (std::size_t i = 0; i < grapheme.size();) {
        const std::size_t start = i;
        next_cp(grapheme, i);
        const std::string_view c = grapheme.substr(start, i - start);
        const auto r = transform(c);
        out.append(r ? *r : c);
      }
    };
    std::size_t begin = 0;
    utf8proc_int32_t state = 0;
    char32_t previous = 0;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t at = i;
      const char32_t c = next_cp(s, i);
      if (at > 0 && utf8proc_grapheme_break_stateful(static_cast<utf8proc_int32_t>(previous), static_cast<utf8proc_int32_t>(c), &state)) {
        emit(s.substr(begin, at - begin));
        begin = at;
      }
      previous = c;
    }
    if (begin < s.size()) emit(s.substr(begin));
    return out;
  }
};

struct Normalizer {
  enum class Kind { bert, lowercase, nfc, nfd, nfkc, nfkd, strip_accents, prepend, replace, precompiled, sequence } kind = Kind::sequence;
  std::shared_ptr<const Charsmap> charsmap;  // Precompiled's (none: the text as it is)
  bool clean_text = true, chinese_chars = true, strip_accents = false, lowercase = true;
  std::string text;                      // Prepend's prefix, Replace's content
  std::shared_ptr<const Regex> pattern;  // Replace's
  std::vector<Normalizer> children;

  static Normalizer read(const nlohmann::json& j, std::string_view where, const std::string& field) {
    const std::string type = type_of(j, where, field);
    Normalizer n;
    if (type == "BertNormalizer") {
      n.kind = Kind::bert;
      n.clean_text = flag(j, "clean_text", true);
      n.chinese_chars = flag(j, "handle_chinese_chars", true);
      n.lowercase = flag(j, "lowercase", true);
      n.strip_accents = flag(j, "strip_accents", n.lowercase);  // null follows lowercase
    } else if (type == "Lowercase") {
      n.kind = Kind::lowercase;
    } else if (type == "NFC") {
      n.kind = Kind::nfc;
    } else if (type == "NFD") {
      n.kind = Kind::nfd;
    } else if (type == "NFKC") {
      n.kind = Kind::nfkc;
    } else if (type == "NFKD") {
      n.kind = Kind::nfkd;
    } else if (type == "StripAccents") {
      n.kind = Kind::strip_accents;
    } else if (type == "Prepend") {  // SentencePiece's layout (Llama 2, Mistral): "▁" before the text
      n.kind = Kind::prepend;
      n.text = required_string(j, "prepend", where, field);
    } else if (type == "Replace") {
      n.kind = Kind::replace;
      n.pattern = read_pattern(j, where, field);
      n.text = required_string(j, "content", where, field);
    } else if (type == "Precompiled") {  // SentencePiece's normalization (T5, XLM-R, ...)
      n.kind = Kind::precompiled;
      if (j.contains("precompiled_charsmap") && !j["precompiled_charsmap"].is_null()) {
        const std::string base64 = required_string(j, "precompiled_charsmap", where, field);
        if (!base64.empty()) n.charsmap = std::make_shared<const Charsmap>(Charsmap::read(base64, where, field));
      }
    } else if (type == "Sequence") {
      n.kind = Kind::sequence;
      check(j.contains("normalizers") && j["normalizers"].is_array(), "{}: {}.normalizers must be an array", where, field);
      for (std::size_t i = 0; i < j["normalizers"].size(); ++i)
        n.children.push_back(read(j["normalizers"][i], where, field + ".normalizers[" + std::to_string(i) + "]"));
    } else {
      unsupported(where, field, "'" + type + "'",
                  "BertNormalizer, Lowercase, NFC, NFD, NFKC, NFKD, StripAccents, Prepend, Replace, Precompiled and "
                  "Sequence of these");
    }
    return n;
  }

  [[nodiscard]] std::string apply(std::string s) const {
    switch (kind) {
      case Kind::bert: {
        if (std::all_of(s.begin(), s.end(), [](char ch) { return static_cast<unsigned char>(ch) < 0x80; })) {
          // ASCII in one pass: no CJK and nothing to strip; controls out, whitespace to ' '
          std::string out;
          out.reserve(s.size());
          for (const char ch : s) {
            const auto c = static_cast<unsigned char>(ch);
            if (clean_text && ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F)) continue;
            if (clean_text && is_whitespace(c)) out.push_back(' ');
            else out.push_back(lowercase && c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : ch);
          }
          return out;
        }
        if (clean_text)
          s = map_chars(s, [](std::string& out, char32_t c) {
            if (c == 0 || c == 0xFFFD || is_control(c)) return;
            append_utf8(out, is_whitespace(c) ? U' ' : c);
          });
        if (chinese_chars)
          s = map_chars(s, [](std::string& out, char32_t c) {
            if (is_chinese(c)) {
              out.push_back(' ');
              append_utf8(out, c);
              out.push_back(' ');
            } else {
              append_utf8(out, c);
            }
          });
        if (strip_accents) s = strip_marks(s, /*nonspacing_only=*/true);
        if (lowercase) s = map_chars(s, append_lower);
        return s;
      }
      case Kind::lowercase: return map_chars(s, append_lower);
      case Kind::nfc: return normal_form(s, UTF8PROC_COMPOSE);
      case Kind::nfd: return normal_form(s, UTF8PROC_DECOMPOSE);
      case Kind::nfkc: return normal_form(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
      case Kind::nfkd: return normal_form(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
      case Kind::strip_accents:
        return map_chars(s, [](std::string& out, char32_t c) {
          const int k = category(c);
          if (k < UTF8PROC_CATEGORY_MN || k > UTF8PROC_CATEGORY_ME) append_utf8(out, c);
        });
      case Kind::prepend: return s.empty() ? s : text + s;  // an empty text stays empty
      case Kind::replace: return replace_all(s, *pattern, text);
      case Kind::precompiled: return charsmap ? charsmap->apply(s) : s;
      case Kind::sequence:
        for (const Normalizer& child : children) s = child.apply(std::move(s));
        return s;
    }
    return s;
  }
};

// --- pre-tokenizers ----------------------------------------------------------------------

using Pieces = std::vector<std::string_view>;

/// Metaspace's prepend_scheme (pre-tokenizer and decoder).
enum class PrependScheme { always, first, never };

/// Metaspace's fields, as tokenizers reads them: replacement (one character), prepend_scheme
/// ("always" unless given; the older add_prefix_space false means "never"), split (true unless given).
inline void read_metaspace(const nlohmann::json& j, std::string_view where, const std::string& field,
                           std::string& replacement, PrependScheme& scheme, bool& split) {
  replacement = required_string(j, "replacement", where, field);
  std::size_t at = 0;
  check(!replacement.empty() && (next_cp(replacement, at), at == replacement.size()),
        "{}: {}.replacement must be one character, got '{}'", where, field, replacement);
  scheme = PrependScheme::always;
  if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
    const std::string s = required_string(j, "prepend_scheme", where, field);
    if (s == "always") scheme = PrependScheme::always;
    else if (s == "first") scheme = PrependScheme::first;
    else if (s == "never") scheme = PrependScheme::never;
    else unsupported(where, field + ".prepend_scheme", "'" + s + "'", "always, first and never");
  }
  if (!flag(j, "add_prefix_space", true)) {
    check(!j.contains("prepend_scheme") || j["prepend_scheme"].is_null() || scheme == PrependScheme::never,
          "{}: {}.add_prefix_space false does not match prepend_scheme (tokenizers refuses it too)", where, field);
    scheme = PrependScheme::never;
  }
  split = flag(j, "split", true);
}

struct PreTokenizer {
  enum class Kind { byte_level, split, bert, whitespace, whitespace_split, metaspace, sequence } kind = Kind::sequence;
  enum class Behavior { isolated, removed, merged_with_previous, merged_with_next } behavior = Behavior::isolated;
  bool add_prefix_space = false;
  std::string replacement;                             // Metaspace's character ("▁")
  PrependScheme prepend_scheme = PrependScheme::always;  // Metaspace's
  bool split_on_replacement = true;                    // Metaspace's split
  std::shared_ptr<const Regex> regex;  // ByteLevel with use_regex, Split, Whitespace
  std::vector<PreTokenizer> children;

  static PreTokenizer read(const nlohmann::json& j, std::string_view where, const std::string& field) {
    const std::string type = type_of(j, where, field);
    PreTokenizer p;
    if (type == "ByteLevel") {
      p.kind = Kind::byte_level;
      p.add_prefix_space = flag(j, "add_prefix_space", true);
      if (flag(j, "use_regex", true)) p.regex = std::make_shared<const Regex>(kGpt2Pattern, false, where);
    } else if (type == "Split") {
      p.kind = Kind::split;
      p.regex = read_pattern(j, where, field);
      const std::string behavior = j.value("behavior", std::string("Isolated"));
      if (behavior == "Isolated") p.behavior = Behavior::isolated;
      else if (behavior == "Removed") p.behavior = Behavior::removed;
      else if (behavior == "MergedWithPrevious") p.behavior = Behavior::merged_with_previous;
      else if (behavior == "MergedWithNext") p.behavior = Behavior::merged_with_next;
      else unsupported(where, field + ".behavior", "'" + behavior + "'", "Isolated, Removed, MergedWithPrevious, MergedWithNext");
      check(!flag(j, "invert", false), "{}: {}.invert true is not supported (loom reads Split with invert false)", where,
            field);
    } else if (type == "BertPreTokenizer") {
      p.kind = Kind::bert;
    } else if (type == "Whitespace") {
      p.kind = Kind::whitespace;
      // \w+|[^\w\s]+ in Rust's regex (tokenizers' Whitespace): its \w (rust_word) and \s (the
      // White_Space property, as Oniguruma's: onig_to_pcre2 spells \s so)
      p.regex = std::make_shared<const Regex>(
          "[" + rust_word() + "]+|[^" + rust_word() + "\\s]+", false, where);
    } else if (type == "WhitespaceSplit") {
      p.kind = Kind::whitespace_split;
    } else if (type == "Metaspace") {  // SentencePiece's layout: spaces as "▁", one before the text
      p.kind = Kind::metaspace;
      read_metaspace(j, where, field, p.replacement, p.prepend_scheme, p.split_on_replacement);
    } else if (type == "Sequence") {
      check(j.contains("pretokenizers") && j["pretokenizers"].is_array(), "{}: {}.pretokenizers must be an array", where,
            field);
      for (std::size_t i = 0; i < j["pretokenizers"].size(); ++i)
        p.children.push_back(read(j["pretokenizers"][i], where, field + ".pretokenizers[" + std::to_string(i) + "]"));
    } else {
      unsupported(where, field, "'" + type + "'",
                  "ByteLevel, Split, BertPreTokenizer, Whitespace, WhitespaceSplit, Metaspace and Sequence of these");
    }
    return p;
  }

  [[nodiscard]] bool has_byte_level() const {
    return kind == Kind::byte_level ||
           std::any_of(children.begin(), children.end(), [](const PreTokenizer& c) { return c.has_byte_level(); });
  }

  /// Splits every piece of `pieces`; new strings (a prefix space) are kept in `arena`.
  /// `at_start`: the first piece begins the original text (Metaspace's prepend_scheme first).
  void apply(Pieces& pieces, std::deque<std::string>& arena, bool at_start = false) const {
    if (kind == Kind::sequence) {
      for (const PreTokenizer& child : children) child.apply(pieces, arena, at_start);
      return;
    }
    Pieces out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    for (std::size_t index = 0; index < pieces.size(); ++index) {
      std::string_view piece = pieces[index];
      switch (kind) {
        case Kind::metaspace: metaspace(piece, at_start && index == 0, arena, out); break;
        case Kind::byte_level:
          // tokenizers' NormalizedString::prepend leaves an empty text empty
          if (add_prefix_space && !piece.empty() && piece.front() != ' ') piece = arena.emplace_back(" " + std::string(piece));
          if (!regex) {
            out.push_back(piece);
            break;
          }
          [[fallthrough]];
        case Kind::split:
        case Kind::whitespace: split(piece, spans, out); break;
        case Kind::bert:
        case Kind::whitespace_split: split_chars(piece, out); break;
        case Kind::sequence: break;
      }
    }
    pieces.swap(out);
  }

 private:
  void split(std::string_view piece, std::vector<std::pair<std::size_t, std::size_t>>& spans, Pieces& out) const {
    regex->find_all(piece, spans);
    const Behavior b = kind == Kind::split ? behavior : Behavior::isolated;
    std::size_t last = 0;
    std::size_t pending_start = std::string_view::npos;  // MergedWithNext: a match waiting for what follows
    for (const auto& [start, end] : spans) {
      if (b == Behavior::merged_with_previous) {
        // the gap and the match are one piece
        out.push_back(piece.substr(last, end - last));
      } else if (b == Behavior::merged_with_next) {
        const std::size_t from = pending_start != std::string_view::npos ? pending_start : last;
        if (start > from) out.push_back(piece.substr(from, start - from));
        pending_start = start;
      } else {
        // Whitespace keeps the matches only (tokenizers: Removed with invert)
        if (start > last && kind != Kind::whitespace) out.push_back(piece.substr(last, start - last));
        if (b == Behavior::isolated) out.push_back(piece.substr(start, end - start));
      }
      last = end;
    }
    const std::size_t from = pending_start != std::string_view::npos ? pending_start : last;
    if (piece.size() > from && kind != Kind::whitespace) out.push_back(piece.substr(from));
  }

  /// Metaspace: every ' ' as the replacement, the replacement before the piece as the scheme
  /// says (unless it starts with one), then (split) a piece starting at each replacement.
  void metaspace(std::string_view piece, bool first, std::deque<std::string>& arena, Pieces& out) const {
    if (piece.empty()) return;
    std::string t;
    t.reserve(piece.size() + replacement.size());
    for (const char ch : piece) {
      if (ch == ' ') t.append(replacement);
      else t.push_back(ch);
    }
    if (!t.starts_with(replacement) &&
        (prepend_scheme == PrependScheme::always || (prepend_scheme == PrependScheme::first && first)))
      t.insert(0, replacement);
    const std::string_view whole = arena.emplace_back(std::move(t));
    if (!split_on_replacement) {
      out.push_back(whole);
      return;
    }
    std::size_t start = 0;
    for (std::size_t at = whole.find(replacement, 1); at != std::string_view::npos; at = whole.find(replacement, at + replacement.size())) {
      out.push_back(whole.substr(start, at - start));
      start = at;
    }
    out.push_back(whole.substr(start));
  }

  /// BertPreTokenizer (whitespace removed, each punctuation character alone) and
  /// WhitespaceSplit (whitespace removed).
  void split_chars(std::string_view piece, Pieces& out) const {
    std::size_t start = 0;
    for (std::size_t i = 0; i < piece.size();) {
      const std::size_t at = i;
      const char32_t c = next_cp(piece, i);
      if (is_whitespace(c)) {
        if (at > start) out.push_back(piece.substr(start, at - start));
        start = i;
      } else if (kind == Kind::bert && is_punctuation(c)) {
        if (at > start) out.push_back(piece.substr(start, at - start));
        out.push_back(piece.substr(at, i - at));
        start = i;
      }
    }
    if (piece.size() > start) out.push_back(piece.substr(start));
  }
};

// --- models ------------------------------------------------------------------------------

/// A BPE, merges by rank: byte-level (GPT-2, Llama 3: the symbols are the piece's bytes) or on
/// characters (SentencePiece's layout: Llama 2, Mistral, Gemma; the symbols are the piece's
/// characters, an unknown one as its bytes' <0xXX> tokens with byte_fallback, else unk).
struct Bpe {
  StringMap<int32_t> vocab;  // raw bytes (byte-level) or the token's text -> id
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool byte_level = true;
  bool ignore_merges = false;
  std::optional<int32_t> unk;
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};  // the <0xXX> tokens' ids (-1: none)
  std::string prefix, suffix;              // continuing_subword_prefix, end_of_word_suffix (on characters)
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  static uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

  /// tokenizers' BPE::merge_word on characters: a known character (with the prefix when not
  /// first, the suffix when last) is its id; an unknown one its bytes' <0xXX> ids when every byte
  /// has one (byte_fallback), else unk, consecutive unks fused into one with fuse_unk. (As in
  /// tokenizers, an unk waiting to be written is written at the next known character, after
  /// byte-fallback ids that came between.)
  void char_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
    std::optional<int32_t> pending;
    std::string s;
    for (std::size_t i = 0; i < piece.size();) {
      const std::size_t start = i;
      next_cp(piece, i);
      s.assign(start > 0 ? prefix : std::string());
      s.append(piece.substr(start, i - start));
      if (i == piece.size()) s.append(suffix);
      if (const auto it = vocab.find(s); it != vocab.end()) {
        if (pending) symbols.push_back(*pending);
        pending.reset();
        symbols.push_back(it->second);
        continue;
      }
      if (byte_fallback && std::all_of(s.begin(), s.end(), [&](char c) { return fallback_id[static_cast<unsigned char>(c)] >= 0; })) {
        for (const char c : s) symbols.push_back(fallback_id[static_cast<unsigned char>(c)]);
        continue;
      }
      if (!unk) continue;
      if (pending && !fuse_unk) symbols.push_back(*pending);
      pending = *unk;
    }
    if (pending) symbols.push_back(*pending);
  }

  /// The same merges as the scan in encode (the lowest rank first, the leftmost of equal ranks)
  /// through a heap of candidate pairs, as tokenizers' Word::merge_all: n log n on a long
  /// piece (SentencePiece's layout leaves a whole text one piece) where the scan is n^2.
  void merge_long(std::vector<int32_t>& symbols) const {
    const std::size_t n = symbols.size();
    std::vector<std::size_t> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (std::size_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1;  // i - 1 wraps at 0: none
    using Candidate = std::tuple<int32_t, std::size_t, int32_t, int32_t>;  // rank, left position, left id, right id
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    const auto push = [&](std::size_t left) {
      if (left >= n || next[left] >= n) return;
      const auto it = merges.find(key(symbols[left], symbols[next[left]]));
      if (it != merges.end()) heap.emplace(it->second.first, left, symbols[left], symbols[next[left]]);
    };
    for (std::size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const auto [rank, left, a, b] = heap.top();
      heap.pop();
      // stale: the left symbol was merged away or changed, or its right neighbour did
      if (!alive[left] || symbols[left] != a || next[left] >= n || symbols[next[left]] != b) continue;
      const std::size_t right = next[left];
      symbols[left] = merges.find(key(a, b))->second.second;
      alive[right] = 0;
      next[left] = next[right];
      if (next[right] < n) prev[next[right]] = left;
      if (prev[left] < n) push(prev[left]);
      push(left);
    }
    std::vector<int32_t> kept;
    kept.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      if (alive[i]) kept.push_back(symbols[i]);
    symbols.swap(kept);
  }

  void encode(std::string_view piece, std::vector<int64_t>& out) const {
    if (ignore_merges)
      if (const auto it = vocab.find(piece); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    {
      std::lock_guard lock(cache_mutex);
      if (const auto it = cache.find(piece); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(piece.size());
    if (!byte_level) {
      char_symbols(piece, symbols);
    } else {
      for (const char ch : piece) {
        const int32_t id = byte_id[static_cast<unsigned char>(ch)];
        if (id >= 0) {
          symbols.push_back(id);
        } else if (unk) {
          if (!(fuse_unk && !symbols.empty() && symbols.back() == *unk)) symbols.push_back(*unk);
        }
      }
    }
    if (symbols.size() > 64) merge_long(symbols);
    while (symbols.size() >= 2) {
      int32_t best_rank = INT32_MAX, best_id = -1;
      std::size_t best_at = 0;
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = merges.find(key(symbols[i], symbols[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          best_id = it->second.second;
          best_at = i;
        }
      }
      if (best_id < 0) break;
      symbols[best_at] = best_id;
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
    if (piece.size() <= 256) {
      std::lock_guard lock(cache_mutex);
      if (cache.size() >= (1U << 18)) cache.clear();
      cache.emplace(std::string(piece), std::move(symbols));
    }
  }
};

/// WordPiece: the longest vocabulary entry from the left, continuations with the prefix.
struct WordPiece {
  StringMap<int32_t> vocab;
  int32_t unk = 0;
  std::string prefix = "##";
  std::size_t max_chars = 100;

  void encode(std::string_view word, std::vector<int64_t>& out) const {
    std::size_t chars = 0;
    for (const char ch : word) chars += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
    if (chars > max_chars) {
      out.push_back(unk);
      return;
    }
    const std::size_t mark = out.size();
    std::string candidate;
    for (std::size_t start = 0; start < word.size();) {
      std::size_t end = word.size();
      int32_t found = -1;
      while (end > start) {
        candidate.assign(start > 0 ? prefix : std::string());
        candidate.append(word.substr(start, end - start));
        if (const auto it = vocab.find(candidate); it != vocab.end()) {
          found = it->second;
          break;
        }
        do --end;  // back to the previous character boundary
        while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
      }
      if (found < 0) {
        out.resize(mark);
        out.push_back(unk);
        return;
      }
      out.push_back(found);
      start = end;
    }
  }
};

/// The ids of the <0x00> .. <0xFF> tokens of `ids` (-1 where one is missing): byte_fallback's.
inline std::array<int32_t, 256> fallback_ids(const StringMap<int32_t>& ids) {
  std::array<int32_t, 256> out{};
  out.fill(-1);
  for (int byte = 0; byte < 256; ++byte)
    if (const auto it = ids.find(fmt::format("<0x{:02X}>", byte)); it != ids.end()) out[static_cast<std::size_t>(byte)] = it->second;
  return out;
}

/// Unigram (SentencePiece's, T5 and XLM-R): the segmentation of highest total score over the
/// vocabulary's pieces (Viterbi, as tokenizers' encode_optimized), a character no piece starts
/// with scored min_score - 10 as unk; consecutive unks fused; a fused unk's bytes as <0xXX>
/// tokens with byte_fallback.
struct Unigram {
  StringMap<int32_t> vocab;
  std::vector<double> scores;
  std::optional<int32_t> unk;
  bool byte_fallback = false;
  std::array<int32_t, 256> fallback_id{};
  std::size_t max_bytes = 0;  // the longest piece
  double min_score = 0;
  std::string where;
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  void encode(std::string_view piece, std::vector<int64_t>& out) const {
    if (piece.empty()) return;
    {
      std::lock_guard lock(cache_mutex);
      if (const auto it = cache.find(piece); it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    struct Node {
      double score = 0;
      std::size_t start = std::string_view::npos;  // npos: not reached
      int32_t id = -1;
    };
    const std::size_t n = piece.size();
    const double unk_score = min_score - 10.0;
    std::vector<Node> best(n + 1);
    for (std::size_t start = 0; start < n;) {
      std::size_t after = start;
      next_cp(piece, after);
      const std::size_t char_bytes = after - start;
      const double till = best[start].score;
      bool single = false;
      for (std::size_t len = 1; len <= max_bytes && start + len <= n; ++len) {
        if (start + len < n && (static_cast<unsigned char>(piece[start + len]) & 0xC0) == 0x80) continue;
        const auto it = vocab.find(piece.substr(start, len));
        if (it == vocab.end()) continue;
        const double candidate = scores[static_cast<std::size_t>(it->second)] + till;
        Node& node = best[start + len];
        if (node.start == std::string_view::npos || candidate > node.score) node = {candidate, start, it->second};
        single = single || len == char_bytes;
      }
      if (!single) {
        check(unk.has_value(), "{}: the text holds '{}', which no piece of the Unigram model starts with, and the "
              "model has no unk_id", where, piece.substr(start, char_bytes));
        Node& node = best[start + char_bytes];
        const double candidate = unk_score + till;
        if (node.start == std::string_view::npos || candidate > node.score) node = {candidate, start, *unk};
      }
      start = after;
    }
    // Back from the end: the pieces of the best path, consecutive unks as one string.
    std::vector<std::pair<std::string_view, int32_t>> pieces;
    std::size_t end = n, fused_end = std::string_view::npos;
    while (end > 0) {
      const Node& node = best[end];
      if (unk && node.id == *unk) {
        if (fused_end == std::string_view::npos) fused_end = end;
      } else {
        if (fused_end != std::string_view::npos) pieces.emplace_back(piece.substr(end, fused_end - end), *unk);
        fused_end = std::string_view::npos;
        pieces.emplace_back(piece.substr(node.start, end - node.start), node.id);
      }
      end = node.start;
    }
    if (fused_end != std::string_view::npos) pieces.emplace_back(piece.substr(0, fused_end), *unk);
    std::vector<int32_t> ids;
    for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
      const auto [text, id] = *it;
      if (unk && id == *unk) {  // tokenizers: the string's own id, else its bytes, else unk
        if (const auto found = vocab.find(text); found != vocab.end()) {
          ids.push_back(found->second);
          continue;
        }
        if (byte_fallback &&
            std::all_of(text.begin(), text.end(), [&](char c) { return fallback_id[static_cast<unsigned char>(c)] >= 0; })) {
          for (const char c : text) ids.push_back(fallback_id[static_cast<unsigned char>(c)]);
          continue;
        }
      }
      ids.push_back(id);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (n <= 256) {
      std::lock_guard lock(cache_mutex);
      if (cache.size() >= (1U << 18)) cache.clear();
      cache.emplace(std::string(piece), std::move(ids));
    }
  }
};

// --- added tokens --------------------------------------------------------------------------

struct AddedToken {
  std::string content;  // as matched (normalized by the normalizer when `normalized`)
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false;
};

/// A piece of the text: plain text, or an added token's id.
struct Segment {
  std::string_view text;
  int32_t id = -1;
};

/// Added tokens matched leftmost-longest, as the `tokenizers` package's AddedVocabulary does.
struct AddedMatcher {
  std::array<std::vector<const AddedToken*>, 256> by_first;  // longest first
  std::vector<AddedToken> tokens;
  [[nodiscard]] bool empty() const { return tokens.empty(); }

  void build() {
    for (auto& list : by_first) list.clear();
    for (const AddedToken& t : tokens)
      if (!t.content.empty()) by_first[static_cast<unsigned char>(t.content[0])].push_back(&t);
    for (auto& list : by_first)
      std::stable_sort(list.begin(), list.end(),
                       [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
  }

  void split(std::string_view text, std::vector<Segment>& out) const {
    if (tokens.empty()) {
      out.push_back({text, -1});
      return;
    }
    std::size_t emitted = 0;  // end of the last match (with its stripped whitespace)
    for (std::size_t i = 0; i < text.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : by_first[static_cast<unsigned char>(text[i])])
        if (text.substr(i).starts_with(t->content)) {
          hit = t;
          break;
        }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      std::size_t start = i, stop = i + hit->content.size();
      if (hit->single_word && !(boundary_before(text, start) && boundary_after(text, stop))) {
        i = stop;
        continue;
      }
      if (hit->lstrip)
        while (start > emitted) {
          std::size_t back = start - 1;
          while (back > emitted && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
          std::size_t k = back;
          if (!is_whitespace(next_cp(text, k))) break;
          start = back;
        }
      if (hit->rstrip)
        while (stop < text.size()) {
          std::size_t k = stop;
          if (!is_whitespace(next_cp(text, k))) break;
          stop = k;
        }
      if (start > emitted) out.push_back({text.substr(emitted, start - emitted), -1});
      out.push_back({{}, hit->id});
      emitted = i = stop;
    }
    if (text.size() > emitted) out.push_back({text.substr(emitted), -1});
  }

 private:
  static bool boundary_before(std::string_view text, std::size_t at) {
    if (at == 0) return true;
    std::size_t back = at - 1;
    while (back > 0 && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
    return !is_word_char(next_cp(text, back));
  }
  static bool boundary_after(std::string_view text, std::size_t at) {
    return at >= text.size() || !is_word_char(next_cp(text, at));
  }
};

// --- decoders ----------------------------------------------------------------------------

/// Whether `bytes` is valid UTF-8 as a whole (Rust's String::from_utf8).
inline bool valid_utf8(std::string_view bytes) {
  for (std::size_t i = 0; i < bytes.size();) {
    std::size_t maximal = 0;
    const std::size_t n = utf8_sequence(bytes, i, maximal);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// One decoder of the file's chain, as tokenizers' decode_chain: tokens in, tokens out.
struct DecoderStep {
  enum class Kind { byte_level, wordpiece, replace, byte_fallback, fuse, strip, metaspace } kind = Kind::fuse;
  std::string prefix = "##";             // WordPiece's
  bool cleanup = true;                   // WordPiece's
  std::shared_ptr<const Regex> pattern;  // Replace's
  std::string content;                   // Replace's content; Strip's character
  std::size_t start = 0, stop = 0;       // Strip's counts
  std::string replacement;               // Metaspace's
  PrependScheme scheme = PrependScheme::always;

  void apply(std::vector<std::string>& tokens) const {
    switch (kind) {
      case Kind::byte_level: {  // each character to its byte (a token outside the alphabet as it is), then lossy UTF-8
        const ByteAlphabet& alphabet = byte_alphabet();
        std::string bytes;
        for (const std::string& t : tokens) bytes.append(alphabet.bytes_of(t).value_or(t));
        tokens.assign(1, lossy_utf8(bytes));
        return;
      }
      case Kind::wordpiece:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          std::string& token = tokens[i];
          if (i != 0) {
            if (token.starts_with(prefix)) token.erase(0, prefix.size());
            else token.insert(0, " ");
          }
          if (cleanup)
            for (const auto& [from, to] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
                     {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
                     {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
              for (std::size_t at = token.find(from); at != std::string::npos; at = token.find(from, at + to.size()))
                token.replace(at, from.size(), to);
        }
        return;
      case Kind::replace:
        for (std::string& token : tokens) token = replace_all(token, *pattern, content);
        return;
      case Kind::byte_fallback: {  // runs of <0xXX> tokens as their bytes: text if valid UTF-8, else one U+FFFD a byte
        std::vector<std::string> out;
        std::string run;
        const auto flush = [&] {
          if (run.empty()) return;
          if (valid_utf8(run)) out.push_back(run);
          else out.insert(out.end(), run.size(), std::string("\xEF\xBF\xBD"));
          run.clear();
        };
        for (std::string& token : tokens) {
          if (const auto byte = fallback_byte(token)) {
            run.push_back(static_cast<char>(*byte));
            continue;
          }
          flush();
          out.push_back(std::move(token));
        }
        flush();
        tokens.swap(out);
        return;
      }
      case Kind::fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        return;
      }
      case Kind::strip:
        for (std::string& token : tokens) {
          std::vector<std::size_t> at;  // each character's first byte
          for (std::size_t i = 0; i < token.size(); next_cp(token, i)) at.push_back(i);
          const auto is_content = [&](std::size_t k) {
            const std::size_t end = k + 1 < at.size() ? at[k + 1] : token.size();
            return std::string_view(token).substr(at[k], end - at[k]) == content;
          };
          std::size_t first = 0, last = at.size();
          while (first < start && first < at.size() && is_content(first)) ++first;
          for (std::size_t n = 0; n < stop && last > first && is_content(last - 1); ++n) --last;
          const std::size_t from = first < at.size() ? at[first] : token.size();
          const std::size_t to = last < at.size() ? at[last] : token.size();
          token = token.substr(from, to - from);
        }
        return;
      case Kind::metaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& token = tokens[i];
          for (std::size_t at = 0; at < token.size();) {
            if (std::string_view(token).substr(at).starts_with(replacement)) {
              if (!(i == 0 && scheme != PrependScheme::never)) out.push_back(' ');
              at += replacement.size();
            } else {
              const std::size_t from = at;
              next_cp(token, at);
              out.append(token, from, at - from);
            }
          }
          tokens[i] = std::move(out);
        }
        return;
    }
  }

 private:
  // "<0xXX>": the byte (tokenizers' u8::from_str_radix(.., 16) on the two characters).
  static std::optional<int> fallback_byte(std::string_view t) {
    if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return std::nullopt;
    const auto digit = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (t[3] == '+') return digit(t[4]) >= 0 ? std::optional<int>(digit(t[4])) : std::nullopt;  // Rust takes a '+' sign
    const int hi = digit(t[3]), lo = digit(t[4]);
    if (hi < 0 || lo < 0) return std::nullopt;
    return hi * 16 + lo;
  }
};

}  // namespace tok

using tok::flag;

/// Everything read from one tokenizer.json.
struct TokenizerImpl {
  std::string where;
  std::optional<tok::Normalizer> normalizer;
  std::optional<tok::PreTokenizer> pre_tokenizer;
  std::optional<tok::Bpe> bpe;
  std::optional<tok::WordPiece> wordpiece;
  std::optional<tok::Unigram> unigram;
  tok::AddedMatcher raw_added, normalized_added;
  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around one sequence
  std::vector<tok::DecoderStep> decoders;  // the file's decoder, a Sequence flattened (empty: none)
  bool has_decoder = false;
  std::vector<std::string> tokens;  // id -> spelling
  std::vector<std::string> bytes;   // id -> the ByteLevel decoder's bytes
  std::vector<char> special;        // id -> an added token marked special
  tok::StringMap<int32_t> ids;      // spelling -> id
  std::optional<int64_t> pad_id;

  void read_model(const nlohmann::json& m);
  void read_added(const nlohmann::json& added);
  void read_post_processor(const nlohmann::json& p, const std::string& field, std::vector<int32_t>& pre,
                           std::vector<int32_t>& post);
  void read_decoder(const nlohmann::json& d, const std::string& field = "decoder");

  [[nodiscard]] int32_t id_of(std::string_view token, std::string_view field) const {
    const auto it = ids.find(token);
    if (it == ids.end()) fail("{}: {} names the token '{}', which is not in the vocabulary", where, field, token);
    return it->second;
  }

  void encode(std::string_view text, const EncodeOptions& options, std::vector<int64_t>& out) const {
    tok::check_utf8(text);
    out.clear();
    std::vector<tok::Segment> raw, normalized_segments;
    raw_added.split(text, raw);
    tok::Pieces pieces;
    std::deque<std::string> arena;
    for (const tok::Segment& seg : raw) {
      if (seg.id >= 0) {
        out.push_back(seg.id);
        continue;
      }
      std::string_view norm = seg.text;
      if (normalizer) norm = arena.emplace_back(normalizer->apply(std::string(seg.text)));
      normalized_segments.clear();
      normalized_added.split(norm, normalized_segments);
      for (const tok::Segment& sub : normalized_segments) {
        if (sub.id >= 0) {
          out.push_back(sub.id);
          continue;
        }
        pieces.assign(1, sub.text);
        // Whether this text begins the original one (Metaspace's prepend_scheme "first")
        const bool at_start = seg.text.data() == text.data() && sub.text.data() == norm.data();
        if (pre_tokenizer) pre_tokenizer->apply(pieces, arena, at_start);
        for (std::string_view piece : pieces) {
          if (piece.empty()) continue;
          if (bpe) bpe->encode(piece, out);
          else if (unigram) unigram->encode(piece, out);
          else wordpiece->encode(piece, out);
        }
      }
    }
    const auto added = options.add_special_tokens ? static_cast<int64_t>(prefix.size() + suffix.size()) : 0;
    if (options.truncation) {
      check(options.max_length.has_value(), "Tokenizer: truncation needs max_length");
      check(*options.max_length >= added, "Tokenizer: max_length {} is shorter than the {} special tokens the "
            "post-processor adds", *options.max_length, added);
      const auto budget = static_cast<std::size_t>(*options.max_length - added);
      if (out.size() > budget) {
        if (options.truncation_side == TruncationSide::right) out.resize(budget);
        else out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(budget));
      }
    }
    if (added > 0) {
      out.insert(out.begin(), prefix.begin(), prefix.end());
      out.insert(out.end(), suffix.begin(), suffix.end());
    }
  }
};

LOOM_INLINE void TokenizerImpl::read_model(const nlohmann::json& m) {
  const std::string type = tok::type_of(m, where, "model");
  if (type == "Unigram") {
    check(m.contains("vocab") && m["vocab"].is_array() && !m["vocab"].empty() && m["vocab"].size() < static_cast<std::size_t>(tok::kIdLimit),
          "{}: model.vocab must be a non-empty array of [piece, score] (Unigram), of fewer than {} pieces", where,
          tok::kIdLimit);
    tok::Unigram& u = unigram.emplace();
    u.where = where;
    const auto& v = m["vocab"];
    tokens.resize(v.size());
    u.scores.resize(v.size());
    u.min_score = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < v.size(); ++i) {
      check(v[i].is_array() && v[i].size() == 2 && v[i][0].is_string() && v[i][1].is_number(),
            "{}: model.vocab[{}] must be [piece, score], got {}", where, i, v[i].dump().substr(0, 80));
      tokens[i] = v[i][0].get<std::string>();
      u.scores[i] = v[i][1].get<double>();
      u.min_score = std::min(u.min_score, u.scores[i]);
      ids[tokens[i]] = static_cast<int32_t>(i);  // a repeated piece: the later id, as tokenizers' map keeps it
      u.max_bytes = std::max(u.max_bytes, tokens[i].size());
    }
    for (const auto& [token, id] : ids) u.vocab[token] = id;
    if (m.contains("unk_id") && !m["unk_id"].is_null()) {
      check(m["unk_id"].is_number_unsigned() && m["unk_id"].get<std::size_t>() < v.size(),
            "{}: model.unk_id must be an index of model.vocab (0..{}), got {}", where, v.size() - 1, m["unk_id"].dump());
      u.unk = m["unk_id"].get<int32_t>();
    }
    u.byte_fallback = flag(m, "byte_fallback", false);
    u.fallback_id = tok::fallback_ids(ids);
    return;
  }
  check(m.contains("vocab") && m["vocab"].is_object(), "{}: model.vocab must be an object (token -> id)", where);
  int32_t size = 0;
  for (const auto& [token, id] : m["vocab"].items()) {
    check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < tok::kIdLimit,
          "{}: model.vocab['{}'] must be an id in [0, {}), got {}", where, token, tok::kIdLimit, id.dump());
    ids[token] = id.get<int32_t>();
    size = std::max(size, id.get<int32_t>() + 1);
  }
  tokens.assign(static_cast<std::size_t>(size), std::string());
  for (const auto& [token, id] : ids) tokens[static_cast<std::size_t>(id)] = token;
  const auto unk_of = [&](const char* key) -> std::optional<int32_t> {
    if (!m.contains(key) || m[key].is_null()) return std::nullopt;
    check(m[key].is_string(), "{}: model.{} must be a token (a string), got {}", where, key, m[key].dump());
    return id_of(m[key].get<std::string>(), std::string("model.") + key);
  };
  if (type == "BPE") {
    check(!m.contains("dropout") || m["dropout"].is_null(), "{}: model.dropout is not supported (BPE dropout; loom "
          "encodes deterministically)", where);
    tok::Bpe& b = bpe.emplace();
    // Byte-level behind a ByteLevel pre-tokenizer (GPT-2, Llama 3); else on characters
    // (SentencePiece's layout, Llama 2's and Mistral's tokenizer.json).
    b.byte_level = pre_tokenizer && pre_tokenizer->has_byte_level();
    b.ignore_merges = flag(m, "ignore_merges", false);
    b.fuse_unk = flag(m, "fuse_unk", false);
    b.byte_fallback = flag(m, "byte_fallback", false);
    b.unk = unk_of("unk_token");
    b.byte_id.fill(-1);
    b.fallback_id.fill(-1);  // byte-level: none
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      check(m[key].is_string(), "{}: model.{} must be a string, got {}", where, key, m[key].dump());
      check(!b.byte_level || m[key] == "", "{}: model.{} is not supported with a ByteLevel pre_tokenizer (byte-level "
            "BPE has none)", where, key);
      (std::string_view(key) == "continuing_subword_prefix" ? b.prefix : b.suffix) = m[key].get<std::string>();
    }
    if (b.byte_level) {
      check(!b.byte_fallback, "{}: model.byte_fallback true is not supported with a ByteLevel pre_tokenizer (every byte "
            "has its token there)", where);
      const tok::ByteAlphabet& alphabet = tok::byte_alphabet();
      for (const auto& [token, id] : ids) {
        const std::optional<std::string> raw = alphabet.bytes_of(token);
        if (!raw) continue;  // outside the alphabet: reachable as an added token only
        b.vocab[*raw] = id;
        if (raw->size() == 1) b.byte_id[static_cast<unsigned char>((*raw)[0])] = id;
      }
    } else {
      for (const auto& [token, id] : ids) b.vocab[token] = id;
      b.fallback_id = tok::fallback_ids(ids);
    }
    check(m.contains("merges") && m["merges"].is_array(), "{}: model.merges must be an array", where);
    const auto& merges = m["merges"];
    for (std::size_t r = 0; r < merges.size(); ++r) {
      std::string left, right;
      if (merges[r].is_string()) {
        const std::string s = merges[r].get<std::string>();
        const auto space = s.find(' ');
        check(space != std::string::npos && s.find(' ', space + 1) == std::string::npos,
              "{}: model.merges[{}] must be \"left right\", got '{}'", where, r, s);
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else {
        check(merges[r].is_array() && merges[r].size() == 2 && merges[r][0].is_string() && merges[r][1].is_string(),
              "{}: model.merges[{}] must be \"left right\" or [left, right]", where, r);
        left = merges[r][0].get<std::string>();
        right = merges[r][1].get<std::string>();
      }
      const int32_t a = id_of(left, "model.merges[" + std::to_string(r) + "]");
      const int32_t c = id_of(right, "model.merges[" + std::to_string(r) + "]");
      // tokenizers: the merged token is left + right without the continuing prefix
      check(right.starts_with(b.prefix), "{}: model.merges[{}]'s right side '{}' does not start with the "
            "continuing_subword_prefix '{}'", where, r, right, b.prefix);
      const int32_t merged = id_of(left + right.substr(b.prefix.size()), "model.merges[" + std::to_string(r) + "]");
      b.merges.try_emplace(tok::Bpe::key(a, c), static_cast<int32_t>(r), merged);
    }
  } else if (type == "WordPiece") {
    check(!pre_tokenizer || !pre_tokenizer->has_byte_level(), "{}: model WordPiece with a ByteLevel pre_tokenizer is "
          "not supported", where);
    tok::WordPiece& w = wordpiece.emplace();
    const std::optional<int32_t> unk = unk_of("unk_token");
    check(unk.has_value(), "{}: model.unk_token must name a token (WordPiece)", where);
    w.unk = *unk;
    if (m.contains("continuing_subword_prefix") && !m["continuing_subword_prefix"].is_null()) {
      check(m["continuing_subword_prefix"].is_string(), "{}: model.continuing_subword_prefix must be a string, got {}",
            where, m["continuing_subword_prefix"].dump());
      w.prefix = m["continuing_subword_prefix"].get<std::string>();
    }
    if (m.contains("max_input_chars_per_word") && m["max_input_chars_per_word"].is_number_unsigned())
      w.max_chars = m["max_input_chars_per_word"].get<std::size_t>();
    for (const auto& [token, id] : ids) w.vocab[token] = id;
  } else {
    tok::unsupported(where, "model", "'" + type + "'", "BPE (byte-level or on characters), Unigram and WordPiece");
  }
}

LOOM_INLINE void TokenizerImpl::read_added(const nlohmann::json& added) {
  check(added.is_array(), "{}: added_tokens must be an array", where);
  for (std::size_t i = 0; i < added.size(); ++i) {
    const auto& a = added[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    check(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
              a["id"].get<int64_t>() < tok::kIdLimit && a.contains("content") && a["content"].is_string(),
          "{}: {} must be an object with an id in [0, {}) and a string content", where, field, tok::kIdLimit);
    const auto id = a["id"].get<int32_t>();
    tok::AddedToken t{a["content"].get<std::string>(), id, flag(a, "single_word", false), flag(a, "lstrip", false),
                      flag(a, "rstrip", false)};
    if (static_cast<std::size_t>(id) >= tokens.size()) tokens.resize(static_cast<std::size_t>(id) + 1);
    tokens[static_cast<std::size_t>(id)] = t.content;
    ids[t.content] = id;
    if (special.size() < tokens.size()) special.resize(tokens.size(), 0);
    const bool is_special = flag(a, "special", false);
    special[static_cast<std::size_t>(id)] = is_special;
    // tokenizers: "normalized" defaults to the opposite of "special"
    if (flag(a, "normalized", !is_special)) {
      // matched, and spelled by id_to_token and the decoder, as the normalizer writes it;
      // token_to_id knows the file's spelling only, and decode skips a special token only
      // when its spelling is the one in the special set (tokenizers: the file's), so a special
      // token the normalizer respells is never skipped
      if (normalizer) {
        const std::string spelled = normalizer->apply(t.content);
        if (spelled != t.content) special[static_cast<std::size_t>(id)] = 0;
        t.content = spelled;
        tokens[static_cast<std::size_t>(id)] = t.content;
      }
      normalized_added.tokens.push_back(std::move(t));
    } else {
      raw_added.tokens.push_back(std::move(t));
    }
  }
  raw_added.build();
  normalized_added.build();
}

LOOM_INLINE void TokenizerImpl::read_post_processor(const nlohmann::json& p, const std::string& field,
                                                    std::vector<int32_t>& pre, std::vector<int32_t>& post) {
  const std::string type = tok::type_of(p, where, field);
  const auto pair_id = [&](const char* key) {
    check(p.contains(key) && p[key].is_array() && p[key].size() == 2 && p[key][1].is_number_integer() &&
              p[key][1].get<int64_t>() >= 0 && p[key][1].get<int64_t>() < tok::kIdLimit,
          "{}: {}.{} must be [token, id] with an id in [0, {})", where, field, key, tok::kIdLimit);
    return p[key][1].get<int32_t>();
  };
  if (type == "ByteLevel") return;  // offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    pre.insert(pre.begin(), pair_id("cls"));
    post.push_back(pair_id("sep"));
  } else if (type == "TemplateProcessing") {
    check(p.contains("single") && p["single"].is_array(), "{}: {}.single must be an array", where, field);
    std::vector<int32_t> before, after;
    bool seen = false;
    for (const auto& piece : p["single"]) {
      if (piece.contains("Sequence")) {
        check(!seen && piece["Sequence"].value("id", std::string("A")) == "A",
              "{}: {}.single must hold the sequence $A once", where, field);
        seen = true;
        continue;
      }
      check(piece.contains("SpecialToken") && piece["SpecialToken"].contains("id"), "{}: {}.single holds an item that "
            "is neither Sequence nor SpecialToken", where, field);
      check(piece["SpecialToken"]["id"].is_string(), "{}: {}.single's SpecialToken id must be a token name (a "
            "string), got {}", where, field, piece["SpecialToken"]["id"].dump());
      const std::string name = piece["SpecialToken"]["id"].get<std::string>();
      const auto& specials = p.contains("special_tokens") ? p["special_tokens"] : nlohmann::json::object();
      check(specials.contains(name) && specials[name].contains("ids") && specials[name]["ids"].is_array(),
            "{}: {}.special_tokens has no entry '{}'", where, field, name);
      for (const auto& id : specials[name]["ids"]) {
        check(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < tok::kIdLimit,
              "{}: {}.special_tokens['{}'].ids must be ids in [0, {}), got {}", where, field, name, tok::kIdLimit,
              id.dump());
        (seen ? after : before).push_back(id.get<int32_t>());
      }
    }
    check(seen, "{}: {}.single must hold the sequence $A", where, field);
    pre.insert(pre.begin(), before.begin(), before.end());
    post.insert(post.end(), after.begin(), after.end());
  } else if (type == "Sequence") {
    check(p.contains("processors") && p["processors"].is_array(), "{}: {}.processors must be an array", where, field);
    for (std::size_t i = 0; i < p["processors"].size(); ++i)
      read_post_processor(p["processors"][i], field + ".processors[" + std::to_string(i) + "]", pre, post);
  } else {
    tok::unsupported(where, field, "'" + type + "'",
                     "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and Sequence of these");
  }
}

LOOM_INLINE void TokenizerImpl::read_decoder(const nlohmann::json& d, const std::string& field) {
  if (d.is_null()) return;
  has_decoder = true;
  const std::string type = tok::type_of(d, where, field);
  using Kind = tok::DecoderStep::Kind;
  tok::DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = Kind::byte_level;
  } else if (type == "WordPiece") {
    step.kind = Kind::wordpiece;
    step.prefix = d.value("prefix", std::string("##"));
    step.cleanup = flag(d, "cleanup", true);
  } else if (type == "Replace") {
    step.kind = Kind::replace;
    step.pattern = tok::read_pattern(d, where, field);
    step.content = tok::required_string(d, "content", where, field);
  } else if (type == "ByteFallback") {
    step.kind = Kind::byte_fallback;
  } else if (type == "Fuse") {
    step.kind = Kind::fuse;
  } else if (type == "Strip") {
    step.kind = Kind::strip;
    step.content = tok::required_string(d, "content", where, field);
    std::size_t at = 0;
    check(!step.content.empty() && (tok::next_cp(step.content, at), at == step.content.size()),
          "{}: {}.content must be one character, got '{}'", where, field, step.content);
    for (const char* key : {"start", "stop"}) {
      check(d.contains(key) && d[key].is_number_unsigned(), "{}: {}.{} must be a count (a whole number >= 0)", where,
            field, key);
      (std::string_view(key) == "start" ? step.start : step.stop) = d[key].get<std::size_t>();
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::metaspace;
    bool split = true;
    tok::read_metaspace(d, where, field, step.replacement, step.scheme, split);
  } else if (type == "Sequence") {
    check(d.contains("decoders") && d["decoders"].is_array(), "{}: {}.decoders must be an array", where, field);
    for (std::size_t i = 0; i < d["decoders"].size(); ++i)
      read_decoder(d["decoders"][i], field + ".decoders[" + std::to_string(i) + "]");
    return;
  } else {
    tok::unsupported(where, field, "'" + type + "'",
                     "ByteLevel, WordPiece, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence of these and none");
  }
  decoders.push_back(std::move(step));
}

}  // namespace loom::data::detail

namespace loom::data {

namespace detail {
/// The tokenizer.json text `json_text` read (from_json, from_file).
LOOM_INLINE std::shared_ptr<TokenizerImpl> read_tokenizer_fields(const nlohmann::json& j, std::string_view where);

LOOM_INLINE std::shared_ptr<TokenizerImpl> read_tokenizer(std::string_view json_text, std::string_view where) {
  const nlohmann::json j = json::parse(json_text, where);
  try {
    return read_tokenizer_fields(j, where);
  } catch (const tok::WrongType& e) {
    fail("{}: {}", where, e.what());
  } catch (const nlohmann::json::type_error& e) {  // a field read without its own check
    fail("{}: a field has the wrong JSON type ({})", where, e.what());
  }
}

LOOM_INLINE std::shared_ptr<TokenizerImpl> read_tokenizer_fields(const nlohmann::json& j, std::string_view where) {
  check(j.is_object(), "{} is not a JSON object", where);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->where = std::string(where);
  check(j.contains("model"), "{}: field 'model' is missing", where);
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    impl->normalizer = tok::Normalizer::read(j["normalizer"], where, "normalizer");
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    impl->pre_tokenizer = tok::PreTokenizer::read(j["pre_tokenizer"], where, "pre_tokenizer");
  impl->read_model(j["model"]);
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) impl->read_added(j["added_tokens"]);
  impl->special.resize(impl->tokens.size(), 0);
  if (j.contains("post_processor") && !j["post_processor"].is_null())
    impl->read_post_processor(j["post_processor"], "post_processor", impl->prefix, impl->suffix);
  impl->read_decoder(j.value("decoder", nlohmann::json()));
  for (const int32_t id : impl->prefix) check(id >= 0 && static_cast<std::size_t>(id) < impl->tokens.size(),
                                              "{}: post_processor names id {}, outside the vocabulary", where, id);
  for (const int32_t id : impl->suffix) check(id >= 0 && static_cast<std::size_t>(id) < impl->tokens.size(),
                                              "{}: post_processor names id {}, outside the vocabulary", where, id);
  impl->bytes.resize(impl->tokens.size());
  const tok::ByteAlphabet& alphabet = tok::byte_alphabet();
  for (std::size_t id = 0; id < impl->tokens.size(); ++id)
    impl->bytes[id] = alphabet.bytes_of(impl->tokens[id]).value_or(impl->tokens[id]);
  if (j.contains("padding") && j["padding"].is_object() && j["padding"].contains("pad_id")) {
    check(j["padding"]["pad_id"].is_number_integer() && j["padding"]["pad_id"].get<int64_t>() >= 0 &&
              j["padding"]["pad_id"].get<int64_t>() < tok::kIdLimit,
          "{}: padding.pad_id must be an id in [0, {})", where, tok::kIdLimit);
    impl->pad_id = j["padding"]["pad_id"].get<int64_t>();
  }
  return impl;
}
}  // namespace detail

LOOM_INLINE Tokenizer Tokenizer::from_json(std::string_view json_text, std::string_view where) {
  return Tokenizer(detail::read_tokenizer(json_text, where));
}

LOOM_INLINE Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  const bool folder = std::filesystem::is_directory(path);
  const std::filesystem::path file = folder ? path / "tokenizer.json" : path;
  std::ifstream in(file, std::ios::binary);
  check(in.good(), "cannot read {} (a tokenizer.json, or a folder holding one)", file.string());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::shared_ptr<detail::TokenizerImpl> impl = detail::read_tokenizer(text, file.string());
  const std::filesystem::path config = path / "tokenizer_config.json";
  if (folder && !impl->pad_id && std::filesystem::exists(config)) {
    const nlohmann::json c = json::read_file(config);
    if (c.is_object() && c.contains("pad_token")) {
      const auto& pad = c["pad_token"];
      const std::string name = pad.is_string() ? pad.get<std::string>()
                               : pad.is_object() && pad.contains("content") ? pad["content"].get<std::string>()
                                                                           : std::string();
      if (const auto it = impl->ids.find(name); !name.empty() && it != impl->ids.end()) impl->pad_id = it->second;
    }
  }
  return Tokenizer(impl);
}

LOOM_INLINE std::vector<int64_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int64_t> out;
  impl_->encode(text, options, out);
  return out;
}

LOOM_INLINE std::vector<std::vector<int64_t>> Tokenizer::encode_batch(std::span<const std::string> texts,
                                                                      const EncodeOptions& options) const {
  std::vector<std::vector<int64_t>> out(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) impl_->encode(texts[i], options, out[i]);
  return out;
}

LOOM_INLINE SequenceBatch Tokenizer::operator()(std::span<const std::string> texts, const EncodeOptions& options) const {
  const std::optional<int64_t> pad = options.pad_token_id ? options.pad_token_id : impl_->pad_id;
  check(pad.has_value(), "Tokenizer: padding needs a pad token and {} names none; set EncodeOptions::pad_token_id",
        impl_->where);
  check(!(options.truncation && options.max_length && options.pad_to_multiple_of &&
          *options.pad_to_multiple_of > 0 && *options.max_length % *options.pad_to_multiple_of != 0),
        "Tokenizer: truncation to max_length {} and pad_to_multiple_of {} disagree (a multiple of it, as in "
        "transformers)", options.max_length.value_or(0), options.pad_to_multiple_of.value_or(0));
  std::vector<TokenSequence> examples(texts.size());
  std::vector<int64_t> ids;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    impl_->encode(texts[i], options, ids);
    examples[i].input_ids = torch::tensor(ids, torch::kLong);
  }
  DataCollatorWithPadding collator;
  collator.pad_token_id = *pad;
  collator.padding = options.padding;
  collator.max_length = options.max_length;
  collator.pad_to_multiple_of = options.pad_to_multiple_of;
  collator.padding_side = options.padding_side;
  return collator(examples);
}

LOOM_INLINE std::string Tokenizer::decode(std::span<const int64_t> ids, bool skip_special_tokens) const {
  const detail::TokenizerImpl& t = *impl_;
  for (const int64_t id : ids)
    check(id >= 0 && static_cast<std::size_t>(id) < t.tokens.size(), "Tokenizer::decode: id {} is outside the "
          "vocabulary (0..{})", id, t.tokens.size() - 1);
  const auto kept = [&](int64_t id) { return !(skip_special_tokens && t.special[static_cast<std::size_t>(id)]); };
  using Kind = detail::tok::DecoderStep::Kind;
  if (t.decoders.size() == 1 && t.decoders[0].kind == Kind::byte_level) {  // GPT-2's and Llama 3's: bytes read once
    std::string out;
    for (const int64_t id : ids)
      if (kept(id)) out.append(t.bytes[static_cast<std::size_t>(id)]);
    return detail::tok::lossy_utf8(out);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int64_t id : ids)
    if (kept(id)) tokens.push_back(t.tokens[static_cast<std::size_t>(id)]);
  // tokenizers: the decoder chain, then the tokens joined; without a decoder, joined by spaces
  std::string out;
  if (!t.has_decoder) {
    for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& step : t.decoders) step.apply(tokens);
  for (const auto& token : tokens) out += token;
  return out;
}

LOOM_INLINE std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = impl_->ids.find(token);
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

LOOM_INLINE std::string Tokenizer::id_to_token(int64_t id) const {
  check(id >= 0 && static_cast<std::size_t>(id) < impl_->tokens.size(), "Tokenizer::id_to_token: id {} is outside the "
        "vocabulary", id);
  return impl_->tokens[static_cast<std::size_t>(id)];
}

LOOM_INLINE int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

LOOM_INLINE std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }

LOOM_INLINE int64_t Tokenizer::num_special_tokens_to_add() const {
  return static_cast<int64_t>(impl_->prefix.size() + impl_->suffix.size());
}

}  // namespace loom::data
