#!/usr/bin/env python3
"""Tokenize the King James Bible into token files that loom's datasets memory-map.

Input: the verse lines "<Book><chapter>:<verse> <text>" that build/examples/kjv_text writes
(Debian's bible-kjv-text, decoded). Output, in --out:

  tokenizer.json, tokenizer_config.json
      a byte-level BPE trained here with the `tokenizers` package (no download), saved
      through transformers' PreTrainedTokenizerFast so AutoTokenizer.from_pretrained(out)
      opens it too. Special tokens, in this order (ids 0..4): <|endoftext|> (GPT-2's end of
      text, also bos/unk), [PAD], [CLS], [SEP], [MASK].
  train.bin, val.bin
      causal LM: flat token ids, little-endian uint16 (uint32 when the vocabulary does not
      fit), the nanoGPT / llm.c convention; read with np.fromfile(path, dtype). A document is
      one book, its verses joined by newlines, followed by <|endoftext|>. val is the last
      --val_fraction of the verses (as char_lm holds out the end of the text).
  classify_{train,val}.bin / .offsets / .labels
      classification, verse -> the book's group (LABELS below): a ragged token file. .bin
      holds the ids of every example one after another ([CLS] verse [SEP], at most
      --max_length ids, in the dtype above), .offsets the uint64 start of each example plus
      the end (n + 1 values, the first 0), .labels one int64 label per example. The split
      is a seeded shuffle of the verses (--seed), --cls_val_fraction of them held out.
  meta.json
      what a reader needs: dtype, vocab_size, the special token ids, the file names, token
      and example counts, the label names and counts, and the majority-class accuracy of
      the held-out set (the baseline a classifier must beat).

The same input and options give the same bytes (the BPE trainer is deterministic, the
shuffle seeded). --limit N keeps N verses spread evenly over the text (every book group
stays present), for quick runs and tests.

  build/examples/kjv_text --output kjv.txt
  .venv/bin/python examples/text_data/prepare.py --input kjv.txt --out data/kjv
  .venv/bin/python examples/text_data/prepare.py --kjv_text build/examples/kjv_text --out data/kjv
"""

import argparse
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]
EOS, PAD, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))

# The traditional division of the 66 books, by their order in the KJV: [first book, label).
LABELS = ["law", "history", "poetry", "prophets", "gospels_acts", "epistles", "revelation"]
GROUP_STARTS = [0, 5, 17, 22, 39, 44, 65]  # Genesis, Joshua, Job, Isaiah, Matthew, Romans, Revelation
BOOKS = 66

VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def fail(message):
    sys.exit(f"prepare.py: {message}")


def read_verses(text, source):
    """[(book index, verse text)] from the kjv_text lines; each book a new index in order of appearance."""
    verses, books = [], []
    for number, line in enumerate(text.splitlines(), 1):
        m = VERSE.match(line)
        if m is None:
            fail(f"{source}:{number}: not a verse line '<Book><chapter>:<verse> <text>': {line[:60]!r}")
        if not books or books[-1] != m.group(1):
            if m.group(1) in books:
                fail(f"{source}:{number}: book {m.group(1)} appears again after other books")
            books.append(m.group(1))
        verses.append((len(books) - 1, m.group(4)))
    if len(books) != BOOKS:
        fail(f"{source}: {len(books)} books, the King James Bible has {BOOKS} (kjv_text writes them)")
    return verses


def group_of(book):
    return max(g for g, start in enumerate(GROUP_STARTS) if book >= start)


def train_tokenizer(texts, vocab_size, min_frequency):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def save_tokenizer(tok, out):
    # transformers writes tokenizer.json with the config files that AutoTokenizer reads.
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[EOS], bos_token=SPECIAL_TOKENS[EOS],
                                   unk_token=SPECIAL_TOKENS[EOS], pad_token=SPECIAL_TOKENS[PAD],
                                   cls_token=SPECIAL_TOKENS[CLS], sep_token=SPECIAL_TOKENS[SEP],
                                   mask_token=SPECIAL_TOKENS[MASK])
    fast.save_pretrained(str(out))


def lm_documents(verses):
    """Books as documents: their verse texts joined by newlines."""
    docs = []
    for i, (book, text) in enumerate(verses):
        if i == 0 or verses[i - 1][0] != book:
            docs.append([])
        docs[-1].append(text)
    return ["\n".join(d) for d in docs]


def lm_split(tok, verses, dtype, path):
    docs = lm_documents(verses)
    ids = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(EOS)
    np.asarray(ids, dtype=dtype).tofile(path)
    return {"file": path.name, "tokens": len(ids), "documents": len(docs), "verses": len(verses)}


def classification_split(tok, examples, dtype, max_length, out, name):
    texts = [t for t, _ in examples]
    ids, offsets, labels = [], [0], []
    for enc, (_, label) in zip(tok.encode_batch(texts, add_special_tokens=False), examples):
        seq = [CLS] + enc.ids[: max_length - 2] + [SEP]
        ids.extend(seq)
        offsets.append(len(ids))
        labels.append(label)
    files = {"ids": f"{name}.bin", "offsets": f"{name}.offsets", "labels": f"{name}.labels"}
    np.asarray(ids, dtype=dtype).tofile(out / files["ids"])
    np.asarray(offsets, dtype="<u8").tofile(out / files["offsets"])
    np.asarray(labels, dtype="<i8").tofile(out / files["labels"])
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(LABELS)).tolist()
    return {**files, "examples": len(labels), "tokens": len(ids), "label_counts": counts,
            "majority_accuracy": max(counts) / max(1, len(labels))}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", type=Path, help="verse lines as kjv_text writes them")
    src.add_argument("--kjv_text", type=Path, help="run this kjv_text program for the verse lines")
    p.add_argument("--data_file", default="/usr/lib/bible.data", help="kjv_text's --data_file")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--vocab_size", type=int, default=8192, help="BPE vocabulary, special tokens included")
    p.add_argument("--min_frequency", type=int, default=2, help="a merge must occur this often")
    p.add_argument("--limit", type=int, default=None, help="keep N verses spread evenly over the text")
    p.add_argument("--val_fraction", type=float, default=0.05, help="causal LM: the last fraction of the verses")
    p.add_argument("--cls_val_fraction", type=float, default=0.1, help="classification: held-out share")
    p.add_argument("--max_length", type=int, default=128, help="classification: ids per example, [CLS]/[SEP] included")
    p.add_argument("--seed", type=int, default=1234, help="the classification split's shuffle")
    a = p.parse_args()
    if not 256 + len(SPECIAL_TOKENS) <= a.vocab_size <= 2**32:
        fail(f"--vocab_size must lie in [{256 + len(SPECIAL_TOKENS)}, 2^32] (byte alphabet + special tokens)")
    if not 0 < a.val_fraction < 1 or not 0 < a.cls_val_fraction < 1:
        fail("--val_fraction and --cls_val_fraction must lie in (0, 1)")
    if a.max_length < 3:
        fail("--max_length must be at least 3 ([CLS], one token, [SEP])")
    if a.limit is not None and a.limit < 20:
        fail("--limit must be at least 20 verses")

    start = time.time()
    if a.input:
        try:
            text, source = a.input.read_text(encoding="utf-8"), str(a.input)
        except OSError as e:
            fail(f"cannot read {a.input}: {e.strerror}")
    else:
        run = subprocess.run([str(a.kjv_text), "--data_file", a.data_file], capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"{a.kjv_text} failed: {run.stderr.strip()}")
        text, source = run.stdout, str(a.kjv_text)
    verses = read_verses(text, source)
    if a.limit is not None and a.limit < len(verses):
        verses = [verses[i * len(verses) // a.limit] for i in range(a.limit)]

    a.out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer([t for _, t in verses], a.vocab_size, a.min_frequency)
    save_tokenizer(tok, a.out)
    vocab_size = tok.get_vocab_size()
    dtype = "<u2" if vocab_size <= 2**16 else "<u4"

    n_val = max(1, round(len(verses) * a.val_fraction))
    lm = {"train": lm_split(tok, verses[:-n_val], dtype, a.out / "train.bin"),
          "val": lm_split(tok, verses[-n_val:], dtype, a.out / "val.bin")}

    examples = [(t, group_of(book)) for book, t in verses]
    order = list(range(len(examples)))
    random.Random(a.seed).shuffle(order)
    n_cls_val = max(1, round(len(order) * a.cls_val_fraction))
    val_idx, train_idx = sorted(order[:n_cls_val]), sorted(order[n_cls_val:])
    cls = {"task": "verse -> the group of its book", "label_names": LABELS, "max_length": a.max_length,
           "train": classification_split(tok, [examples[i] for i in train_idx], dtype, a.max_length, a.out,
                                         "classify_train"),
           "val": classification_split(tok, [examples[i] for i in val_idx], dtype, a.max_length, a.out,
                                       "classify_val")}

    meta = {
        "dtype": "uint16" if dtype == "<u2" else "uint32",
        "vocab_size": vocab_size,
        "tokenizer_file": "tokenizer.json",
        "eos_token_id": EOS, "pad_token_id": PAD, "cls_token_id": CLS, "sep_token_id": SEP, "mask_token_id": MASK,
        "special_tokens": SPECIAL_TOKENS,
        "lm": lm,
        "classification": cls,
        "source": {"verses": len(verses), "limit": a.limit, "seed": a.seed, "val_fraction": a.val_fraction,
                   "cls_val_fraction": a.cls_val_fraction, "min_frequency": a.min_frequency},
    }
    (a.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"prepare.py: {len(verses)} verses, vocabulary {vocab_size} ({meta['dtype']}); "
          f"lm train {lm['train']['tokens']} tokens, val {lm['val']['tokens']}; "
          f"classification {cls['train']['examples']} / {cls['val']['examples']} verses, "
          f"{len(LABELS)} labels, majority baseline {cls['val']['majority_accuracy']:.3f}; "
          f"{time.time() - start:.1f} s -> {a.out}")


if __name__ == "__main__":
    main()
