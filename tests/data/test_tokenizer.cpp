// data/tokenizer.hpp against the `tokenizers` package: tests/data/tokenizer_peer.py trains
// byte-level BPEs (prepare.py's; GPT-2's and Llama 3's patterns as Split regexes; Splits of each
// behavior, one with Oniguruma's \b \w \s and a nested bracket; ByteLevel with add_prefix_space
// and no added tokens), SentencePiece-style BPEs on characters (Llama 2's layout with byte fallback, a
// Metaspace one with fused unknowns) and WordPiece BERT tokenizers (BertNormalizer, normalizer
// sequences) on the KJV text (build/examples/kjv_text), encodes the 31102 verses (every verse for
// one tokenizer of each family, every 4th for the variants), the first 4000 verses as documents
// of 200 and a set of hard strings (Unicode, emoji, numbers, whitespace runs, contractions,
// added tokens), and decodes them; loom's ids and text must be the same. Padded batches are
// checked against transformers' tokenizer(texts, padding=..., truncation=..., max_length=...).
// Every tokenizer.json loom does not read is refused with one `loom:` line naming the field.
// The Python side takes ~20 s (2026-11-29, 2 cores), once per process.
#include <loom/config/json.hpp>
#include <loom/data/tokenizer.hpp>

#include <doctest/doctest.h>

#include "../support.hpp"

#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// A namespace of its own: the light test files compile as one unit (tests/CMakeLists.txt).
namespace tokenizer_test {

namespace fs = std::filesystem;
using loom::data::EncodeOptions;
using loom::data::PaddingSide;
using loom::data::PaddingStrategy;
using loom::data::Tokenizer;
using loom::data::TruncationSide;
using loom_test::error_of;

const std::vector<std::string> kNames = {"bpe",        "gpt2_split",    "llama3",        "bert_uncased",
                                         "bert_cased", "wordpiece_seq", "bpe_behaviors", "wordpiece_ws",
                                         "llama2_sp",  "metaspace_sp",  "t5_unigram",    "xlmr_unigram",
                                         "bpe_prefix"};

/// Runs `cmd` and REQUIREs exit status 0.
void run_ok(const std::string& cmd) {
  const std::string out = loom_test::run_capture(cmd + " 2>&1; echo \"<rc=$?>\"");
  INFO(cmd << "\n" << out);
  REQUIRE(out.find("<rc=0>") != std::string::npos);
}

struct Peer {
  fs::path dir;
  std::string py;
  std::string script;
};

/// kjv_text, then tokenizer_peer.py make and encode, into tmp/data/tokenizer (once per process).
const Peer& peer() {
  static const Peer p = [] {
    Peer out;
    const fs::path exe = loom_test::tmp_root().parent_path().parent_path() / "examples" / "kjv_text";
    const char* py = std::getenv("LOOM_PYTHON");
    if (py == nullptr || !fs::exists(py) || !fs::exists(exe) || !fs::exists("/usr/lib/bible.data")) return out;
    out.dir = loom_test::fresh_dir("data/tokenizer");
    out.py = py;
    out.script = (loom_test::source_dir() / "tests/data/tokenizer_peer.py").string();
    run_ok(exe.string() + " --output " + (out.dir / "kjv.txt").string() + " > /dev/null");
    run_ok(out.py + " " + out.script + " make " + (out.dir / "kjv.txt").string() + " " + out.dir.string());
    std::string names;
    for (const auto& n : kNames) names += " " + n;
    run_ok(out.py + " " + out.script + " encode " + out.dir.string() + names);
    return out;
  }();
  if (p.dir.empty()) MESSAGE("LOOM_PYTHON, build/examples/kjv_text or /usr/lib/bible.data missing: the tokenizer check is skipped");
  return p;
}

/// Little-endian values of type T in a file numpy wrote.
template <class T>
std::vector<T> read_values(const fs::path& path) {
  const std::string bytes = loom_test::read_bytes(path);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

std::string shown(const std::string& text) { return text.size() > 300 ? text.substr(0, 300) + "..." : text; }

TEST_CASE("Tokenizer: the ids and text of `tokenizers` on the KJV text and hard strings, for BPE and WordPiece files") {
  const Peer& p = peer();
  if (p.dir.empty()) return;
  const nlohmann::json meta = loom::json::read_file(p.dir / "texts.json");
  const auto all_texts = meta["texts"].get<std::vector<std::string>>();
  const auto all_verses = meta["verses"].get<std::size_t>();
  const auto hard = meta["hard"].get<std::size_t>();
  REQUIRE(all_verses == 31102);
  std::size_t whole_kjv = 0;
  for (const std::string& name : kNames) {
    CAPTURE(name);
    const Tokenizer tok = Tokenizer::from_file(p.dir / (name + ".json"));
    // The texts the peer encoded: every verse, or a sample of them (tokenizer_peer.py's
    // EVERY_VERSE), then the documents and the hard strings.
    const auto index = read_values<int64_t>(p.dir / (name + ".index"));
    std::vector<std::string> texts;
    std::size_t verses = 0;
    for (const int64_t i : index) {
      texts.push_back(all_texts.at(static_cast<std::size_t>(i)));
      verses += static_cast<std::size_t>(i) < all_verses;
    }
    REQUIRE(texts.size() == verses + (all_texts.size() - all_verses));
    REQUIRE(verses >= all_verses / 4);
    whole_kjv += verses == all_verses;
    const auto ids = read_values<int32_t>(p.dir / (name + ".ids"));
    const auto offsets = read_values<int64_t>(p.dir / (name + ".offsets"));
    REQUIRE(offsets.size() == texts.size() + 1);
    const auto encoded = tok.encode_batch(texts);
    std::size_t mismatches = 0, total = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const std::vector<int64_t> expected(ids.begin() + offsets[i], ids.begin() + offsets[i + 1]);
      total += expected.size();
      if (encoded[i] != expected && mismatches++ < 3) {
        INFO("text " << index[i] << ": '" << shown(texts[i]) << "'");
        CHECK(encoded[i] == expected);
      }
    }
    CHECK(mismatches == 0);
    CHECK(total > (verses == all_verses ? 500000 : 125000));  // the KJV (or its sample) went through
    // decode: the verses and hard strings without special tokens, the hard strings with them
    const nlohmann::json decoded = loom::json::read_file(p.dir / (name + ".decoded.json"));
    const auto skip = decoded["skip"].get<std::vector<std::string>>();
    const auto keep = decoded["keep"].get<std::vector<std::string>>();
    REQUIRE(skip.size() == verses + hard);
    std::size_t wrong = 0;
    for (std::size_t k = 0; k < skip.size(); ++k) {
      const std::size_t i = k < verses ? k : texts.size() - hard + (k - verses);
      const std::string got = tok.decode(encoded[i]);
      if (got != skip[k] && wrong++ < 3) {
        INFO("decode of text " << index[i] << ": '" << shown(texts[i]) << "'");
        CHECK(got == skip[k]);
      }
    }
    for (std::size_t k = 0; k < hard; ++k) {
      const std::size_t i = texts.size() - hard + k;
      if (tok.decode(encoded[i], /*skip_special_tokens=*/false) != keep[k] && wrong++ < 6) {
        INFO("decode (special tokens kept) of '" << shown(texts[i]) << "'");
        CHECK(tok.decode(encoded[i], false) == keep[k]);
      }
    }
    CHECK(wrong == 0);
  }
  CHECK(whole_kjv >= 5);  // one tokenizer of each family on every verse
  // An added token the normalizer respells: id_to_token spells it normalized, token_to_id finds
  // it by the file's spelling only (tokenizers' answers; its decode is checked above).
  const Tokenizer bert = Tokenizer::from_file(p.dir / "bert_uncased.json");
  const auto extra = bert.token_to_id("<Extra>");
  REQUIRE(extra.has_value());
  CHECK(bert.id_to_token(*extra) == "<extra>");
  CHECK_FALSE(bert.token_to_id("<extra>").has_value());
}

TEST_CASE("Tokenizer: padded, truncated batches equal transformers' tokenizer(texts, padding=..., truncation=...)") {
  const Peer& p = peer();
  if (p.dir.empty()) return;
  const nlohmann::json meta = loom::json::read_file(p.dir / "texts.json");
  const auto texts = meta["texts"].get<std::vector<std::string>>();
  const std::size_t n = texts.size(), hard = meta["hard"].get<std::size_t>();
  // verses, a 200-verse document and hard strings (the empty one included)
  const std::vector<std::size_t> some = {0, 1, 7, 31101, 31102, n - hard, n - hard + 8, n - hard + 13, n - 1};
  struct Case {
    std::string tokenizer, pad_token;
    PaddingStrategy padding;
    PaddingSide padding_side;
    TruncationSide truncation_side;
    bool truncation, add_special_tokens;
    std::optional<int64_t> max_length, multiple;
  };
  const std::vector<Case> cases = {
      {"bpe", "[PAD]", PaddingStrategy::longest, PaddingSide::right, TruncationSide::right, true, true, 16, {}},
      {"bert_uncased", "[PAD]", PaddingStrategy::max_length, PaddingSide::left, TruncationSide::left, true, true, 24, {}},
      {"llama3", "<|endoftext|>", PaddingStrategy::longest, PaddingSide::left, TruncationSide::right, true, false, 16, 8},
      {"bert_cased", "[PAD]", PaddingStrategy::longest, PaddingSide::right, TruncationSide::right, true, true, 48, 16},
      {"gpt2_split", "[PAD]", PaddingStrategy::longest, PaddingSide::right, TruncationSide::right, false, true, {}, {}},
  };
  nlohmann::json spec = nlohmann::json::array();
  for (const Case& c : cases) {
    nlohmann::json j = {{"tokenizer", c.tokenizer},
                        {"pad_token", c.pad_token},
                        {"padding", c.padding == PaddingStrategy::longest ? "longest" : "max_length"},
                        {"padding_side", c.padding_side == PaddingSide::left ? "left" : "right"},
                        {"truncation_side", c.truncation_side == TruncationSide::left ? "left" : "right"},
                        {"truncation", c.truncation},
                        {"add_special_tokens", c.add_special_tokens},
                        {"texts", some}};
    if (c.max_length) j["max_length"] = *c.max_length;
    if (c.multiple) j["pad_to_multiple_of"] = *c.multiple;
    spec.push_back(j);
  }
  loom_test::write_bytes(p.dir / "cases.json", spec.dump());
  run_ok(p.py + " " + p.script + " batch " + p.dir.string() + " " + (p.dir / "cases.json").string() + " " +
         (p.dir / "batches.json").string());
  const nlohmann::json expected = loom::json::read_file(p.dir / "batches.json");
  std::vector<std::string> chosen;
  for (const std::size_t i : some) chosen.push_back(texts[i]);
  for (std::size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    CAPTURE(c.tokenizer);
    const Tokenizer tok = Tokenizer::from_file(p.dir / (c.tokenizer + ".json"));
    EncodeOptions o;
    o.padding = c.padding;
    o.padding_side = c.padding_side;
    o.truncation_side = c.truncation_side;
    o.truncation = c.truncation;
    o.add_special_tokens = c.add_special_tokens;
    o.max_length = c.max_length;
    o.pad_to_multiple_of = c.multiple;
    o.pad_token_id = tok.token_to_id(c.pad_token);
    const loom::data::SequenceBatch b = tok(chosen, o);
    const auto rows = [](const torch::Tensor& t) {
      std::vector<std::vector<int64_t>> out;
      for (int64_t r = 0; r < t.size(0); ++r) {
        const auto row = t[r].contiguous();
        out.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
      }
      return out;
    };
    CHECK(rows(b.input_ids) == expected[k]["input_ids"].get<std::vector<std::vector<int64_t>>>());
    CHECK(rows(b.attention_mask) == expected[k]["attention_mask"].get<std::vector<std::vector<int64_t>>>());
  }
}

/// A small WordPiece BERT tokenizer.json; `edit` changes it before it is read.
nlohmann::json wordpiece_json() {
  return nlohmann::json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false,
                      "normalized": false, "special": true}],
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                   "strip_accents": null, "lowercase": true},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "in": 4, "the": 5, "##e": 6}}})");
}

/// A small byte-level BPE tokenizer.json.
nlohmann::json bpe_json() {
  return nlohmann::json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null, "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

std::string refusal(const nlohmann::json& j) {
  return error_of([&] { (void)Tokenizer::from_json(j.dump(), "tok.json"); });
}

TEST_CASE("Tokenizer: a tokenizer.json loom does not read is refused with one loom: line naming the field") {
  CHECK(refusal(wordpiece_json()) == "<no loom::Error>");
  CHECK(refusal(bpe_json()) == "<no loom::Error>");
  auto j = wordpiece_json();
  j["normalizer"] = {{"type", "Precompiled"}};
  CHECK(refusal(j) == "<no loom::Error>");  // Precompiled without a charsmap: the text as it is
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "not base64!"}};
  CHECK(refusal(j) == "loom: tok.json: normalizer.precompiled_charsmap is not base64 of a SentencePiece charsmap");
  j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "/////w=="}};
  CHECK(refusal(j).starts_with("loom: tok.json: normalizer.precompiled_charsmap holds a trie of 4294967295 bytes"));
  j["normalizer"] = {{"type", "NFKC_Casefold"}};
  CHECK(refusal(j) == "loom: tok.json: normalizer 'NFKC_Casefold' is not supported (loom reads BertNormalizer, "
                      "Lowercase, NFC, NFD, NFKC, NFKD, StripAccents, Prepend, Replace, Precompiled and Sequence of these)");
  j = wordpiece_json();
  using Array = nlohmann::json::array_t;
  j["model"] = {{"type", "Unigram"}, {"unk_id", 7}, {"vocab", Array{Array{"a", -1.0}, Array{"b", -2.0}}}};
  CHECK(refusal(j) == "loom: tok.json: model.unk_id must be an index of model.vocab (0..1), got 7");
  j["model"] = {{"type", "Unigram"}, {"vocab", Array{nlohmann::json(Array{"a", "high"})}}};
  CHECK(refusal(j) == "loom: tok.json: model.vocab[0] must be [piece, score], got [\"a\",\"high\"]");
  j["model"] = {{"type", "Unigram"}, {"unk_id", nullptr}, {"vocab", Array{nlohmann::json(Array{"a", -1.0})}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["added_tokens"] = nlohmann::json::array();
  const auto no_unk = Tokenizer::from_json(j.dump(), "tok.json");
  CHECK(no_unk.encode("aa") == std::vector<int64_t>{0, 0});
  CHECK(error_of([&] { (void)no_unk.encode("ab"); }) ==
        "loom: tok.json: the text holds 'b', which no piece of the Unigram model starts with, and the model has no unk_id");
  j = wordpiece_json();
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Replace"}}}}};
  CHECK(refusal(j) == "loom: tok.json: normalizer.normalizers[1].pattern must be {\"Regex\": ...} or {\"String\": ...}");
  j["normalizer"]["normalizers"][1] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}};
  CHECK(refusal(j) == "loom: tok.json: normalizer.normalizers[1].content must be a string");
  j = wordpiece_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.replacement must be a string");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.replacement must be one character, got 'ab'");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.prepend_scheme 'sometimes' is not supported (loom reads always, "
                      "first and never)");
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "first"}, {"add_prefix_space", false}};
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.add_prefix_space false does not match prepend_scheme (tokenizers "
                      "refuses it too)");
  j = wordpiece_json();
  j["pre_tokenizer"] = {{"type", "CharDelimiterSplit"}};
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer 'CharDelimiterSplit' is not supported (loom reads ByteLevel, "
                      "Split, BertPreTokenizer, Whitespace, WhitespaceSplit, Metaspace and Sequence of these)");
  j = wordpiece_json();
  j["model"]["type"] = "WordLevel";
  CHECK(refusal(j) == "loom: tok.json: model 'WordLevel' is not supported (loom reads BPE (byte-level or on "
                      "characters), Unigram and WordPiece)");
  j = wordpiece_json();
  j["decoder"] = {{"type", "CTC"}};
  CHECK(refusal(j) == "loom: tok.json: decoder 'CTC' is not supported (loom reads ByteLevel, WordPiece, Replace, "
                      "ByteFallback, Fuse, Strip, Metaspace, Sequence of these and none)");
  j["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "Fuse"}}, {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}}}};
  CHECK(refusal(j) == "loom: tok.json: decoder.decoders[1].start must be a count (a whole number >= 0)");
  j = wordpiece_json();
  j["post_processor"] = {{"type", "Unknown"}};
  CHECK(refusal(j).starts_with("loom: tok.json: post_processor 'Unknown' is not supported"));
  j = wordpiece_json();
  j["model"]["unk_token"] = "[NOPE]";
  CHECK(refusal(j) == "loom: tok.json: model.unk_token names the token '[NOPE]', which is not in the vocabulary");
  j = bpe_json();
  j["model"]["dropout"] = 0.1;
  CHECK(refusal(j) == "loom: tok.json: model.dropout is not supported (BPE dropout; loom encodes deterministically)");
  j = bpe_json();
  j["model"]["byte_fallback"] = true;
  CHECK(refusal(j) == "loom: tok.json: model.byte_fallback true is not supported with a ByteLevel pre_tokenizer "
                      "(every byte has its token there)");
  j = bpe_json();
  j["model"]["continuing_subword_prefix"] = "##";
  CHECK(refusal(j) == "loom: tok.json: model.continuing_subword_prefix is not supported with a ByteLevel pre_tokenizer "
                      "(byte-level BPE has none)");
  j = bpe_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};  // a BPE on characters: read
  CHECK(refusal(j) == "<no loom::Error>");
  j = bpe_json();
  j["model"]["merges"] = {"a c"};
  CHECK(refusal(j) == "loom: tok.json: model.merges[0] names the token 'c', which is not in the vocabulary");
  j = bpe_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"},
                                            {"invert", false}},
                                           {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  CHECK(refusal(j).starts_with("loom: tok.json: the regex '(a' does not compile in PCRE2"));
  // Oniguruma's class syntax PCRE2 has no spelling for: refused, not read otherwise
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a-z&&[^aeiou]]";
  CHECK(refusal(j) == "loom: tok.json: the regex '[a-z&&[^aeiou]]' uses the class intersection &&, which loom does not "
                      "read (PCRE2 has no such class)");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "[a[^b]]";
  CHECK(refusal(j) == "loom: tok.json: the regex '[a[^b]]' uses a negated bracket inside a bracket, which loom does not "
                      "read (PCRE2 has no such class)");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "a";
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.pretokenizers[0].invert true is not supported (loom reads Split "
                      "with invert false)");
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = false;
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Contiguous";
  CHECK(refusal(j) == "loom: tok.json: pre_tokenizer.pretokenizers[0].behavior 'Contiguous' is not supported (loom "
                      "reads Isolated, Removed, MergedWithPrevious, MergedWithNext)");
  // Fields of the wrong JSON type and ids no vocabulary has, each by its name (not a generic
  // JSON or allocation error).
  j = bpe_json();
  j["pre_tokenizer"]["add_prefix_space"] = "no";
  CHECK(refusal(j) == "loom: tok.json: 'add_prefix_space' must be true or false, got \"no\"");
  j = bpe_json();
  j["model"]["unk_token"] = 5;
  CHECK(refusal(j) == "loom: tok.json: model.unk_token must be a token (a string), got 5");
  j = bpe_json();
  j["model"]["vocab"]["a"] = int64_t{1} << 31;
  CHECK(refusal(j) == "loom: tok.json: model.vocab['a'] must be an id in [0, 16777216), got 2147483648");
  j = bpe_json();
  j["model"]["vocab"]["a"] = "0";
  CHECK(refusal(j) == "loom: tok.json: model.vocab['a'] must be an id in [0, 16777216), got \"0\"");
  j = wordpiece_json();
  j["added_tokens"] = {{{"id", (int64_t{1} << 31) + 1}, {"content", "[BIG]"}}};
  CHECK(refusal(j) == "loom: tok.json: added_tokens[0] must be an object with an id in [0, 16777216) and a string "
                      "content");
  j = wordpiece_json();
  j["model"]["continuing_subword_prefix"] = 2;
  CHECK(refusal(j) == "loom: tok.json: model.continuing_subword_prefix must be a string, got 2");
  CHECK(error_of([] { (void)Tokenizer::from_file("/nonexistent/tokenizer.json"); }) ==
        "loom: cannot read /nonexistent/tokenizer.json (a tokenizer.json, or a folder holding one)");
}

TEST_CASE("Tokenizer: bad calls end in loom: lines") {
  const Tokenizer tok = Tokenizer::from_json(wordpiece_json().dump(), "tok.json");
  CHECK(error_of([&] { (void)tok.encode("caf\xC3"); }) == "loom: Tokenizer: the text is not valid UTF-8 (byte 3 of 4)");
  CHECK(error_of([&] { (void)tok.decode(std::vector<int64_t>{4, 99}); }) ==
        "loom: Tokenizer::decode: id 99 is outside the vocabulary (0..6)");
  EncodeOptions o;
  o.truncation = true;
  CHECK(error_of([&] { (void)tok.encode("in the", o); }) == "loom: Tokenizer: truncation needs max_length");
  o.max_length = 1;
  CHECK(error_of([&] { (void)tok.encode("in the", o); }) ==
        "loom: Tokenizer: max_length 1 is shorter than the 2 special tokens the post-processor adds");
  const std::vector<std::string> texts = {"in the"};
  const Tokenizer bpe = Tokenizer::from_json(bpe_json().dump(), "bpe.json");
  CHECK(error_of([&] { (void)bpe(texts); }) ==
        "loom: Tokenizer: padding needs a pad token and bpe.json names none; set EncodeOptions::pad_token_id");
  EncodeOptions odd;  // transformers refuses the same
  odd.truncation = true;
  odd.max_length = 12;
  odd.pad_to_multiple_of = 8;
  odd.pad_token_id = 0;
  CHECK(error_of([&] { (void)bpe(texts, odd); }) ==
        "loom: Tokenizer: truncation to max_length 12 and pad_to_multiple_of 8 disagree (a multiple of it, as in transformers)");
  // the file's [PAD] is not a pad token by itself; tokenizer.json's padding names one
  auto with_pad = wordpiece_json();
  with_pad["padding"] = {{"pad_id", 0}, {"pad_token", "[PAD]"}};
  CHECK(Tokenizer::from_json(with_pad.dump()).pad_token_id() == 0);
  CHECK(tok.num_special_tokens_to_add() == 2);
  CHECK(tok.vocab_size() == 7);
  CHECK(tok.token_to_id("##e") == 6);
  CHECK(tok.id_to_token(5) == "the");
}

TEST_CASE("Tokenizer: a folder's tokenizer_config.json names the pad token, as AutoTokenizer reads it") {
  const fs::path dir = loom_test::fresh_dir("data/tokenizer_folder");
  loom_test::write_bytes(dir / "tokenizer.json", wordpiece_json().dump());
  CHECK(Tokenizer::from_file(dir).pad_token_id() == std::nullopt);
  loom_test::write_bytes(dir / "tokenizer_config.json", R"({"pad_token": {"content": "[PAD]"}})");
  const Tokenizer tok = Tokenizer::from_file(dir);
  REQUIRE(tok.pad_token_id() == tok.token_to_id("[PAD]"));
  const std::vector<std::string> texts = {"in the", "the"};
  const auto batch = tok(texts);  // [CLS] in the [SEP] / [CLS] the [SEP] [PAD]
  CHECK(batch.input_ids[1][3].item<int64_t>() == *tok.token_to_id("[PAD]"));
  CHECK(batch.attention_mask.sum(1).equal(torch::tensor({4, 3}, torch::kLong)));
}

TEST_CASE("Tokenizer: calls from several threads give the ids of one thread") {
  const Peer& p = peer();
  if (p.dir.empty()) return;
  const auto texts = loom::json::read_file(p.dir / "texts.json")["texts"].get<std::vector<std::string>>();
  for (const std::string name : {"gpt2_split", "bert_uncased"}) {
    CAPTURE(name);
    const Tokenizer tok = Tokenizer::from_file(p.dir / (name + ".json"));
    std::vector<std::vector<int64_t>> threaded(texts.size());
    {
      std::vector<std::jthread> workers;
      for (std::size_t w = 0; w < 4; ++w)
        workers.emplace_back([&, w] {
          for (std::size_t i = w; i < texts.size(); i += 4) threaded[i] = tok.encode(texts[i]);
        });
    }
    CHECK(threaded == Tokenizer::from_file(p.dir / (name + ".json")).encode_batch(texts));
  }
}

}  // namespace tokenizer_test
