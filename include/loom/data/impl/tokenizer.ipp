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
#include <mutex>
#include <unordered_map>

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
/// BertNormalizer's control characters: categories Cc, Cf, Cs, Co, Cn except \t \n \r.
inline bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int k = category(c);
  return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
         k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN;
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
inline bool is_word_char(char32_t c) {
  const int k = category(c);
  return c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO);
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

/// A compiled pattern; find_all() may be called from several threads.
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, std::string_view where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL takes no UCP
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
    if (code_ == nullptr) {
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

struct Normalizer {
  enum class Kind { bert, lowercase, nfc, nfd, nfkc, nfkd, strip_accents, sequence } kind = Kind::sequence;
  bool clean_text = true, chinese_chars = true, strip_accents = false, lowercase = true;
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
    } else if (type == "Sequence") {
      n.kind = Kind::sequence;
      check(j.contains("normalizers") && j["normalizers"].is_array(), "{}: {}.normalizers must be an array", where, field);
      for (std::size_t i = 0; i < j["normalizers"].size(); ++i)
        n.children.push_back(read(j["normalizers"][i], where, field + ".normalizers[" + std::to_string(i) + "]"));
    } else {
      unsupported(where, field, "'" + type + "'",
                  "BertNormalizer, Lowercase, NFC, NFD, NFKC, NFKD, StripAccents and Sequence of these");
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
      case Kind::sequence:
        for (const Normalizer& child : children) s = child.apply(std::move(s));
        return s;
    }
    return s;
  }
};

// --- pre-tokenizers ----------------------------------------------------------------------

using Pieces = std::vector<std::string_view>;

struct PreTokenizer {
  enum class Kind { byte_level, split, bert, whitespace, whitespace_split, sequence } kind = Kind::sequence;
  enum class Behavior { isolated, removed, merged_with_previous, merged_with_next } behavior = Behavior::isolated;
  bool add_prefix_space = false;
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
      check(j.contains("pattern") && j["pattern"].is_object() &&
                ((j["pattern"].contains("Regex") && j["pattern"]["Regex"].is_string()) ||
                 (j["pattern"].contains("String") && j["pattern"]["String"].is_string())),
            "{}: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where, field);
      const bool literal = j["pattern"].contains("String");
      p.regex = std::make_shared<const Regex>(j["pattern"][literal ? "String" : "Regex"].get<std::string>(), literal, where);
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
      // \w+|[^\w\s]+ with Oniguruma's \w (tokenizers' engine): letters, marks, decimal digits,
      // connector punctuation and the joiners U+200C/U+200D; PCRE2's \w differs (all numbers, no joiners)
      p.regex = std::make_shared<const Regex>(
          R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}]+|[^\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s]+)", false,
          where);
    } else if (type == "WhitespaceSplit") {
      p.kind = Kind::whitespace_split;
    } else if (type == "Sequence") {
      check(j.contains("pretokenizers") && j["pretokenizers"].is_array(), "{}: {}.pretokenizers must be an array", where,
            field);
      for (std::size_t i = 0; i < j["pretokenizers"].size(); ++i)
        p.children.push_back(read(j["pretokenizers"][i], where, field + ".pretokenizers[" + std::to_string(i) + "]"));
    } else {
      unsupported(where, field, "'" + type + "'",
                  "ByteLevel, Split, BertPreTokenizer, Whitespace, WhitespaceSplit and Sequence of these");
    }
    return p;
  }

  [[nodiscard]] bool has_byte_level() const {
    return kind == Kind::byte_level ||
           std::any_of(children.begin(), children.end(), [](const PreTokenizer& c) { return c.has_byte_level(); });
  }

  /// Splits every piece of `pieces`; new strings (a prefix space) are kept in `arena`.
  void apply(Pieces& pieces, std::deque<std::string>& arena) const {
    if (kind == Kind::sequence) {
      for (const PreTokenizer& child : children) child.apply(pieces, arena);
      return;
    }
    Pieces out;
    out.reserve(pieces.size() * 4);
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    for (std::string_view piece : pieces) {
      switch (kind) {
        case Kind::byte_level:
          if (add_prefix_space && (piece.empty() || piece.front() != ' ')) piece = arena.emplace_back(" " + std::string(piece));
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

/// A byte-level BPE: ids of raw bytes, merges by rank.
struct Bpe {
  StringMap<int32_t> vocab;  // raw bytes -> id
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false;
  std::optional<int32_t> unk;
  bool fuse_unk = false;
  mutable std::mutex cache_mutex;
  mutable StringMap<std::vector<int32_t>> cache;

  static uint64_t key(int32_t a, int32_t b) { return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b); }

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
    for (const char ch : piece) {
      const int32_t id = byte_id[static_cast<unsigned char>(ch)];
      if (id >= 0) {
        symbols.push_back(id);
      } else if (unk) {
        if (!(fuse_unk && !symbols.empty() && symbols.back() == *unk)) symbols.push_back(*unk);
      }
    }
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

}  // namespace tok

using tok::flag;

/// Everything read from one tokenizer.json.
struct TokenizerImpl {
  std::string where;
  std::optional<tok::Normalizer> normalizer;
  std::optional<tok::PreTokenizer> pre_tokenizer;
  std::optional<tok::Bpe> bpe;
  std::optional<tok::WordPiece> wordpiece;
  tok::AddedMatcher raw_added, normalized_added;
  std::vector<int32_t> prefix, suffix;  // the post-processor's ids around one sequence
  enum class Decoder { none, byte_level, wordpiece } decoder = Decoder::none;
  std::string decoder_prefix = "##";
  bool decoder_cleanup = true;
  std::vector<std::string> tokens;  // id -> spelling
  std::vector<std::string> bytes;   // id -> the ByteLevel decoder's bytes
  std::vector<char> special;        // id -> an added token marked special
  tok::StringMap<int32_t> ids;      // spelling -> id
  std::optional<int64_t> pad_id;

  void read_model(const nlohmann::json& m);
  void read_added(const nlohmann::json& added);
  void read_post_processor(const nlohmann::json& p, const std::string& field, std::vector<int32_t>& pre,
                           std::vector<int32_t>& post);
  void read_decoder(const nlohmann::json& d);

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
        if (pre_tokenizer) pre_tokenizer->apply(pieces, arena);
        for (std::string_view piece : pieces) {
          if (piece.empty()) continue;
          if (bpe) bpe->encode(piece, out);
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
    check(pre_tokenizer && pre_tokenizer->has_byte_level(), "{}: model BPE without a ByteLevel pre_tokenizer is not supported (loom reads "
          "byte-level BPE: GPT-2, Llama 3)", where);
    check(!m.contains("dropout") || m["dropout"].is_null(), "{}: model.dropout is not supported (BPE dropout; loom "
          "encodes deterministically)", where);
    check(!flag(m, "byte_fallback", false), "{}: model.byte_fallback true is not supported (loom reads byte-level BPE)",
          where);
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      check(!m.contains(key) || m[key].is_null() || m[key] == "", "{}: model.{} is not supported (loom reads byte-level "
            "BPE, which has none)", where, key);
    tok::Bpe& b = bpe.emplace();
    b.ignore_merges = flag(m, "ignore_merges", false);
    b.fuse_unk = flag(m, "fuse_unk", false);
    b.unk = unk_of("unk_token");
    b.byte_id.fill(-1);
    const tok::ByteAlphabet& alphabet = tok::byte_alphabet();
    for (const auto& [token, id] : ids) {
      const std::optional<std::string> raw = alphabet.bytes_of(token);
      if (!raw) continue;  // outside the alphabet: reachable as an added token only
      b.vocab[*raw] = id;
      if (raw->size() == 1) b.byte_id[static_cast<unsigned char>((*raw)[0])] = id;
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
      const int32_t merged = id_of(left + right, "model.merges[" + std::to_string(r) + "]");
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
    tok::unsupported(where, "model", "'" + type + "'", "BPE (byte-level) and WordPiece");
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
      // matched, and spelled by id_to_token and the decoder, as the normalizer writes it
      if (normalizer) {
        t.content = normalizer->apply(t.content);
        tokens[static_cast<std::size_t>(id)] = t.content;
        ids[t.content] = id;
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

LOOM_INLINE void TokenizerImpl::read_decoder(const nlohmann::json& d) {
  if (d.is_null()) return;
  const std::string type = tok::type_of(d, where, "decoder");
  if (type == "ByteLevel") {
    decoder = Decoder::byte_level;
  } else if (type == "WordPiece") {
    decoder = Decoder::wordpiece;
    decoder_prefix = d.value("prefix", std::string("##"));
    decoder_cleanup = flag(d, "cleanup", true);
  } else {
    tok::unsupported(where, "decoder", "'" + type + "'", "ByteLevel, WordPiece and none");
  }
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
  std::string out;
  bool first = true;
  for (const int64_t id : ids) {
    check(id >= 0 && static_cast<std::size_t>(id) < t.tokens.size(), "Tokenizer::decode: id {} is outside the "
          "vocabulary (0..{})", id, t.tokens.size() - 1);
    const auto i = static_cast<std::size_t>(id);
    if (skip_special_tokens && t.special[i]) continue;
    switch (t.decoder) {
      case detail::TokenizerImpl::Decoder::byte_level: out.append(t.bytes[i]); break;
      case detail::TokenizerImpl::Decoder::none:
        if (!first) out.push_back(' ');
        out.append(t.tokens[i]);
        break;
      case detail::TokenizerImpl::Decoder::wordpiece: {
        std::string token = t.tokens[i];
        if (!first) {
          if (token.starts_with(t.decoder_prefix)) token.erase(0, t.decoder_prefix.size());
          else token.insert(0, " ");
        }
        if (t.decoder_cleanup)
          for (const auto& [from, to] : std::initializer_list<std::pair<std::string_view, std::string_view>>{
                   {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"}, {" 'm", "'m"},
                   {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}})
            for (std::size_t at = token.find(from); at != std::string::npos; at = token.find(from, at + to.size()))
              token.replace(at, from.size(), to);
        out.append(token);
        break;
      }
    }
    first = false;
  }
  return t.decoder == detail::TokenizerImpl::Decoder::byte_level ? detail::tok::lossy_utf8(out) : out;
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
