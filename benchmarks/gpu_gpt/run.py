"""Runs benchmarks/gpu_gpt's three sides (loom, the hand-written loop, transformers.Trainer)
round by round, the order rotating, each a fresh process, and prints a markdown table of the
medians: step time, tokens/s, peak allocated memory, MFU, and the ratios the GPU issue asks
for (loom / hand-written step time, loom / HF tokens per second).

  python benchmarks/gpu_gpt/run.py --bench build/benchmarks/gpu_gpt --sizes 124m,350m --rounds 3
      [--batch 8] [--max_steps 60] [--warmup 10] [--device cuda]      (one line)
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{\"")][-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", default="build/benchmarks/gpu_gpt")
    p.add_argument("--sizes", default="124m")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    common = ["--per_device_train_batch_size", str(a.batch), "--block_size", str(a.block_size),
              "--max_steps", str(a.max_steps), "--warmup", str(a.warmup), "--peak_tflops", str(a.peak_tflops),
              "--device", a.device]
    rows = []
    for size in a.sizes.split(","):
        sides = {"loom": [a.bench, "--mode", "loom", "--size", size] + common,
                 "manual": [a.bench, "--mode", "manual", "--size", size] + common,
                 "hf": [sys.executable, os.path.join(here, "hf_trainer.py"), "--size", size] + common}
        results = {k: [] for k in sides}
        order = list(sides)
        for r in range(a.rounds):
            for side in order[r % 3:] + order[:r % 3]:
                res = run(sides[side])
                print(f"size {size} round {r} {side}: {res['step_ms']:.1f} ms/step, "
                      f"{res['tokens_per_second']:.0f} tokens/s, MFU {100 * res['mfu']:.1f}%", flush=True)
                results[side].append(res)
        med = {s: {k: statistics.median(x[k] for x in v) for k in ("step_ms", "tokens_per_second", "mfu",
                                                                     "peak_allocated_gib", "loss")}
               for s, v in results.items()}
        rows.append((size, med))
    print("\n| size | side | ms/step | tokens/s | peak GiB | MFU | mean loss |")
    print("|---|---|---|---|---|---|---|")
    for size, med in rows:
        for side, m in med.items():
            print(f"| {size} | {side} | {m['step_ms']:.1f} | {m['tokens_per_second']:.0f} | "
                  f"{m['peak_allocated_gib']:.2f} | {100 * m['mfu']:.1f}% | {m['loss']:.4f} |")
        print(f"| {size} | loom / hand-written step time | {med['loom']['step_ms'] / med['manual']['step_ms']:.3f} "
              f"| loom / HF tokens/s | {med['loom']['tokens_per_second'] / med['hf']['tokens_per_second']:.3f} | | |")


if __name__ == "__main__":
    main()
