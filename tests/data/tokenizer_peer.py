"""Python side of tests/data/test_tokenizer.cpp and benchmarks/tokenizer: tokenizer.json files
made here without network, and what the `tokenizers` package (and transformers) make of a corpus.

  tokenizer_peer.py make KJV_TXT OUT        trains the tokenizers below on the verses of KJV_TXT
                                            (build/examples/kjv_text's output) into OUT/<name>.json,
                                            and writes OUT/texts.json: the verses, the first 4000
                                            verses again as documents of 200 joined by newlines,
                                            and the hard strings below
  tokenizer_peer.py encode OUT NAME...       OUT/<name>.json on OUT/texts.json: OUT/<name>.ids (int32)
                                            and .offsets (int64, n + 1), OUT/<name>.decoded.json
                                            (decode with and without special tokens)
  tokenizer_peer.py batch OUT CASES RESULT  transformers' tokenizer(texts, padding=..., truncation=...,
                                            max_length=..., return_tensors="np") for each case of
                                            CASES (JSON) into RESULT (JSON)
  tokenizer_peer.py bench KJV_TXT JSON      single-thread tokens/s of `tokenizers` on the verses

The tokenizers (each refers to the same trained vocabularies):
  bpe           examples/text_data/prepare.py's byte-level BPE (GPT-2's ByteLevel pre-tokenizer)
  gpt2_split    the same model behind GPT-2's pattern as a Split regex, ByteLevel with
                add_prefix_space; added tokens: "Jesus Christ" (single_word), "<mask>" (special, lstrip)
  llama3        the same model with Llama 3's pattern, ignore_merges, <|begin_of_text|> prepended
                by a TemplateProcessing behind ByteLevel (Llama 3's Sequence)
  bert_uncased  a WordPiece trained with WordPieceTrainer: BertNormalizer (lowercase), BertPreTokenizer,
                [CLS] $A [SEP], WordPiece decoder; added (normalized) "Lord God"
  bert_cased    a cased WordPiece: BertNormalizer(lowercase=False), BertProcessing
  wordpiece_seq bert_uncased's model behind Sequence[NFKD, StripAccents, Lowercase] and Whitespace
  bpe_behaviors the BPE behind NFC and Splits of each behavior (MergedWithPrevious, MergedWithNext,
                a String Removed) before ByteLevel's regex; RobertaProcessing
  wordpiece_ws  bert_uncased's model behind Sequence[NFC, Lowercase], WhitespaceSplit, BertProcessing,
                the WordPiece decoder without cleanup
"""

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "text_data"))

DOCUMENT_VERSES = 4000  # the verses also encoded as documents of 200 (make)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

HARD = [
    "", " ", "  ", "\n", "\n\n\n", "\t\t x", "   leading and trailing   ", "a  b   c    d",
    "Hello, world! It's 2024; they'll say we've done 1234567 things, isn't it?",
    "I'M SHOUTING, YOU'RE LISTENING, HE'D KNOW, WE'LL SEE, THEY'VE GONE",
    "numbers: 3.14159 2,718 1e10 0x1F 007 12345678901234567890 ١٢٣ ½ ²",
    "Ünïcödé: café, naïve, résumé, Ångström, Øre, straße, İstanbul, ΣΊΣΥΦΟΣ",
    "中文字符和日本語のテキスト, 한국어 텍스트",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ and flags 🏳️‍🌈",
    "Arabic: مرحبا بالعالم; Hebrew: שלום עולם; Hindi: नमस्ते दुनिया",
    "tabs\tand\r\nwindows\rline\u2028separators\u00a0nbsp\u3000ideographic",
    "zero\u200bwidth\u200djoiner\ufeffbom and control \x01\x02\x7f chars",
    "combining: e\u0301 a\u0300 n\u0303 (NFD) vs \u00e9 \u00e0 \u00f1 (NFC); ligature \ufb01 fullwidth ＡＢＣ",
    "punctuation!!! ...??? --- ((nested)) [brackets] {braces} <angles> \"quotes\" 'single' `back`",
    "code: def f(x): return x**2 + 3*x - 1  # comment\n    if a != b && c >= d: pass",
    "URL https://example.com/path?q=1&r=two#frag and e-mail someone@example.org",
    "<|endoftext|> between <|endoftext|>text[CLS] and [SEP]  [MASK] [PAD]",
    "a <mask> b<mask>c   <mask>   d",
    "Jesus Christ, JesusChrist, the Jesus Christ's grace, xJesus Christ",
    "And the Lord God said; LORD GOD, lord god, Lord Godhead",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "supercalifragilisticexpialidocious " * 3,
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE don't can't won't ma'am o'clock",
    "   \n  \n\t  spaces before newlines   \n",
    "x" + " " * 40 + "y",
    "\u0130\u0131 \u03a3\u03c3\u03c2 \u1e9e \u2126 \u212a",
    "math ∑∫√∞≈≠ ≤ ≥ ± × ÷ € £ ¥ ₹ © ® ™ § ¶",
    "\u00ad soft\u00adhyphen and \u0085 next-line",
    "🙂" * 12,
]

SPECIALS = ["<|endoftext|>", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]


def verses(kjv_txt):
    return [line for line in Path(kjv_txt).read_text(encoding="utf-8").splitlines() if line.strip()]


def make(kjv_txt, out):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    import prepare

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lines = verses(kjv_txt)
    texts = list(lines)
    # Long texts: documents of 200 verses joined by newlines. Twenty of them (Genesis to
    # Leviticus) show how long inputs and line breaks encode; all 156 took two thirds of the
    # test's time (long texts are the slow case of `tokenizers`' BPE) and found nothing more.
    texts += ["\n".join(lines[i:i + 200]) for i in range(0, DOCUMENT_VERSES, 200)]
    texts += HARD
    (out / "texts.json").write_text(json.dumps({"texts": texts, "hard": len(HARD), "verses": len(lines)}))

    bpe = prepare.train_tokenizer(lines, 2000, 2, SPECIALS)
    bpe.save(str(out / "bpe.json"))
    model = json.loads(bpe.to_str())["model"]
    vocab, merges = model["vocab"], [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]

    def byte_bpe(pattern, add_prefix_space, ignore_merges):
        tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(SPECIALS)
        return tok

    gpt2 = byte_bpe(GPT2_PATTERN, True, False)
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_tokens([AddedToken("Jesus Christ", single_word=True)])
    gpt2.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    gpt2.save(str(out / "gpt2_split.json"))

    llama = byte_bpe(LLAMA3_PATTERN, False, True)
    llama.add_special_tokens(["<|begin_of_text|>"])
    bos = llama.token_to_id("<|begin_of_text|>")
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    llama.save(str(out / "llama3.json"))

    def wordpiece(lowercase):
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=3000, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                            show_progress=False)
        tok.train_from_iterator(lines, trainer=trainer)
        tok.decoder = decoders.WordPiece(prefix="##")
        return tok

    uncased = wordpiece(True)
    cls, sep = uncased.token_to_id("[CLS]"), uncased.token_to_id("[SEP]")
    uncased.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    uncased.add_tokens(["Lord God"])
    uncased.save(str(out / "bert_uncased.json"))

    cased = wordpiece(False)
    cased.post_processor = processors.BertProcessing(("[SEP]", cased.token_to_id("[SEP]")),
                                                     ("[CLS]", cased.token_to_id("[CLS]")))
    cased.save(str(out / "bert_cased.json"))

    behaviors = byte_bpe(r"\s+", False, False)  # Split(\s+) replaced below
    behaviors.normalizer = normalizers.NFC()
    behaviors.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[,.;:!?]"), behavior="merged_with_next"),
        pre_tokenizers.Split(" the ", behavior="removed"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    behaviors.post_processor = processors.RobertaProcessing(("[SEP]", behaviors.token_to_id("[SEP]")),
                                                            ("[CLS]", behaviors.token_to_id("[CLS]")))
    behaviors.save(str(out / "bpe_behaviors.json"))

    ws = Tokenizer.from_str(uncased.to_str())
    ws.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    ws.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    ws.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    ws.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    ws.save(str(out / "wordpiece_ws.json"))

    seq = Tokenizer.from_str(uncased.to_str())
    seq.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()])
    seq.pre_tokenizer = pre_tokenizers.Whitespace()
    seq.save(str(out / "wordpiece_seq.json"))


def encode(out, *names):
    for name in names:
        encode_one(Path(out), name)


def encode_one(out, name):
    from tokenizers import Tokenizer
    meta = json.loads((out / "texts.json").read_text())
    texts = meta["texts"]
    tok = Tokenizer.from_file(str(out / f"{name}.json"))
    ids = [e.ids for e in tok.encode_batch(texts)]
    offsets = np.zeros(len(ids) + 1, dtype="<i8")
    offsets[1:] = np.cumsum([len(i) for i in ids])
    np.concatenate([np.asarray(i, dtype="<i4") for i in ids]).tofile(out / f"{name}.ids")
    offsets.tofile(out / f"{name}.offsets")
    # decoded: the verses and the hard strings (skip_special_tokens=True), the hard strings kept special
    verse_ids = ids[:meta["verses"]] + ids[-meta["hard"]:]
    decoded = tok.decode_batch(verse_ids, skip_special_tokens=True)
    kept = tok.decode_batch(ids[-meta["hard"]:], skip_special_tokens=False)
    (out / f"{name}.decoded.json").write_text(json.dumps({"skip": decoded, "keep": kept}))


def batch(out, cases_file, result_file):
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    out = Path(out)
    texts = json.loads((out / "texts.json").read_text())["texts"]
    results = []
    for case in json.loads(Path(cases_file).read_text()):
        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(out / f"{case['tokenizer']}.json")),
                                      pad_token=case["pad_token"])
        tok.padding_side = case["padding_side"]
        tok.truncation_side = case["truncation_side"]
        chosen = [texts[i] for i in case["texts"]]
        enc = tok(chosen, padding=case["padding"], truncation=case["truncation"], max_length=case.get("max_length"),
                  pad_to_multiple_of=case.get("pad_to_multiple_of"), add_special_tokens=case["add_special_tokens"],
                  return_tensors="np")
        results.append({"input_ids": enc["input_ids"].tolist(), "attention_mask": enc["attention_mask"].tolist()})
    Path(result_file).write_text(json.dumps(results))


def bench(kjv_txt, name_json):
    """Tokens/s of `tokenizers` (one thread: RAYON_NUM_THREADS=1 and encode one text at a time)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(name_json)
    lines = verses(kjv_txt)
    tok.encode_batch(lines[:2000])  # warm-up
    best = None
    for _ in range(3):
        start = time.perf_counter()
        total = sum(len(tok.encode(line).ids) for line in lines)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    print(json.dumps({"tokens": total, "seconds": best, "tokens_per_s": total / best, "texts": len(lines)}))


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    {"make": make, "encode": encode, "batch": batch, "bench": bench}[command](*args)
