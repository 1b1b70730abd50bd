#!/usr/bin/env python3
"""LoRA SFT on prompt-heavy instruction data, loom against transformers.Trainer + PEFT, on the CPU (issue 41 point 3).

One random Llama with Llama 2's vocabulary (32,000) is saved by transformers from a fixed seed,
and one PEFT adapter on it (r 16, alpha 32, dropout 0, q_proj and v_proj, PEFT's default for
Llama; the head and embeddings frozen). The data: rows of 128 tokens whose first 80-112 are a
prompt (labels -100) and the rest a completion, prompt : completion about 3 : 1, as
instruction data is. Both sides train the same adapter on the same rows with the same flags
(benchmarks/lora/run.py's runs: build/benchmarks/lora for loom, its --hf-worker for
transformers + PEFT), one intra-op thread, fp32, in rounds whose order reverses every round.
transformers computes the LM head and the loss at every position; loom's Trainer only where a
label is scored (--chunked_lm_loss decides whether in chunks). The per-round ratio is loom's
median step time over transformers'; the figure is the median over the rounds.

Then the loss alone (build/benchmarks/lora --loss_tokens): 4,096 scored positions over Llama 3's
vocabulary (128,256), hidden 256, the head frozen (LoRA), one forward and backward computed as
transformers does (every position's float32 logits) and chunked (models::linear_cross_entropy):
the most CPU tensor bytes alive at once above its inputs, counted by the same allocator wrapper,
and its time.

The last two lines are the figures, ratios last:
  sft step time loom/hf+peft: R         (target <= 0.8)
  loss peak memory chunked/unchunked: M (target <= 0.2)

  .venv/bin/python benchmarks/sft/run.py --bench build/benchmarks/lora --work /tmp/sft_bench \\
      [--rounds 3] [--steps 8] [--warmup 2]
"""
import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "hf"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
import compare  # noqa: E402  (tests/hf/compare.py: merge)
import rounds  # noqa: E402  (benchmarks/common/rounds.py: the round options)

import torch  # noqa: E402

_spec = importlib.util.spec_from_file_location("lora_run", os.path.join(ROOT, "benchmarks", "lora", "run.py"))
lora_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lora_run)  # its run_one: a loom or transformers + PEFT run, measured alike

LLAMA = dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=128, bos_token_id=0, eos_token_id=1)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
SEQ, ROWS, PROMPT = 128, 512, (80, 112)
FLAGS = lora_run.FLAGS  # batch 8, AdamW 1e-4 linear, clipping 1.0, no saving or evaluation, the CPU
LOSS = dict(tokens=4096, vocab=128256, hidden=256)


def make_inputs(work):
    """The base folder, the PEFT adapter folder and the prompt-masked token rows, from fixed seeds."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    init, adapter, data = (os.path.join(work, name) for name in ("init", "adapter", "data.safetensors"))
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**LLAMA))
    base.save_pretrained(init)
    torch.manual_seed(1)
    get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **LORA)).save_pretrained(adapter)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, LLAMA["vocab_size"], (ROWS, SEQ), generator=gen)
    prompt = torch.randint(PROMPT[0], PROMPT[1] + 1, (ROWS, 1), generator=gen)
    labels = ids.masked_fill(torch.arange(SEQ) < prompt, -100)
    save_file({"input_ids": ids.contiguous(), "labels": labels.contiguous()}, data)
    scored = (labels[:, 1:] != -100).float().mean().item()  # the positions the loss counts
    return (init, adapter, data), scored


def loss_memory(opts):
    """build/benchmarks/lora --loss_tokens: the loss alone, unchunked and chunked."""
    result_file = os.path.join(opts.work, "loss.json")
    cmd = [opts.bench, "--loss_tokens", str(LOSS["tokens"]), "--loss_vocab", str(LOSS["vocab"]), "--loss_hidden",
           str(LOSS["hidden"]), "--loss_rounds", str(opts.loss_rounds), "--threads", "1", "--result_file",
           result_file, "--output_dir", os.path.join(opts.work, "loss_out")]
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run.py: the loss measurement failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(result_file) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="build/benchmarks/lora (liblora_counting.so lies beside it)")
    p.add_argument("--work", required=True, help="a scratch folder")
    p.add_argument("--loss_rounds", type=int, default=2, help="rounds of the loss alone, unchunked and chunked")
    p.add_argument("--chunked_lm_loss", choices=["default", "true", "false"], default="default",
                   help="loom's --chunked_lm_loss in the SFT runs (default: loom's choice by size)")
    rounds.add_round_options(p, "rounds of the two SFT runs", steps=8)
    opts = rounds.parse_round_options(p)
    if not os.path.exists(lora_run.counting_library(opts.bench)):
        sys.exit(f"run.py: {lora_run.counting_library(opts.bench)} is missing (ninja -C build lora builds both)")
    os.makedirs(opts.work, exist_ok=True)
    inputs, scored = make_inputs(opts.work)
    flags = compare.merge(FLAGS, ["--max_steps", str(opts.warmup + opts.steps)])
    loom_flags = flags + ([] if opts.chunked_lm_loss == "default" else ["--chunked_lm_loss", opts.chunked_lm_loss])
    print(f"sft: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"one intra-op thread per side, fp32; {opts.rounds} rounds x {opts.steps} steps (+{opts.warmup} warm-up); "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"llama: {json.dumps(LLAMA)}; LoRA {json.dumps(LORA)}; batch 8 x {SEQ} tokens, prompts of "
          f"{PROMPT[0]}-{PROMPT[1]} tokens: {scored:.3f} of the positions scored; flags: {' '.join(flags)}"
          + ("" if opts.chunked_lm_loss == "default" else f"; loom --chunked_lm_loss {opts.chunked_lm_loss}"))
    ratios, cpu_ratios, losses = [], [], {"loom": set(), "hf": set()}
    print("\nround | loom ms/step (CPU) | hf+peft ms/step (CPU) | loom/hf+peft (CPU) | train_loss loom, hf+peft")
    for r in range(opts.rounds):
        round_dir = os.path.join(opts.work, f"round{r}")
        os.makedirs(round_dir, exist_ok=True)
        res = {}
        for side in (["loom", "hf"] if r % 2 == 0 else ["hf", "loom"]):
            res[side] = lora_run.run_one(side, "lora", opts, inputs, loom_flags if side == "loom" else flags, round_dir)
            losses[side].add(f"{res[side]['train_loss']:.6f}")
        ratios.append(res["loom"]["median_s"] / res["hf"]["median_s"])
        cpu_ratios.append(res["loom"]["median_cpu_s"] / res["hf"]["median_cpu_s"])
        print(f"{r} | {res['loom']['median_s'] * 1e3:.1f} ({res['loom']['median_cpu_s'] * 1e3:.1f}) | "
              f"{res['hf']['median_s'] * 1e3:.1f} ({res['hf']['median_cpu_s'] * 1e3:.1f}) | {ratios[-1]:.3f} "
              f"({cpu_ratios[-1]:.3f}) | {res['loom']['train_loss']:.6f}, {res['hf']['train_loss']:.6f}", flush=True)
    print(f"train_loss: loom {', '.join(sorted(losses['loom']))}; hf+peft {', '.join(sorted(losses['hf']))}")
    print(f"sft step time, rounds: {', '.join(f'{x:.3f}' for x in ratios)} (CPU time: median "
          f"{statistics.median(cpu_ratios):.3f})")

    loss = loss_memory(opts)
    peak_u, peak_c = statistics.median(loss["unchunked_peak_bytes"]), statistics.median(loss["chunked_peak_bytes"])
    time_u, time_c = statistics.median(loss["unchunked_seconds"]), statistics.median(loss["chunked_seconds"])
    print(f"\nloss alone, {LOSS['tokens']} positions x vocabulary {LOSS['vocab']}, hidden {LOSS['hidden']}, frozen head, "
          f"{opts.loss_rounds} rounds: peak {peak_u / 1e6:.1f} MB unchunked, {peak_c / 1e6:.1f} MB chunked; "
          f"time {time_u:.2f} s / {time_c:.2f} s (chunked/unchunked {time_c / time_u:.3f}); loss "
          f"{loss['unchunked_loss']:.6f} / {loss['chunked_loss']:.6f}; hidden gradients within "
          f"{loss['d_hidden_relative_difference']:.2g} relative")
    print(f"sft step time loom/hf+peft: {statistics.median(ratios):.3f}")
    print(f"loss peak memory chunked/unchunked: {peak_c / peak_u:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
