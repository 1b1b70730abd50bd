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

--long times one long pre-token instead (issue 40: BPE merges through a heap, as `tokenizers`
does, so a 1 MB word or run of spaces is n log n, not n^2): 1 MB of spaces, of newlines, of one
letter, and the KJV's letters without spaces, each one text, encoded by loom (--whole) and by
`tokenizers`' encode(); seconds beside each other, the ids the same in number.
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
    parser.add_argument("--long", action="store_true", help="one long pre-token per text (seconds, not tokens/s)")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    text = work / "kjv.txt"
    subprocess.run([args.kjv_text, "--output", str(text)], check=True, stdout=subprocess.DEVNULL)
    if not (work / "bpe.json").exists():
        subprocess.run([sys.executable, str(PEER), "make", str(text), str(work)], check=True)
    lines = [line for line in text.read_text(encoding="utf-8").splitlines() if line.strip()]
    if args.long:
        return long_pieces(args, work, lines)
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


def long_pieces(args, work, lines):
    from tokenizers import Tokenizer
    size = 1_000_000
    letters = "".join("".join(line.split()) for line in lines)[:size]
    texts = {"1 MB of spaces": " " * size, "1 MB of newlines": "\n" * size, "1 MB of 'a'": "a" * size,
             "1 MB of KJV letters": letters}
    names = args.names if args.names != "bpe,llama3,bert_uncased" else "bpe,llama3,llama2_sp"
    print(f"one text of one pre-token (byte-level: one ByteLevel piece; llama2_sp: the whole text); one thread; "
          f"best of {args.rounds}")
    print(f"{'tokenizer':<14} {'text':<22} {'ids':>9} {'loom s':>9} {'tokenizers s':>13} {'tokenizers / loom':>18}")
    for name in names.split(","):
        tok = Tokenizer.from_file(str(work / f"{name}.json"))
        for label, body in texts.items():
            path = work / "long.txt"
            path.write_text(body, encoding="utf-8")
            out = subprocess.run([args.bench, "--tokenizer", str(work / f"{name}.json"), "--text", str(path), "--whole",
                                  "--rounds", str(args.rounds)], check=True, capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": "1"})
            loom = json.loads(out.stdout.strip().splitlines()[-1])
            best = float("inf")
            for _ in range(args.rounds):
                start = time.perf_counter()
                ids = tok.encode(body).ids
                best = min(best, time.perf_counter() - start)
            assert len(ids) == loom["tokens"], (name, label, len(ids), loom["tokens"])
            print(f"{name:<14} {label:<22} {len(ids):>9} {loom['seconds']:>9.3f} {best:>13.3f} {best / loom['seconds']:>17.1f}x")


if __name__ == "__main__":
    main()
