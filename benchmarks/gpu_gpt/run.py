"""Runs benchmarks/gpu_gpt's sides (loom, the hand-written loop, transformers.Trainer, and
transformers.Trainer with torch.compile) round by round, the order rotating, each a fresh
process, and prints a markdown table of the medians: step time, tokens/s, peak allocated
memory, MFU, and the ratios the GPU issue asks for (loom / hand-written step time, loom / HF
tokens per second).

  python benchmarks/gpu_gpt/run.py --bench build/benchmarks/gpu_gpt --sizes 124m,350m --rounds 1
      [--sides loom,manual,hf,hf_compile] [--batch 8] [--max_steps 60] [--warmup 10]
      [--device cuda] [--timeout 300] [--deadline UNIX_SECONDS] [--json figures.json]

Sides loom_deterministic and loom_full_determinism run loom under --deterministic and
--full_determinism; their step time over loom's is what each mode costs. Side loom_unchunked
runs loom with --chunked_lm_loss false: loom's step time against it says whether the chunked
LM loss, the default above 64 MiB of logits, wins on the device.

--model llama_lora runs the Llama LoRA SFT case instead (main.cpp's comment at the top): sides
loom, hf (transformers.Trainer + peft) and hf_compile, sizes 1b and tiny; its medians are keyed
llama_lora/SIZE and every run carries "model".

A side that fails or runs past --timeout is reported with the tail of its output and the
others go on; a side that would start after --deadline is skipped and said so. --json writes
every run and the medians, for tests/gpu/run_on_gpu.sh.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

KEYS = ("step_ms", "tokens_per_second", "mfu", "mfu_6n", "peak_allocated_gib", "loss")


def run(cmd, timeout):
    """The side's JSON line, or (None, why) when it failed: its exit status and last lines."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-2000:]
        return None, f"timed out after {timeout} s; stderr tail:\n{tail.decode(errors='replace') if isinstance(tail, bytes) else tail}"
    lines = [line for line in p.stdout.splitlines() if line.startswith("{\"")]
    if p.returncode != 0 or not lines:
        return None, f"exit status {p.returncode}; stderr tail:\n{p.stderr[-3000:]}\nstdout tail:\n{p.stdout[-1000:]}"
    return json.loads(lines[-1]), ""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bench", default="build/benchmarks/gpu_gpt")
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama_lora"])
    p.add_argument("--sizes", default="124m")
    p.add_argument("--sides", default="loom,manual,hf,hf_compile")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one side may run")
    p.add_argument("--deadline", type=float, default=0.0, help="no side starts after this time.time()")
    p.add_argument("--json", default="", help="write every run and the medians here")
    p.add_argument("--extra", default="", help="extra flags for the C++ sides, one string")
    p.add_argument("--python", default=sys.executable,
                   help="the Python of the transformers sides (the test suite's warm one in the dry run)")
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    common = ["--per_device_train_batch_size", str(a.batch), "--block_size", str(a.block_size),
              "--max_steps", str(a.max_steps), "--warmup", str(a.warmup), "--peak_tflops", str(a.peak_tflops),
              "--device", a.device, "--model", a.model]
    extra = a.extra.split() if a.extra else []
    hf = [a.python, os.path.join(here, "hf_trainer.py")]
    report = {"runs": [], "failures": [], "skipped": [], "medians": {}}
    rows = []
    for size in a.sizes.split(","):
        every = {"loom": [a.bench, "--mode", "loom", "--size", size] + common + extra,
                 "manual": [a.bench, "--mode", "manual", "--size", size] + common + extra,
                 "hf": hf + ["--size", size] + common,
                 "hf_compile": hf + ["--size", size, "--torch_compile"] + common}
        # loom under --deterministic and --full_determinism (issue 41 point 6: what each costs)
        every["loom_deterministic"] = every["loom"] + ["--deterministic"]
        every["loom_full_determinism"] = every["loom"] + ["--full_determinism"]
        # loom with the whole logits (issue 41 point 2: the chunked loss is the default where
        # it wins; this side says whether it does on the device)
        every["loom_unchunked"] = every["loom"] + ["--chunked_lm_loss", "false"]
        if a.model == "llama_lora":
            del every["manual"]  # no hand-written loop for this case
        key = size if a.model == "gpt2" else f"{a.model}/{size}"
        order = [s for s in a.sides.split(",") if s]
        for s in order:
            if s not in every:
                sys.exit(f"run.py: unknown side {s!r} for --model {a.model}; the sides are {', '.join(every)}")
        results = {s: [] for s in order}
        for r in range(a.rounds):
            k = r % len(order)
            for side in order[k:] + order[:k]:
                if a.deadline and time.time() > a.deadline:
                    print(f"size {key} round {r} {side}: skipped, the time budget is spent", flush=True)
                    report["skipped"].append({"model": a.model, "size": size, "round": r, "side": side})
                    continue
                t0 = time.time()
                res, why = run(every[side], a.timeout)
                if res is None:
                    print(f"size {key} round {r} {side}: FAILED ({why.splitlines()[0]})\n{why}", flush=True)
                    report["failures"].append({"model": a.model, "size": size, "round": r, "side": side, "why": why})
                    continue
                res["wall_s"] = time.time() - t0
                res.setdefault("model", a.model)
                res["side"] = side
                print(f"size {key} round {r} {side}: {res['step_ms']:.1f} ms/step, "
                      f"{res['tokens_per_second']:.0f} tokens/s, MFU {100 * res['mfu']:.1f}%, "
                      f"peak {res['peak_allocated_gib']:.2f} GiB ({res['wall_s']:.0f} s in all)", flush=True)
                report["runs"].append(res)
                results[side].append(res)
        med = {s: {k: statistics.median(x[k] for x in v) for k in KEYS} for s, v in results.items() if v}
        report["medians"][key] = med
        rows.append((key, med))
    print("\n| size | side | ms/step | tokens/s | peak GiB | MFU | mean loss |")
    print("|---|---|---|---|---|---|---|")
    for size, med in rows:
        for side, m in med.items():
            print(f"| {size} | {side} | {m['step_ms']:.1f} | {m['tokens_per_second']:.0f} | "
                  f"{m['peak_allocated_gib']:.2f} | {100 * m['mfu']:.1f}% | {m['loss']:.4f} |")
        ratios = {}
        if "loom" in med and "manual" in med:
            ratios["loom_over_manual_step_time"] = med["loom"]["step_ms"] / med["manual"]["step_ms"]
        for d in ("loom_deterministic", "loom_full_determinism", "loom_unchunked"):
            if "loom" in med and d in med:
                ratios[f"{d}_over_loom_step_time"] = med[d]["step_ms"] / med["loom"]["step_ms"]
        for h in ("hf", "hf_compile"):
            if "loom" in med and h in med:
                ratios[f"loom_over_{h}_tokens_per_second"] = med["loom"]["tokens_per_second"] / med[h]["tokens_per_second"]
        for k, v in ratios.items():
            print(f"| {size} | {k} | {v:.3f} | | | | |")
        report["medians"][size]["ratios"] = ratios
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
