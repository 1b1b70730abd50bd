#pragma once
// Metrics of generated text against references, as the Python packages users report them with:
// ROUGE (Google's `rouge-score`, which HF evaluate's "rouge" calls) and corpus BLEU
// (`sacrebleu`'s defaults, which HF evaluate's "sacrebleu" calls). Scores are those packages'
// numbers for the same strings (tests/metrics/text_peer.py compares them on adversarial text).
//
//   const double rl = loom::metrics::rouge_l(predictions, references);        // mean F, 0..1
//   const auto bleu = loom::metrics::corpus_bleu(predictions, {references});  // 0..100
//
// Text is UTF-8; an invalid sequence is a loom: error (Python's strings cannot hold one).

#include <loom/config/inline.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::metrics {

/// One pair's ROUGE: precision (against the prediction's length), recall (the reference's)
/// and their harmonic mean, rouge_score's Score.
struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};

/// rouge_score's DefaultTokenizer without stemming (use_stemmer false, evaluate's default):
/// the text lowercased as Python's str.lower(), every run of characters other than a-z and
/// 0-9 a separator, the non-empty pieces.
[[nodiscard]] LOOM_INLINE std::vector<std::string> rouge_tokens(std::string_view text);

/// rouge_score's rougeN of one pair (n >= 1): clipped n-gram overlap.
[[nodiscard]] LOOM_INLINE RougeScore rouge_n(std::string_view reference, std::string_view prediction, int n);

/// rouge_score's rougeL of one pair: the longest common subsequence of the tokens.
[[nodiscard]] LOOM_INLINE RougeScore rouge_l(std::string_view reference, std::string_view prediction);

/// Corpus rougeL: the mean of each pair's F-measure (HF evaluate's rouge with
/// use_aggregator=False, averaged; its default aggregator takes the median of bootstrap
/// resamples instead, which is random). NaN for no pairs.
[[nodiscard]] LOOM_INLINE double rouge_l(std::span<const std::string> predictions,
                                         std::span<const std::string> references);

/// Corpus rougeN, the mean of each pair's F-measure as above.
[[nodiscard]] LOOM_INLINE double rouge_n(std::span<const std::string> predictions,
                                         std::span<const std::string> references, int n);

/// sacrebleu's BLEUScore: the score (0..100), the four n-gram precisions (percent), the
/// brevity penalty, the corpus lengths and the n-gram counts they came from.
struct BleuScore {
  double score = 0;
  std::array<double, 4> precisions{};
  double brevity_penalty = 1;
  int64_t hypothesis_length = 0, reference_length = 0;
  std::array<int64_t, 4> correct{}, total{};
};

/// sacrebleu's 13a tokenizer (mteval-v13a, WMT's): the tokens of one line joined by spaces.
[[nodiscard]] LOOM_INLINE std::string bleu_tokenize_13a(std::string_view line);

/// sacrebleu.corpus_bleu(hypotheses, references) with its defaults: 13a tokens, case kept,
/// 4-grams, exponential smoothing, no effective order. `references` holds reference streams, as
/// sacrebleu takes them: references[k][i] is the k-th reference of hypothesis i (one stream
/// for one reference each); each hypothesis's brevity uses its closest reference length.
[[nodiscard]] LOOM_INLINE BleuScore corpus_bleu(std::span<const std::string> hypotheses,
                                                const std::vector<std::vector<std::string>>& references);

}  // namespace loom::metrics

#if defined(LOOM_HEADER_ONLY)
#include <loom/metrics/impl/text.ipp>
#endif
