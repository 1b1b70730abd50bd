"""Python side of tests/data/test_text_data.cpp: what numpy, `tokenizers` and transformers'
collators make of the token files that examples/text_data/kjv.py wrote (through prepare.py).

  text_peer.py windows DIR BLOCK STRIDE OUT      group_texts windows of DIR/train.bin (np.fromfile),
                                                and windows every STRIDE tokens, as int64 files
  text_peer.py decode DIR ID...                 DIR/tokenizer.json's decoding of the ids, on stdout
  text_peer.py ragged DIR SPLIT OUT              the classification split as numpy reads it (JSON)
  text_peer.py collate DIR FEATURES OUT          transformers' collators on FEATURES (JSON), to OUT (JSON)
"""

import json
import sys
from pathlib import Path

import numpy as np


def dtype_of(folder):
    meta = json.loads((folder / "meta.json").read_text())
    return {"uint16": np.uint16, "uint32": np.uint32}[meta["dtype"]], meta


def windows(folder, block, stride, out):
    dtype, meta = dtype_of(folder)
    ids = np.fromfile(folder / meta["lm"]["train"]["file"], dtype=dtype).astype("<i8")
    # HF run_clm's group_texts: drop the remainder, cut into non-overlapping blocks.
    total = (len(ids) // block) * block
    ids[:total].reshape(-1, block).tofile(out + ".group_texts")
    starts = range(0, len(ids) - block + 1, stride)
    np.stack([ids[s:s + block] for s in starts]).tofile(out + ".strided")
    print(len(ids), total // block, len(starts))


def decode(folder, ids):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    sys.stdout.write(tok.decode([int(i) for i in ids], skip_special_tokens=False))


def ragged(folder, split, out):
    dtype, meta = dtype_of(folder)
    files = meta["classification"][split]
    ids = np.fromfile(folder / files["ids"], dtype=dtype)
    offsets = np.fromfile(folder / files["offsets"], dtype="<u8")
    labels = np.fromfile(folder / files["labels"], dtype="<i8")
    examples = [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    Path(out).write_text(json.dumps({"input_ids": examples, "labels": labels.tolist()}))


# numpy batches: the same padding code as "pt" (tokenizer.pad), without importing torch (~2 s).
NP = "np"


def collate(folder, features_file, out):
    from transformers import (DataCollatorForTokenClassification, DataCollatorWithPadding,
                              PreTrainedTokenizerFast)
    features = json.loads(Path(features_file).read_text())
    results = {}
    for side in ("right", "left"):
        tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
        tok.padding_side = side
        cases = {
            "longest": DataCollatorWithPadding(tok, return_tensors=NP),
            "multiple_of_8": DataCollatorWithPadding(tok, pad_to_multiple_of=8, return_tensors=NP),
            "max_length": DataCollatorWithPadding(tok, padding="max_length", max_length=features["max_length"],
                                                  return_tensors=NP),
            "max_length_multiple_of_24": DataCollatorWithPadding(tok, padding="max_length",
                                                                 max_length=features["max_length"],
                                                                 pad_to_multiple_of=24, return_tensors=NP),
        }
        for name, collator in cases.items():
            batch = collator([{"input_ids": ids, "label": label}
                              for ids, label in zip(features["input_ids"], features["labels"])])
            results[f"{side}/{name}"] = {k: np.asarray(v).tolist() for k, v in batch.items()}
        token = DataCollatorForTokenClassification(tok, pad_to_multiple_of=4, return_tensors=NP)
        batch = token([{"input_ids": ids, "labels": labels}
                       for ids, labels in zip(features["input_ids"], features["token_labels"])])
        results[f"{side}/token_labels"] = {k: np.asarray(v).tolist() for k, v in batch.items()}
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    mode, folder = sys.argv[1], Path(sys.argv[2])
    if mode == "windows":
        windows(folder, int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif mode == "decode":
        decode(folder, sys.argv[3:])
    elif mode == "ragged":
        ragged(folder, sys.argv[3], sys.argv[4])
    elif mode == "collate":
        collate(folder, sys.argv[3], sys.argv[4])
    else:
        sys.exit(f"text_peer.py: unknown mode {mode}")
