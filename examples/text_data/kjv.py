#!/usr/bin/env python3
"""The King James Bible as token files (make kjv-data) and as instruction data (make llama-sft-data).

Input: the verse lines "<Book><chapter>:<verse> <text>" that build/examples/kjv_text writes
(Debian's bible-kjv-text, decoded), from --input or by running --kjv_text. Two outputs; the
tokenizer and the file formats are prepare.py's (examples/text_data/prepare.py):

--out DIR: the token folder the gpt2 and bert_classify examples read.

  tokenizer.json, tokenizer_config.json
      prepare.py's byte-level BPE trained on the verses: special tokens (ids 0..4)
      <|endoftext|> (GPT-2's end of text, also bos/unk), [PAD], [CLS], [SEP], [MASK].
  train.bin, val.bin
      causal LM, prepare.py's flat token files. A document is one book, its verses joined by
      newlines, followed by <|endoftext|>. val is the last --val_fraction of the verses (as
      char_lm holds out the end of the text).
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

--instructions FILE: prompt-completion pairs in JSON Lines, for prepare.py --sft. Every verse
gives {"prompt": "Genesis 1:1\\n", "completion": "In the beginning God created ..."} (the
book's full name), and every fourth verse that has a next verse in its book also gives
{"prompt": "<the verse>\\n", "completion": "<the next verse>"}; one file, in the order of the
text.

--preferences FILE: preference pairs in JSON Lines, for prepare.py --preference (DPO and reward
models, examples/llama_dpo). Every verse gives {"prompt": "Genesis 1:1\\n", "chosen": "<that
verse>", "rejected": "<another verse>"}: the rejected verse is the one half the text away, so it
reads like scripture but answers another reference. One file, in the order of the text.

The same input and options give the same bytes (the BPE trainer is deterministic, the
shuffle seeded). --limit N keeps N verses (N instructions with --instructions) spread evenly
over the text (every book group stays present), for quick runs and tests.

  build/examples/kjv_text --output kjv.txt
  .venv/bin/python examples/text_data/kjv.py --input kjv.txt --out data/kjv
  .venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --out data/kjv
  .venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --instructions sft.jsonl
  .venv/bin/python examples/text_data/kjv.py --kjv_text build/examples/kjv_text --preferences dpo.jsonl
"""

import argparse
import json
import re
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import prepare  # noqa: E402  (beside this file)
from prepare import CLS, SEP, fail  # noqa: E402

# The 66 books in the order of the text: the bible program's abbreviation, the full name.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"), ("Deu", "Deuteronomy"),
    ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"), ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"),
    ("1Ki", "1 Kings"), ("2Ki", "2 Kings"), ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"),
    ("Neh", "Nehemiah"), ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"), ("Joel", "Joel"),
    ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"),
    ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"), ("Rom", "Romans"),
    ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"), ("Gal", "Galatians"), ("Eph", "Ephesians"),
    ("Phi", "Philippians"), ("Col", "Colossians"), ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"),
    ("1Tim", "1 Timothy"), ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"), ("2Jn", "2 John"),
    ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]

# The traditional division of the 66 books, by their order in the KJV: [first book, label).
LABELS = ["law", "history", "poetry", "prophets", "gospels_acts", "epistles", "revelation"]
GROUP_STARTS = [0, 5, 17, 22, 39, 44, 65]  # Genesis, Joshua, Job, Isaiah, Matthew, Romans, Revelation

VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
Verse = namedtuple("Verse", "book chapter verse text")  # book: the index into BOOKS


def read_verses(text, source):
    """The Verses of the kjv_text lines; the books must come in BOOKS' order."""
    verses, books = [], []
    for number, line in enumerate(text.splitlines(), 1):
        m = VERSE.match(line)
        if m is None:
            fail(f"{source}:{number}: not a verse line '<Book><chapter>:<verse> <text>': {line[:60]!r}")
        if not books or books[-1] != m.group(1):
            if m.group(1) in books:
                fail(f"{source}:{number}: book {m.group(1)} appears again after other books")
            if len(books) < len(BOOKS) and m.group(1) != BOOKS[len(books)][0]:
                fail(f"{source}:{number}: book {m.group(1)} where the KJV has {BOOKS[len(books)][0]}")
            books.append(m.group(1))
        verses.append(Verse(len(books) - 1, int(m.group(2)), int(m.group(3)), m.group(4)))
    if len(books) != len(BOOKS):
        fail(f"{source}: {len(books)} books, the King James Bible has {len(BOOKS)} (kjv_text writes them)")
    return verses


def spread(items, limit):
    """`limit` items spread evenly over `items` (all of them without a limit)."""
    if limit is None or limit >= len(items):
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def group_of(book):
    return max(g for g, start in enumerate(GROUP_STARTS) if book >= start)


def lm_documents(verses):
    """Books as documents: their verse texts joined by newlines."""
    docs = []
    for i, v in enumerate(verses):
        if i == 0 or verses[i - 1].book != v.book:
            docs.append([])
        docs[-1].append(v.text)
    return ["\n".join(d) for d in docs]


def lm_split(vocab, verses, path):
    entry = prepare.write_flat(path, vocab.encode(lm_documents(verses)), vocab)
    return {**entry, "verses": len(verses)}


def classification_split(vocab, examples, max_length, out, name):
    seqs = [[CLS] + ids[: max_length - 2] + [SEP] for ids in vocab.encode([t for t, _ in examples])]
    labels = [label for _, label in examples]
    files = {"ids": f"{name}.bin", "offsets": f"{name}.offsets", "labels": f"{name}.labels"}
    tokens = prepare.write_ragged(out, files, seqs, vocab.dtype)
    np.asarray(labels, dtype="<i8").tofile(out / files["labels"])
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(LABELS)).tolist()
    return {**files, "examples": len(labels), "tokens": tokens, "label_counts": counts,
            "majority_accuracy": max(counts) / max(1, len(labels))}


def token_folder(a, verses):
    """The --out folder: tokenizer, causal LM and classification files, meta.json."""
    start = time.time()
    a.out.mkdir(parents=True, exist_ok=True)
    vocab = prepare.trained_vocab([v.text for v in verses], a.vocab_size, a.min_frequency)
    vocab.save(a.out)

    n_val = max(1, round(len(verses) * a.val_fraction))
    lm = {"train": lm_split(vocab, verses[:-n_val], a.out / "train.bin"),
          "val": lm_split(vocab, verses[-n_val:], a.out / "val.bin")}

    examples = [(v.text, group_of(v.book)) for v in verses]
    train_idx, val_idx = prepare.split_indices(len(examples), a.cls_val_fraction, a.seed)
    cls = {"task": "verse -> the group of its book", "label_names": LABELS, "max_length": a.max_length,
           **{split: classification_split(vocab, [examples[i] for i in idx], a.max_length, a.out, f"classify_{split}")
              for split, idx in (("train", train_idx), ("val", val_idx))}}

    meta = {
        **vocab.meta(),
        "lm": lm,
        "classification": cls,
        "source": {"verses": len(verses), "limit": a.limit, "seed": a.seed, "val_fraction": a.val_fraction,
                   "cls_val_fraction": a.cls_val_fraction, "min_frequency": a.min_frequency},
    }
    (a.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"kjv.py: {len(verses)} verses, vocabulary {vocab.size} ({meta['dtype']}); "
          f"lm train {lm['train']['tokens']} tokens, val {lm['val']['tokens']}; "
          f"classification {cls['train']['examples']} / {cls['val']['examples']} verses, "
          f"{len(LABELS)} labels, majority baseline {cls['val']['majority_accuracy']:.3f}; "
          f"{time.time() - start:.1f} s -> {a.out}")


def instruction_pairs(verses):
    """Reference -> verse for every verse; verse -> next verse for every fourth with a next one in its book."""
    pairs = []
    for i, v in enumerate(verses):
        pairs.append({"prompt": f"{BOOKS[v.book][1]} {v.chapter}:{v.verse}\n", "completion": v.text})
        if i % 4 == 0 and i + 1 < len(verses) and verses[i + 1].book == v.book:
            pairs.append({"prompt": f"{v.text}\n", "completion": verses[i + 1].text})
    return pairs


def preference_pairs(verses):
    """Reference -> its verse (chosen) or the verse half the text away (rejected)."""
    half = max(1, len(verses) // 2)
    return [{"prompt": f"{BOOKS[v.book][1]} {v.chapter}:{v.verse}\n", "chosen": v.text,
             "rejected": verses[(i + half) % len(verses)].text} for i, v in enumerate(verses)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", type=Path, help="verse lines as kjv_text writes them")
    src.add_argument("--kjv_text", type=Path, help="run this kjv_text program for the verse lines")
    p.add_argument("--data_file", default="/usr/lib/bible.data", help="kjv_text's --data_file")
    dst = p.add_mutually_exclusive_group(required=True)
    dst.add_argument("--out", type=Path, help="the token folder (created)")
    dst.add_argument("--instructions", type=Path, help="write prompt-completion pairs to this JSONL file instead")
    dst.add_argument("--preferences", type=Path, help="write prompt-chosen-rejected pairs to this JSONL file instead")
    p.add_argument("--vocab_size", type=int, default=8192, help="BPE vocabulary, special tokens included")
    p.add_argument("--min_frequency", type=int, default=2, help="a merge must occur this often")
    p.add_argument("--limit", type=int, default=None, help="keep N verses (instructions) spread evenly over the text")
    p.add_argument("--val_fraction", type=float, default=0.05, help="causal LM: the last fraction of the verses")
    p.add_argument("--cls_val_fraction", type=float, default=0.1, help="classification: held-out share")
    p.add_argument("--max_length", type=int, default=128, help="classification: ids per example, [CLS]/[SEP] included")
    p.add_argument("--seed", type=int, default=1234, help="the classification split's shuffle")
    a = p.parse_args()
    if not 0 < a.val_fraction < 1 or not 0 < a.cls_val_fraction < 1:
        fail("--val_fraction and --cls_val_fraction must lie in (0, 1)")
    if a.max_length < 3:
        fail("--max_length must be at least 3 ([CLS], one token, [SEP])")
    if a.limit is not None and a.limit < 20:
        fail("--limit must be at least 20")

    if a.input:
        text, source = prepare.read_text(a.input), str(a.input)
    else:
        run = subprocess.run([str(a.kjv_text), "--data_file", a.data_file], capture_output=True, text=True)
        if run.returncode != 0:
            fail(f"{a.kjv_text} failed: {run.stderr.strip()}")
        text, source = run.stdout, str(a.kjv_text)
    verses = read_verses(text, source)
    if a.out is not None:
        token_folder(a, spread(verses, a.limit))
        return
    if a.preferences is not None:
        pairs = preference_pairs(spread(verses, a.limit))
        a.preferences.parent.mkdir(parents=True, exist_ok=True)
        a.preferences.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
        print(f"kjv.py: {len(pairs)} preference pairs -> {a.preferences}")
        return
    pairs = spread(instruction_pairs(verses), a.limit)
    a.instructions.parent.mkdir(parents=True, exist_ok=True)
    a.instructions.write_text("".join(json.dumps(pair) + "\n" for pair in pairs))
    print(f"kjv.py: {len(pairs)} instructions from {len(verses)} verses -> {a.instructions}")


if __name__ == "__main__":
    main()
