#pragma once
// The King James Bible of Debian's bible-kjv-text package, shared by the examples (char_lm,
// text_data/kjv_text).
//
// The data file: /usr/lib/bible.data (package bible-kjv-text) is not plain text but the
// "EC02" compressed format of the `bible` program (package bible-kjv). This example decodes
// this header decodes it. The facts it relies on, each checked while reading (found by inspecting the
// installed file, version 4.38; the decoded text is byte-identical to gzip -d's compress(1)
// decoder run window by window, and its verses read as `bible` prints them):
//
//   offset  0x00  4 bytes  magic "EC02", followed by a NUL-padded description
//                          ("Compressed Data File")
//   offset  0x54  u32 BE   W, the uncompressed size of one window (65536)
//   offset  0x58  u32 BE   N, the number of windows (68)
//   offset  0x5c  u32 BE   N + 1 absolute file offsets; window i is bytes [off[i], off[i+1]),
//                          and off[N] is the file size
//   off[0] - 3    3 bytes  a compress(1) ".Z" header: 0x1f 0x9d, then flags 0x90
//                          (0x80: block mode, with code 256 = CLEAR; low 5 bits: 16 max bits)
//
// Each window is an independent compress(1) LZW stream under that one header (codes packed
// LSB first, starting at 9 bits, growing to 16; on every width change or CLEAR the reader
// skips to the end of the current group of `width` bytes, as compress does). Every window
// but the last decodes to exactly W bytes; concatenated they are the text: a title line
// ("Holy Bible, Authorized (King James) Version.  Textfile 930105."), then one line per
// verse, "<Book><chapter>:<verse> <text>" with the bible program's book abbreviations
// (e.g. "Ge1:1 In the beginning God created ...", "1Sm3:10 ...", "Rev22:21 ..."), 31102 verses,
// ASCII only, newline-terminated.
//
// A file that does not start with "EC02" is read as plain text.

#include <loom/core/error.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace kjv {

/// Reads a big-endian u32 at `pos`.
inline uint32_t be32(const std::vector<uint8_t>& d, size_t pos) {
  loom::check(pos + 4 <= d.size(), "bible data: truncated at offset {}", pos);
  return (uint32_t{d[pos]} << 24) | (uint32_t{d[pos + 1]} << 16) | (uint32_t{d[pos + 2]} << 8) | uint32_t{d[pos + 3]};
}

/// Decodes one compress(1) LZW stream without its header (ncompress's decompress()).
inline std::string lzw_decode(std::span<const uint8_t> in, int max_bits, bool block_mode) {
  constexpr int kInitBits = 9;
  constexpr int64_t kClear = 256;
  loom::check(max_bits >= kInitBits && max_bits <= 16, "bible data: unsupported LZW width {}", max_bits);
  const int64_t max_max_code = int64_t{1} << max_bits;
  std::vector<uint16_t> prefix(static_cast<size_t>(max_max_code), 0);
  std::vector<uint8_t> suffix(static_cast<size_t>(max_max_code), 0);
  for (int i = 0; i < 256; ++i) suffix[static_cast<size_t>(i)] = static_cast<uint8_t>(i);

  int n_bits = kInitBits;
  int64_t max_code = (int64_t{1} << n_bits) - 1;
  int64_t free_ent = block_mode ? 257 : 256;
  bool clear_flag = false;
  // Codes are read in groups of n_bits bytes (8 codes); a width change or CLEAR drops the
  // rest of the current group.
  std::array<uint8_t, 16 + 3> group{};
  size_t pos = 0;
  int64_t bit = 0, bits_usable = 0;
  auto get_code = [&]() -> int64_t {
    if (clear_flag || bit >= bits_usable || free_ent > max_code) {
      if (free_ent > max_code) {
        ++n_bits;
        max_code = n_bits == max_bits ? max_max_code : (int64_t{1} << n_bits) - 1;
      }
      if (clear_flag) {
        n_bits = kInitBits;
        max_code = (int64_t{1} << n_bits) - 1;
        clear_flag = false;
      }
      const size_t take = std::min<size_t>(static_cast<size_t>(n_bits), in.size() - pos);
      if (static_cast<int64_t>(take) * 8 < n_bits) return -1;  // end of the stream
      group.fill(0);
      std::copy_n(in.begin() + static_cast<std::ptrdiff_t>(pos), take, group.begin());
      pos += take;
      bit = 0;
      bits_usable = static_cast<int64_t>(take) * 8 - (n_bits - 1);
    }
    const auto byte = static_cast<size_t>(bit >> 3);
    const uint32_t word = uint32_t{group[byte]} | (uint32_t{group[byte + 1]} << 8) | (uint32_t{group[byte + 2]} << 16);
    bit += n_bits;
    return static_cast<int64_t>((word >> (static_cast<uint32_t>(bit - n_bits) & 7u)) & ((1u << n_bits) - 1u));
  };

  std::string out;
  int64_t old_code = get_code();
  if (old_code < 0) return out;
  loom::check(old_code < 256, "bible data: LZW stream starts with code {}", old_code);
  auto fin_char = static_cast<uint8_t>(old_code);
  out.push_back(static_cast<char>(fin_char));
  std::vector<uint8_t> stack;
  for (int64_t code; (code = get_code()) >= 0;) {
    if (code == kClear && block_mode) {
      clear_flag = true;
      free_ent = 256;  // compress's FIRST - 1: the entry made after the next code is never read
      if ((code = get_code()) < 0) break;
    }
    const int64_t in_code = code;
    if (code >= free_ent) {  // the KwKwK case: the code being defined right now
      loom::check(code == free_ent, "bible data: corrupt LZW stream (code {} beyond {})", code, free_ent);
      stack.push_back(fin_char);
      code = old_code;
    }
    while (code >= 256) {
      stack.push_back(suffix[static_cast<size_t>(code)]);
      code = prefix[static_cast<size_t>(code)];
    }
    fin_char = suffix[static_cast<size_t>(code)];
    stack.push_back(fin_char);
    out.append(stack.rbegin(), stack.rend());
    stack.clear();
    if (free_ent < max_max_code) {
      prefix[static_cast<size_t>(free_ent)] = static_cast<uint16_t>(old_code);
      suffix[static_cast<size_t>(free_ent)] = fin_char;
      ++free_ent;
    }
    old_code = in_code;
  }
  return out;
}

/// The text of a bible-kjv "EC02" data file (the layout is described at the top of this file).
inline std::string decode_ec02(const std::vector<uint8_t>& d, const std::string& name) {
  const uint32_t window = be32(d, 0x54);
  const uint32_t n = be32(d, 0x58);
  loom::check(n > 0 && 0x5c + 4 * (size_t{n} + 1) <= d.size(), "{}: bad window count {}", name, n);
  std::vector<size_t> off(n + 1);
  for (uint32_t i = 0; i <= n; ++i) off[i] = be32(d, 0x5c + 4 * size_t{i});
  loom::check(off[n] == d.size(), "{}: the offset table ends at {}, the file at {}", name, off[n], d.size());
  loom::check(off[0] >= 3 && d[off[0] - 3] == 0x1f && d[off[0] - 2] == 0x9d, "{}: no compress(1) header before "
              "the first window", name);
  const uint8_t flags = d[off[0] - 1];
  std::string text;
  for (uint32_t i = 0; i < n; ++i) {
    loom::check(off[i] <= off[i + 1], "{}: window {} has negative length", name, i);
    auto part = lzw_decode(std::span(d).subspan(off[i], off[i + 1] - off[i]), flags & 0x1f, (flags & 0x80) != 0);
    loom::check(i + 1 == n ? part.size() <= window : part.size() == window,
                "{}: window {} decodes to {} bytes, expected {}", name, i, part.size(), window);
    text += part;
  }
  return text;
}

/// "Ge1:1 ", "1Sm3:10 ", "Rev22:21 ": the length of a verse reference and its space, or 0.
inline size_t reference_length(const std::string& line) {
  size_t i = 0;
  if (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  const size_t letters = i;
  while (i < line.size() && std::isalpha(static_cast<unsigned char>(line[i]))) ++i;
  if (i == letters) return 0;
  const size_t chapter = i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  if (i == chapter || i >= line.size() || line[i] != ':') return 0;
  const size_t verse = ++i;
  while (i < line.size() && std::isdigit(static_cast<unsigned char>(line[i]))) ++i;
  if (i == verse || i >= line.size() || line[i] != ' ') return 0;
  return i + 1;
}

/// The content of `file`: decoded when it is an EC02 file (`ec02` says which), else as is.
inline std::string read_file(const std::filesystem::path& file, bool& ec02) {
  std::ifstream in(file, std::ios::binary);
  loom::check(static_cast<bool>(in), "cannot read {} (install Debian's bible-kjv-text, or pass --data_file)",
              file.string());
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ec02 = bytes.size() >= 4 && std::equal(bytes.begin(), bytes.begin() + 4, "EC02");
  return ec02 ? decode_ec02(bytes, file.string()) : std::string(bytes.begin(), bytes.end());
}

/// One verse line: "Ge1:1" and "In the beginning ...".
struct Verse {
  std::string reference;  ///< book abbreviation, chapter and verse, without the space
  std::string text;       ///< the verse, without its newline
};

/// The verse lines of a decoded EC02 text, in order (the title line, which has no reference, is left out).
inline std::vector<Verse> split_verses(const std::string& raw) {
  std::vector<Verse> verses;
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\n', start);
    if (end == std::string::npos) end = raw.size();
    const std::string line = raw.substr(start, end - start);
    if (const size_t ref = reference_length(line); ref > 0)
      verses.push_back({line.substr(0, ref - 1), line.substr(ref)});
    start = end + 1;
  }
  return verses;
}

/// char_lm's training text: the verse texts, one per line (or the decoded lines unchanged
/// with `keep_references`; a plain-text file as is); `verses` counts the verses (0 for plain text).
inline std::string load_text(const std::filesystem::path& file, bool keep_references, int64_t& verses) {
  bool ec02 = false;
  std::string raw = read_file(file, ec02);
  verses = 0;
  if (!ec02) return raw;
  std::string text;
  text.reserve(raw.size());
  for (const Verse& v : split_verses(raw)) {
    text += v.text;
    text.push_back('\n');
    ++verses;
  }
  return keep_references ? raw : text;
}

}  // namespace kjv
