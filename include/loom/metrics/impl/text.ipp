#pragma once
// Definitions of metrics/text.hpp (compiled once with LOOM_SEPARATE_COMPILATION).

#include <loom/core/error.hpp>
#include <loom/metrics/text.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace loom::metrics {

namespace detail {

// The code point at s[i] (i advanced past it); a loom: error naming `what` for bytes that are
// not UTF-8, as Python would never hold them in a str.
inline char32_t next_code_point(std::string_view s, std::size_t& i, std::string_view what) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  int extra = 0;
  char32_t cp = 0;
  if (lead < 0x80) {
    ++i;
    return lead;
  }
  if (lead >= 0xC2 && lead <= 0xDF) extra = 1, cp = lead & 0x1F;
  else if (lead >= 0xE0 && lead <= 0xEF) extra = 2, cp = lead & 0x0F;
  else if (lead >= 0xF0 && lead <= 0xF4) extra = 3, cp = lead & 0x07;
  else fail("metrics: {} is not valid UTF-8 (byte {} of {})", what, i + 1, s.size());
  for (int k = 1; k <= extra; ++k) {
    const std::size_t at = i + static_cast<std::size_t>(k);
    check(at < s.size() && (byte(at) & 0xC0) == 0x80, "metrics: {} is not valid UTF-8 (byte {} of {})", what, i + 1,
          s.size());
    cp = (cp << 6) | (byte(at) & 0x3F);
  }
  const bool overlong = (extra == 2 && cp < 0x800) || (extra == 3 && cp < 0x10000);
  check(!overlong && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF), "metrics: {} is not valid UTF-8 (byte {} of {})",
        what, i + 1, s.size());
  i += static_cast<std::size_t>(extra) + 1;
  return cp;
}

// Python's str.isspace(), which str.split() and str.rstrip() use.
inline bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's line.split(): the pieces between runs of whitespace.
inline std::vector<std::string> python_split(std::string_view s, std::string_view what) {
  std::vector<std::string> out;
  std::size_t i = 0, start = 0;
  bool in_word = false;
  while (i < s.size()) {
    const std::size_t at = i;
    const char32_t c = next_code_point(s, i, what);
    if (python_space(c)) {
      if (in_word) out.emplace_back(s.substr(start, at - start));
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      start = at;
    }
  }
  if (in_word) out.emplace_back(s.substr(start));
  return out;
}

// Python's s.rstrip().
inline std::string_view python_rstrip(std::string_view s, std::string_view what) {
  std::size_t i = 0, end = 0;
  while (i < s.size()) {
    const char32_t c = next_code_point(s, i, what);
    if (!python_space(c)) end = i;
  }
  return s.substr(0, end);
}

inline void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  std::size_t at = 0;
  for (std::size_t hit = s.find(from); hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at).append(to);
    at = hit + from.size();
  }
  out.append(s, at, std::string::npos);
  s = std::move(out);
}

inline bool ascii_digit(char c) { return c >= '0' && c <= '9'; }

// re.sub(r'(X)(Y)', replacement, line) for one-character X and Y, left to right without overlap:
// bytes suffice, since every character the patterns name is ASCII and a UTF-8 sequence's bytes
// are never ASCII (a multi-byte character matches [^0-9] as its last or first byte does).
template <class First, class Second, class Emit>
std::string sub_pairs(const std::string& line, First first, Second second, Emit emit) {
  std::string out;
  out.reserve(line.size() + line.size() / 4);
  std::size_t i = 0;
  while (i < line.size()) {
    if (i + 1 < line.size() && first(line[i]) && second(line[i + 1])) {
      emit(out, line[i], line[i + 1]);
      i += 2;
    } else {
      out += line[i++];
    }
  }
  return out;
}

// sacrebleu's TokenizerRegexp's first rule: r'([\{-\~\[-\` -\&\(-\+\:-\@\/])' -> r' \1 '.
inline bool bleu_symbol(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 0x7B && u <= 0x7E) || (u >= 0x5B && u <= 0x60) || (u >= 0x20 && u <= 0x26) || (u >= 0x28 && u <= 0x2B) ||
         (u >= 0x3A && u <= 0x40) || u == 0x2F;
}

using NgramCounts = std::unordered_map<std::string, int64_t>;

// The n-grams of `tokens` for orders min..max, each joined by one space (no token holds one).
inline NgramCounts ngrams(const std::vector<std::string>& tokens, int min_order, int max_order) {
  NgramCounts out;
  for (int n = min_order; n <= max_order; ++n)
    for (std::size_t i = 0; i + static_cast<std::size_t>(n) <= tokens.size(); ++i) {
      std::string key = tokens[i];
      for (int k = 1; k < n; ++k) key.append(" ").append(tokens[i + static_cast<std::size_t>(k)]);
      ++out[key];
    }
  return out;
}

inline double fmeasure(double precision, double recall) {
  return precision + recall > 0 ? 2 * precision * recall / (precision + recall) : 0.0;
}

inline void check_pairs(std::size_t predictions, std::size_t references, std::string_view metric) {
  check(predictions == references, "metrics: {} got {} predictions and {} references", metric, predictions, references);
}

}  // namespace detail

LOOM_INLINE std::vector<std::string> rouge_tokens(std::string_view text) {
  std::vector<std::string> out;
  std::string token;
  const auto end_token = [&] {
    if (!token.empty()) out.push_back(std::move(token));
    token.clear();
  };
  std::size_t i = 0;
  while (i < text.size()) {
    const char32_t c = detail::next_code_point(text, i, "rouge's text");
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      token += static_cast<char>(c);
    } else if (c >= 'A' && c <= 'Z') {
      token += static_cast<char>(c - 'A' + 'a');
    } else if (c == 0x212A) {  // KELVIN SIGN: Python's lower() gives 'k'
      token += 'k';
    } else if (c == 0x130) {  // 'İ': lower() gives 'i' and a combining dot, which separates
      token += 'i';
      end_token();
    } else {  // no other character lowercases to a-z or 0-9
      end_token();
    }
  }
  end_token();
  return out;
}

LOOM_INLINE RougeScore rouge_n(std::string_view reference, std::string_view prediction, int n) {
  check(n >= 1, "metrics: rouge_n takes n >= 1, got {}", n);
  const auto target = detail::ngrams(rouge_tokens(reference), n, n);
  const auto predicted = detail::ngrams(rouge_tokens(prediction), n, n);
  int64_t overlap = 0, target_count = 0, predicted_count = 0;
  for (const auto& [gram, count] : target) {
    target_count += count;
    if (const auto it = predicted.find(gram); it != predicted.end()) overlap += std::min(count, it->second);
  }
  for (const auto& [gram, count] : predicted) predicted_count += count;
  RougeScore s;
  s.precision = static_cast<double>(overlap) / static_cast<double>(std::max<int64_t>(predicted_count, 1));
  s.recall = static_cast<double>(overlap) / static_cast<double>(std::max<int64_t>(target_count, 1));
  s.fmeasure = detail::fmeasure(s.precision, s.recall);
  return s;
}

LOOM_INLINE RougeScore rouge_l(std::string_view reference, std::string_view prediction) {
  const auto target = rouge_tokens(reference);
  const auto predicted = rouge_tokens(prediction);
  if (target.empty() || predicted.empty()) return {};
  // The LCS table row by row (rouge_score keeps the whole table; its last cell is the same).
  std::vector<int64_t> above(predicted.size() + 1, 0), row(predicted.size() + 1, 0);
  for (const auto& t : target) {
    for (std::size_t j = 1; j <= predicted.size(); ++j)
      row[j] = t == predicted[j - 1] ? above[j - 1] + 1 : std::max(above[j], row[j - 1]);
    std::swap(above, row);
  }
  const auto lcs = static_cast<double>(above.back());
  RougeScore s;
  s.precision = lcs / static_cast<double>(predicted.size());
  s.recall = lcs / static_cast<double>(target.size());
  s.fmeasure = detail::fmeasure(s.precision, s.recall);
  return s;
}

LOOM_INLINE double rouge_l(std::span<const std::string> predictions, std::span<const std::string> references) {
  detail::check_pairs(predictions.size(), references.size(), "rouge_l");
  if (predictions.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (std::size_t i = 0; i < predictions.size(); ++i) sum += rouge_l(references[i], predictions[i]).fmeasure;
  return sum / static_cast<double>(predictions.size());
}

LOOM_INLINE double rouge_n(std::span<const std::string> predictions, std::span<const std::string> references, int n) {
  detail::check_pairs(predictions.size(), references.size(), "rouge_n");
  if (predictions.empty()) return std::numeric_limits<double>::quiet_NaN();
  double sum = 0;
  for (std::size_t i = 0; i < predictions.size(); ++i) sum += rouge_n(references[i], predictions[i], n).fmeasure;
  return sum / static_cast<double>(predictions.size());
}

namespace detail {
// Tokenizer13a's tokens of `text` (bleu_tokenize_13a joins them; corpus_bleu counts them).
inline std::vector<std::string> bleu_tokens_13a(std::string_view text) {
  // Tokenizer13a: the mteval-v13a clean-up, then TokenizerRegexp's rules on ' ' + line + ' '.
  for (std::size_t i = 0; i < text.size();) (void)detail::next_code_point(text, i, "BLEU's text");  // errors name the input's bytes
  std::string line(text);
  detail::replace_all(line, "<skipped>", "");
  detail::replace_all(line, "-\n", "");
  detail::replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    detail::replace_all(line, "&quot;", "\"");
    detail::replace_all(line, "&amp;", "&");
    detail::replace_all(line, "&lt;", "<");
    detail::replace_all(line, "&gt;", ">");
  }
  std::string spaced = " ";
  for (const char c : line) {
    if (detail::bleu_symbol(c)) spaced.append(" ").append(1, c).append(" ");
    else spaced += c;
  }
  spaced += ' ';
  const auto is_point = [](char c) { return c == '.' || c == ','; };
  const auto not_digit = [](char c) { return !detail::ascii_digit(c); };
  // r'([^0-9])([\.,])' -> r'\1 \2 ', r'([\.,])([^0-9])' -> r' \1 \2', r'([0-9])(-)' -> r'\1 \2 '
  spaced = detail::sub_pairs(spaced, not_digit, is_point,
                             [](std::string& o, char a, char b) { o.append(1, a).append(" ").append(1, b).append(" "); });
  spaced = detail::sub_pairs(spaced, is_point, not_digit,
                             [](std::string& o, char a, char b) { o.append(" ").append(1, a).append(" ").append(1, b); });
  spaced = detail::sub_pairs(spaced, detail::ascii_digit, [](char c) { return c == '-'; },
                             [](std::string& o, char a, char b) { o.append(1, a).append(" ").append(1, b).append(" "); });
  return detail::python_split(spaced, "BLEU's text");
}
}  // namespace detail

LOOM_INLINE std::string bleu_tokenize_13a(std::string_view text) {
  std::string out;
  for (const auto& token : detail::bleu_tokens_13a(text)) out.append(out.empty() ? "" : " ").append(token);
  return out;
}

LOOM_INLINE BleuScore corpus_bleu(std::span<const std::string> hypotheses,
                                  const std::vector<std::vector<std::string>>& references) {
  constexpr int orders = 4;
  check(!references.empty(), "metrics: corpus_bleu needs at least one reference stream");
  for (std::size_t k = 0; k < references.size(); ++k)
    check(references[k].size() == hypotheses.size(),
          "metrics: corpus_bleu's reference stream {} holds {} references for {} hypotheses", k, references[k].size(),
          hypotheses.size());
  BleuScore s;
  const auto tokens = [](std::string_view text) {
    return detail::bleu_tokens_13a(detail::python_rstrip(text, "BLEU's text"));
  };
  for (std::size_t i = 0; i < hypotheses.size(); ++i) {
    detail::NgramCounts reference_grams;
    std::vector<int64_t> reference_lengths;
    for (const auto& stream : references) {
      const auto words = tokens(stream[i]);
      reference_lengths.push_back(static_cast<int64_t>(words.size()));
      for (const auto& [gram, count] : detail::ngrams(words, 1, orders)) {
        auto& kept = reference_grams[gram];
        kept = std::max(kept, count);
      }
    }
    const auto words = tokens(hypotheses[i]);
    const auto length = static_cast<int64_t>(words.size());
    // _get_closest_ref_len: the nearest length, the shorter on a tie.
    int64_t closest = -1, closest_diff = -1;
    for (const int64_t r : reference_lengths) {
      const int64_t diff = std::abs(length - r);
      if (closest_diff == -1 || diff < closest_diff) closest_diff = diff, closest = r;
      else if (diff == closest_diff && r < closest) closest = r;
    }
    s.hypothesis_length += length;
    s.reference_length += closest;
    for (const auto& [gram, count] : detail::ngrams(words, 1, orders)) {
      const auto n = static_cast<std::size_t>(std::count(gram.begin(), gram.end(), ' '));
      s.total[n] += count;
      if (const auto it = reference_grams.find(gram); it != reference_grams.end())
        s.correct[n] += std::min(count, it->second);
    }
  }
  // BLEU.compute_bleu with smooth_method "exp".
  if (s.hypothesis_length < s.reference_length)
    s.brevity_penalty = s.hypothesis_length > 0 ? std::exp(1.0 - static_cast<double>(s.reference_length) /
                                                                      static_cast<double>(s.hypothesis_length))
                                                : 0.0;
  if (std::all_of(s.correct.begin(), s.correct.end(), [](int64_t c) { return c == 0; })) return s;
  double smooth = 1.0;
  for (std::size_t n = 0; n < orders; ++n) {
    if (s.total[n] == 0) break;
    if (s.correct[n] == 0) {
      smooth *= 2;
      s.precisions[n] = 100.0 / (smooth * static_cast<double>(s.total[n]));
    } else {
      s.precisions[n] = 100.0 * static_cast<double>(s.correct[n]) / static_cast<double>(s.total[n]);
    }
  }
  double logs = 0;
  for (const double p : s.precisions) logs += p == 0.0 ? -9999999999.0 : std::log(p);  // sacrebleu's my_log
  s.score = s.brevity_penalty * std::exp(logs / orders);
  return s;
}

}  // namespace loom::metrics
