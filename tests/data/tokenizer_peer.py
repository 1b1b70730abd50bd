"""Python side of tests/data/test_tokenizer.cpp and benchmarks/tokenizer: tokenizer.json files
made here without network, and what the `tokenizers` package (and transformers) make of a corpus.

  tokenizer_peer.py make KJV_TXT OUT        trains the tokenizers below on the verses of KJV_TXT
                                            (build/examples/kjv_text's output) into OUT/<name>.json,
                                            and writes OUT/texts.json: the verses, the first 4000
                                            verses again as documents of 200 joined by newlines,
                                            and the hard strings below
  tokenizer_peer.py encode OUT NAME...       OUT/<name>.json on OUT/texts.json (all of them, or every
                                            4th verse and the rest: EVERY_VERSE): OUT/<name>.index
                                            (int64, the texts encoded), .ids (int32) and .offsets
                                            (int64, n + 1), OUT/<name>.decoded.json (decode with and
                                            without special tokens)
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
                a String Removed, Isolated with Oniguruma's \b \w \s and a nested bracket) before
                ByteLevel's regex; RobertaProcessing
  bpe_prefix    the BPE without added tokens behind Replace("\u00ad", "") and ByteLevel with
                add_prefix_space (an empty text, or one the normalizer empties, has no ids)
  wordpiece_ws  bert_uncased's model behind Sequence[NFC, Lowercase], WhitespaceSplit, BertProcessing,
                the WordPiece decoder without cleanup
  llama2_sp     SentencePiece's BPE as transformers converts Llama 2's tokenizer: a BPE on characters
                with byte_fallback (<0x00>..<0xFF> in the vocabulary) and fuse_unk, normalizer
                Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer (a text is one piece),
                <s> prepended, decoder Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)];
                trained on characters cut to the 120 most frequent, so the rest fall back to bytes
  metaspace_sp  the same vocabulary without byte tokens behind a Metaspace pre-tokenizer
                (prepend_scheme first, split), unknown characters as one fused <unk>, the Metaspace
                decoder (Mistral's and newer conversions' layout)
  t5_unigram    a Unigram model trained by SentencePiece itself (nmt_nfkc, with its byte pieces), laid
                out as transformers lays out T5's: the Precompiled normalizer (SentencePiece's
                charsmap), Sequence[WhitespaceSplit, Metaspace], "$A </s>", the Metaspace decoder
  xlmr_unigram  the same model with byte_fallback, as XLM-R's layout but Sequence[Precompiled,
                Replace(" {2,}", " ")] and Metaspace(prepend_scheme first, no split) alone,
                "<s> $A </s>", decoder Sequence[ByteFallback, Metaspace]
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
    "<s> literal specials </s><s>and <unk> between, <0x41> spelled out, and ▁ the metaspace ▁▁ itself",
    " leading space, then two  and three   spaces; a trailing one ",
    "<Extra> x <extra> <EXTRA>; ünïcödé word and Ünïcödé Word and unicode word",
    # single_word's word characters (Rust regex's \w: Alphabetic, marks, Nd, Pc, the joiners; not
    # No) on either side of "Jesus Christ": connector punctuation, other numbers, letter numbers,
    # circled and squared letters, joiners, marks, modifier letters, format and space characters
    ", ".join(f"Jesus Christ{c}, {c}Jesus Christ" for c in "_\u203f\u2040\u2054\ufe33\ufe4d\uff3f\u00b2\u00bd\u2460\u0f33"
              "\u2160\u3007\U00010341\u24b6\u24e9\U0001f130\U0001f150\U0001f170\U0001f189\u200c\u200d\u0301\u0903\u20dd"
              "\u02b0\u3005\u00ad\u200b\u2060\ufeff\u180e\u00a0\u3000\u0085\u0665\uff10\u00aa\u00b5\u00ba"),
    # Oniguruma's \s and \w in the regexes: U+180E is no space there (PCRE2's \s has it)
    "x\u180e\u180e! a\u180eb \u180e\u180e a; \u24b6\u24b7 \U0001f150x_y\u203fz \u00b2\u00b3 \u00bd- \u2460\u2461",
    "\u00ad", "\u00ad\u00ad x\u00ad", "[CLS]\u00ad[SEP]",
]

SPECIALS = ["<|endoftext|>", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]


def sweep_points():
    """The code points of the Unicode sweep: every one assigned by Unicode 3.2 (Python's
    unicodedata.ucd_3_2_0; their categories and decompositions are the same in every table
    since, so a difference is loom's, not a Unicode version's), surrogates aside, and code points
    unassigned in every version so far (gaps in Greek and Armenian, the noncharacters)."""
    import unicodedata
    old = unicodedata.ucd_3_2_0
    uniform = [(0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xF8FF), (0x20000, 0x2A6DF),
               (0xF0000, 0x10FFFD)]  # CJK ideographs, Hangul syllables, private use: every 97th
    points = [c for c in range(0x110000)
              if not 0xD800 <= c <= 0xDFFF and old.category(chr(c)) != "Cn"
              and not any(lo <= c <= hi and (c - lo) % 97 for lo, hi in uniform)]
    points += [0x0378, 0x0379, 0x0380, 0x0381, 0x0382, 0x0383, 0x038B, 0x038D, 0x03A2, 0x0530, 0x0557, 0x0558,
               0xFDD0, 0xFDEF, 0xFFFE, 0xFFFF, 0x1FFFE, 0x10FFFF]
    # Left out: the code points whose category Unicode changed after 3.2 where the two sides'
    # tables differ (docs/api.md, "Text in and out"): U+166D Po -> So (12.0), U+1734 Mn -> Mc
    # (14.0), U+1885 and U+1886 Lo -> Mn (9.0). (U+180E, Zs -> Cf in 6.3, is in: a space to
    # PCRE2's \s, not to Oniguruma's or Rust's, which loom's regexes now follow.)
    changed = {0x166D, 0x1734, 0x1885, 0x1886}
    return [c for c in points if c not in changed]


def unicode_sweep():
    """Texts of 48 sweep points each: every point after a letter, before a letter, doubled and
    alone between spaces: which characters count as letters, numbers, marks, whitespace or word
    characters shows in where the pre-tokenizers and added tokens split, what the normalizers do
    to them and which fall back to bytes or unk."""
    points = sweep_points()
    return [" ".join(f"a{chr(c)}b{chr(c)}{chr(c)} {chr(c)}" for c in points[i:i + 48]) for i in range(0, len(points), 48)]


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
    hard = HARD + unicode_sweep()
    texts += hard
    (out / "texts.json").write_text(json.dumps({"texts": texts, "hard": len(hard), "verses": len(lines)}))

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
    # Added tokens the normalizer respells (matched lowercased, spelled so by id_to_token and
    # decode, found by token_to_id only as the file spells them; the special one never skipped)
    uncased.add_special_tokens([AddedToken("<Extra>", normalized=True, special=True)])
    uncased.add_tokens([AddedToken("Ünïcödé Word", normalized=True)])
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
        # Oniguruma's \b, \w and \s, and a bracket nested in a bracket (BLOOM's pattern)
        pre_tokenizers.Split(Regex(r"\b\w+\b|[^(\s|[.,!?…。，、।۔،])]+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    behaviors.post_processor = processors.RobertaProcessing(("[SEP]", behaviors.token_to_id("[SEP]")),
                                                            ("[CLS]", behaviors.token_to_id("[CLS]")))
    behaviors.save(str(out / "bpe_behaviors.json"))

    # ByteLevel with add_prefix_space first, no added tokens, a normalizer that can empty a
    # text (soft hyphens removed): an empty text stays without ids
    prefix = Tokenizer(models.BPE(vocab, merges))
    prefix.normalizer = normalizers.Replace("\u00ad", "")
    prefix.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    prefix.decoder = decoders.ByteLevel()
    prefix.save(str(out / "bpe_prefix.json"))

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

    # SentencePiece-style BPEs: pieces learned on "▁"-joined words, then laid out as transformers'
    # converters write Llama 2's (legacy) and newer (Metaspace) tokenizer.json files.
    sp = Tokenizer(models.BPE(unk_token="<unk>"))
    sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    sp.train_from_iterator(lines[:8000], trainer=trainers.BpeTrainer(vocab_size=1500, limit_alphabet=120, show_progress=False))
    learned = json.loads(sp.to_str())["model"]
    pieces = sorted(learned["vocab"].items(), key=lambda kv: kv[1])
    sp_merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    specials = ["<unk>", "<s>", "</s>"]

    def sp_vocab(with_bytes):
        names = specials + ([f"<0x{b:02X}>" for b in range(256)] if with_bytes else [])
        names += [t for t, _ in pieces if t not in names]
        return {t: i for i, t in enumerate(names)}

    def with_bos(tok, bos_id):
        tok.add_special_tokens(specials)
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", bos_id)])
        return tok

    llama2 = Tokenizer(models.BPE(sp_vocab(True), sp_merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    llama2.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    llama2.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
    with_bos(llama2, 1).save(str(out / "llama2_sp.json"))

    unigram(lines, out)

    meta = Tokenizer(models.BPE(sp_vocab(False), sp_merges, unk_token="<unk>", fuse_unk=True))
    meta.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    meta.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    with_bos(meta, 1).save(str(out / "metaspace_sp.json"))


def unigram(lines, out):
    """t5_unigram and xlmr_unigram: a Unigram model SentencePiece trains on the verses."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    corpus = out / "unigram_corpus.txt"
    corpus.write_text("\n".join(lines[:8000]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(out / "unigram"), vocab_size=2000,
                                   model_type="unigram", character_coverage=0.9995, byte_fallback=True,
                                   normalization_rule_name="nmt_nfkc", minloglevel=2, num_threads=1)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((out / "unigram.model").read_bytes())
    vocab = [(p.piece, p.score) for p in proto.pieces]
    unk = next(i for i, p in enumerate(proto.pieces) if p.type == 2)  # UNKNOWN
    charsmap = proto.normalizer_spec.precompiled_charsmap
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}

    t5 = Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=False))
    t5.normalizer = normalizers.Precompiled(charsmap)
    t5.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
    t5.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    t5.add_special_tokens(["<unk>", "<s>", "</s>"])
    t5.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", ids["</s>"])])
    t5.save(str(out / "t5_unigram.json"))

    xlmr = Tokenizer(models.Unigram(vocab, unk_id=unk, byte_fallback=True))
    xlmr.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap), normalizers.Replace(Regex(" {2,}"), " ")])
    xlmr.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    xlmr.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")])
    xlmr.add_special_tokens(["<unk>", "<s>", "</s>"])
    xlmr.post_processor = processors.TemplateProcessing(single="<s> $A </s>",
                                                        special_tokens=[("<s>", ids["<s>"]), ("</s>", ids["</s>"])])
    xlmr.save(str(out / "xlmr_unigram.json"))


def encode(out, *names):
    for name in names:
        encode_one(Path(out), name)


# The tokenizers that encode every verse: one of each model and pre-tokenizer family (GPT-2's
# and Llama 3's byte-level BPE, BERT's WordPiece, Llama 2's SentencePiece BPE, T5's Unigram).
# The other variants share those vocabularies and differ in a normalizer, pre-tokenizer or
# added-token rule: they encode every SAMPLED_EVERY-th verse, the documents and the hard strings
# (each KJV pass costs ~2 s a tokenizer on both sides; the test's checks found nothing in the
# rest of the verses that the sample and the hard strings do not hold).
EVERY_VERSE = {"gpt2_split", "llama3", "bert_uncased", "llama2_sp", "t5_unigram"}
SAMPLED_EVERY = 4


def encode_one(out, name):
    from tokenizers import Tokenizer
    meta = json.loads((out / "texts.json").read_text())
    every = 1 if name in EVERY_VERSE else SAMPLED_EVERY
    index = [i for i in range(len(meta["texts"])) if i >= meta["verses"] or i % every == 0]
    texts = [meta["texts"][i] for i in index]
    verses = sum(1 for i in index if i < meta["verses"])
    tok = Tokenizer.from_file(str(out / f"{name}.json"))
    ids = [e.ids for e in tok.encode_batch(texts)]
    offsets = np.zeros(len(ids) + 1, dtype="<i8")
    offsets[1:] = np.cumsum([len(i) for i in ids])
    np.concatenate([np.asarray(i, dtype="<i4") for i in ids]).tofile(out / f"{name}.ids")
    offsets.tofile(out / f"{name}.offsets")
    np.asarray(index, dtype="<i8").tofile(out / f"{name}.index")
    # decoded: the verses and the hard strings (skip_special_tokens=True), the hard strings kept special
    verse_ids = ids[:verses] + ids[-meta["hard"]:]
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
