#!/usr/bin/env python3
"""Tokens/s of loom's tokenizer (build/benchmarks/tokenizer) against the `tokenizers` package, one
thread, on the KJV verses (build/examples/kjv_text), for tokenizer.json files made here without
network by tests/data/tokenizer_peer.py (prepare.py's byte-level BPE, the Llama 3 pattern's BPE,
a WordPiece BERT).

  .venv/bin/python benchmarks/tokenizer/run.py --bench build/benchmarks/tokenizer \\
      --kjv_text build/examples/kjv_text --work /tmp/tokenizer_bench

`tokenizers` runs with RAYON_NUM_THREADS=1 two ways: encode() per line from Python (what a loop
over texts costs) and encode_batch() over all lines (Rust's loop, no Python per text). Each figure
is the best of --rounds passes; both sides must make the same number of ids.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tests" / "data" / "tokenizer_peer.py"


def python_side(tokenizer_json, lines, rounds):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.encode_batch(lines[:2000])
    one, batch, tokens = float("inf"), float("inf"), 0
    for _ in range(rounds):
        start = time.perf_counter()
        tokens = sum(len(tok.encode(line).ids) for line in lines)
        one = min(one, time.perf_counter() - start)
        start = time.perf_counter()
        batch_tokens = sum(len(e.ids) for e in tok.encode_batch(lines))
        batch = min(batch, time.perf_counter() - start)
        assert batch_tokens == tokens
    return tokens, one, batch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=str(ROOT / "build/benchmarks/tokenizer"))
    parser.add_argument("--kjv_text", default=str(ROOT / "build/examples/kjv_text"))
    parser.add_argument("--work", default="/tmp/tokenizer_bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--names", default="bpe,llama3,bert_uncased")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = work / "kjv.txt"
    subprocess.run([args.kjv_text, "--output", str(text)], check=True, stdout=subprocess.DEVNULL)
    if not (work / "bpe.json").exists():
        subprocess.run([sys.executable, str(PEER), "make", str(text), str(work)], check=True)
    lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
    print(f"{len(lines)} KJV verses, {text.stat().st_size} bytes; one thread; best of {args.rounds}")
    print(f"{'tokenizer':<14} {'ids':>9} {'loom tok/s':>12} {'tokenizers encode() tok/s':>26} "
          f"{'encode_batch() tok/s':>21} {'loom / encode()':>16} {'loom / batch':>13}")
    for name in args.names.split(","):
        out = subprocess.run([args.bench, "--tokenizer", str(work / f"{name}.json"), "--text", str(text),
                              "--rounds", str(args.rounds)], check=True, capture_output=True, text=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        loom = json.loads(out.stdout.strip().splitlines()[-1])
        tokens, one, batch = python_side(work / f"{name}.json", lines, args.rounds)
        assert tokens == loom["tokens"], (name, tokens, loom["tokens"])
        print(f"{name:<14} {tokens:>9} {loom['tokens_per_s']:>12.0f} {tokens / one:>26.0f} {tokens / batch:>21.0f} "
              f"{loom['tokens_per_s'] / (tokens / one):>15.2f}x {loom['tokens_per_s'] / (tokens / batch):>12.2f}x")


if __name__ == "__main__":
    main()
