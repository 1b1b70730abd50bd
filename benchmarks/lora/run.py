#!/usr/bin/env python3
"""Full fine-tuning against LoRA, loom against transformers.Trainer + PEFT, on the CPU (issue 25 point 6).

One random Llama (saved by transformers from a fixed seed) and one PEFT adapter on it (r 16,
alpha 32, dropout 0, targets q_proj and v_proj: PEFT's default for Llama; A drawn by PEFT,
B zero) are trained four ways, each run a fresh process: loom full fine-tuning, loom LoRA
(build/benchmarks/lora, --lora_adapter on the adapter folder), transformers full fine-tuning,
transformers + PEFT LoRA (this script re-entered with --hf-worker; PeftModel.from_pretrained
with is_trainable). Both sides get the same flags (one list, parsed by HfArgumentParser and
loom::parse_args), the same token rows (random, from a fixed seed), fp32, one intra-op thread
(torch.set_num_threads(1) / --threads 1, OMP_NUM_THREADS=1). A round runs the four in an
order that reverses every round, so drift in machine load hits both sides alike.

Figures per run:
  * step time: between consecutive on_step_end (data, forward, backward, clipping, optimizer,
    the Trainer's bookkeeping), the first --warmup steps left out, median over the rest; on the
    wall clock (the figure the target is about), and in the process's CPU time (all threads:
    time.process_time() / CLOCK_PROCESS_CPUTIME_ID), which other programs' load inflates less;
  * trainable parameters, and the bytes of parameters, gradients and optimizer state after the
    first optimizer step (loom: trainer.model_state_bytes(); transformers: on_optimizer_step,
    the nbytes of every parameter, every .grad and every tensor in optimizer.state);
  * peak tensors: the most bytes of CPU tensor storage alive at once between on_train_begin and
    on_train_end, counted on both sides by the same wrapper around torch's CPU allocator
    (benchmarks/common/counting_allocator.hpp; the Python side loads it as liblora_counting.so,
    before the model exists). transformers 5's from_pretrained leaves the weights in the
    safetensors file's memory map, where no allocator sees them, so the Python side builds the
    model from config.json and copies the file's weights in with load_state_dict, and copies the
    token rows out of their file, as loom does (both counts include the rows, 2 MiB);
  * peak RSS: VmHWM at on_train_end above VmRSS at on_train_begin, the high-water mark reset at
    on_train_begin through /proc/self/clear_refs (the same code on both sides).
Both sides end with the same train_loss when they computed the same thing (printed as a check).

  .venv/bin/python benchmarks/lora/run.py --bench build/benchmarks/lora --work /tmp/lora_bench \\
      [--rounds 5] [--steps 10] [--warmup 3]
"""
import argparse
import ctypes
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
import compare  # noqa: E402  (tests/hf/compare.py: Rows, merge)
import rounds  # noqa: E402  (benchmarks/common/rounds.py: the round options, a run's step time)

import torch  # noqa: E402

# The model: a small Llama whose step is ATen work, not overhead, at one thread.
LLAMA = dict(vocab_size=8192, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=128, bos_token_id=0, eos_token_id=1)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
SEQ, ROWS = 128, 1024
FLAGS = ["--per_device_train_batch_size", "8", "--learning_rate", "1e-4", "--optim", "adamw_torch_fused",
         "--lr_scheduler_type", "linear", "--weight_decay", "0.01", "--max_grad_norm", "1.0",
         "--logging_steps", "1000", "--save_strategy", "no", "--eval_strategy", "no", "--seed", "42",
         "--disable_tqdm", "true", "--use_cpu", "true"]
MODES = ["full", "lora"]
SIDES = ["loom", "hf"]


def make_inputs(work):
    """The base folder, the PEFT adapter folder and the token rows, from fixed seeds."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    init, adapter, data = (os.path.join(work, name) for name in ("init", "adapter", "data.safetensors"))
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**LLAMA))
    base.save_pretrained(init)
    torch.manual_seed(1)
    get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **LORA)).save_pretrained(adapter)
    ids = torch.randint(0, LLAMA["vocab_size"], (ROWS, SEQ), generator=torch.Generator().manual_seed(2))
    # Position 0 is never a target (the loss shifts by one); -100 there keeps transformers'
    # num_items_in_batch the count of predicted tokens whatever wraps the model.
    labels = ids.clone()
    labels[:, 0] = -100
    save_file({"input_ids": ids.contiguous(), "labels": labels.contiguous()}, data)
    return init, adapter, data


def counting_library(bench):
    return os.path.join(os.path.dirname(os.path.abspath(bench)), "liblora_counting.so")


def proc_status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def hf_worker(library, init, adapter, data, result_file, flags):
    """transformers.Trainer (+ PEFT when `adapter` is not "-") on `flags`, measured as loom's side is."""
    counting = ctypes.CDLL(library)
    counting.counting_live.restype = counting.counting_peak.restype = ctypes.c_int64
    counting.counting_install()
    torch.set_num_threads(1)
    from safetensors.torch import load_file
    from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                              TrainingArguments)
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        flags + ["--output_dir", os.path.join(os.path.dirname(result_file), "hf_out"), "--report_to", "none"])
    model = LlamaForCausalLM(LlamaConfig.from_pretrained(init))
    model.load_state_dict(load_file(os.path.join(init, "model.safetensors")))
    if adapter != "-":
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
    params = list(model.parameters())
    out = {"side": "hf", "lora": adapter != "-", "step_end": [], "step_cpu_end": [],
           "trainable_params": sum(p.numel() for p in params if p.requires_grad),
           "total_params": sum(p.numel() for p in params)}

    class Probe(TrainerCallback):
        def on_train_begin(self, *a, **k):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM back to the current RSS
            self.rss_at_begin = proc_status("VmRSS")
            counting.counting_reset_peak()
            out["live_at_begin"] = counting.counting_live()
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_optimizer_step(self, args, state, control, optimizer=None, **k):
            if "optimizer_bytes" in out:
                return
            out["param_bytes"] = sum(p.nbytes for p in params)
            out["grad_bytes"] = sum(p.grad.nbytes for p in params if p.grad is not None)
            out["optimizer_bytes"] = sum(t.nbytes for s in optimizer.state.values() for t in s.values()
                                         if torch.is_tensor(t))

        def on_step_end(self, *a, **k):
            out["step_end"].append(time.perf_counter() - self.start)
            out["step_cpu_end"].append(time.process_time() - self.cpu_start)

        def on_train_end(self, *a, **k):
            out["peak_tensor_bytes"] = counting.counting_peak()
            out["peak_rss_delta"] = proc_status("VmHWM") - self.rss_at_begin

    # Copied out of the file's memory map, so the allocator counts the rows as it does loom's.
    t = {k: v.clone() for k, v in load_file(data).items()}
    rows = compare.Rows({"train_input_ids": t["input_ids"], "train_labels": t["labels"]}, "train")
    result = Trainer(model=model, args=args, train_dataset=rows, callbacks=[Probe()]).train()
    out.update(train_loss=result.training_loss, threads=torch.get_num_threads())
    with open(result_file, "w") as f:
        json.dump(out, f)


def run_one(side, mode, opts, inputs, flags, round_dir):
    init, adapter, data = inputs
    result_file = os.path.join(round_dir, f"{side}_{mode}.json")
    if side == "loom":
        cmd = [opts.bench, "--model_name_or_path", init, "--data_file", data, "--result_file", result_file,
               "--threads", "1", "--output_dir", os.path.join(round_dir, "loom_out")] + flags
        if mode == "lora":
            cmd += ["--lora_adapter", adapter]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", counting_library(opts.bench), init,
               adapter if mode == "lora" else "-", data, result_file, "--"] + flags
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run.py: {side} {mode} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(result_file) as f:
        r = json.load(f)
    if r["live_at_begin"] < r["param_bytes"]:
        sys.exit(f"run.py: {side} {mode}: the allocator saw {r['live_at_begin']} bytes alive at on_train_begin, "
                 f"fewer than the parameters' {r['param_bytes']:.0f}: some tensors escape the count")
    r["median_s"] = rounds.median_step_s(r["step_end"], opts.warmup)
    r["median_cpu_s"] = rounds.median_step_s(r["step_cpu_end"], opts.warmup)
    return r


def mb(x):
    return f"{x / 1e6:.2f}"


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-worker":
        hf_worker(*sys.argv[2:7], sys.argv[8:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="build/benchmarks/lora (liblora_counting.so lies beside it)")
    p.add_argument("--work", required=True, help="a scratch folder")
    rounds.add_round_options(p, "rounds of the four runs", steps=10)
    opts = rounds.parse_round_options(p)
    if not os.path.exists(counting_library(opts.bench)):
        sys.exit(f"run.py: {counting_library(opts.bench)} is missing (ninja -C build lora builds both)")
    os.makedirs(opts.work, exist_ok=True)
    inputs = make_inputs(opts.work)
    flags = compare.merge(FLAGS, ["--max_steps", str(opts.warmup + opts.steps)])
    print(f"lora: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"one intra-op thread per side, fp32; {opts.rounds} rounds x {opts.steps} steps (+{opts.warmup} warm-up) "
          f"per run; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"llama: {json.dumps(LLAMA)}; batch 8 x {SEQ} tokens; LoRA {json.dumps(LORA)}; flags: {' '.join(flags)}")
    runs = [(side, mode) for mode in MODES for side in SIDES]
    results = {run: [] for run in runs}
    clocks = {"median_s": "wall", "median_cpu_s": "CPU"}
    ratios = {(mode, clock): [] for mode in MODES for clock in clocks}  # loom / HF, per round
    print("\nround | " + " | ".join(f"{s} {m} ms/step (CPU)" for s, m in runs)
          + " | loom/HF full (CPU) | loom/HF lora (CPU)")
    for r in range(opts.rounds):
        round_dir = os.path.join(opts.work, f"round{r}")
        os.makedirs(round_dir, exist_ok=True)
        for run in (runs if r % 2 == 0 else runs[::-1]):
            results[run].append(run_one(*run, opts, inputs, flags, round_dir))
        for mode, clock in ratios:
            ratios[(mode, clock)].append(results[("loom", mode)][-1][clock] / results[("hf", mode)][-1][clock])
        print(f"{r} | " + " | ".join(f"{results[run][-1]['median_s'] * 1e3:.1f} ({results[run][-1]['median_cpu_s'] * 1e3:.1f})"
                                     for run in runs) + " | "
              + " | ".join(f"{ratios[(m, 'median_s')][-1]:.3f} ({ratios[(m, 'median_cpu_s')][-1]:.3f})" for m in MODES),
              flush=True)

    def med(run, key):
        return statistics.median(x[key] for x in results[run])

    print("\nside | mode | trainable params | param MB | grad MB | optimizer MB | peak tensors MB | peak RSS MB "
          "| ms/step | CPU ms/step | train_loss")
    for run in runs:
        last = results[run][-1]
        losses = sorted({f"{x['train_loss']:.6f}" for x in results[run]})
        print(f"{run[0]} | {run[1]} | {last['trainable_params']:,} | {mb(last['param_bytes'])} | "
              f"{mb(last['grad_bytes'])} | {mb(last['optimizer_bytes'])} | {mb(med(run, 'peak_tensor_bytes'))} | "
              f"{mb(med(run, 'peak_rss_delta'))} | {med(run, 'median_s') * 1e3:.1f} | "
              f"{med(run, 'median_cpu_s') * 1e3:.1f} | {', '.join(losses)}")
    print("(memory: the last round's state bytes, the rounds' median peaks; times: the rounds' medians)\n")
    for side in SIDES:
        full, lora = (side, "full"), (side, "lora")
        share = results[lora][-1]["optimizer_bytes"] / results[full][-1]["optimizer_bytes"]
        print(f"{side}: LoRA / full fine-tuning: optimizer state {share:.4f} (target <= 0.02: "
              f"{'met' if share <= 0.02 else 'missed'}), peak tensors "
              f"{med(lora, 'peak_tensor_bytes') / med(full, 'peak_tensor_bytes'):.3f}, step time "
              f"{med(lora, 'median_s') / med(full, 'median_s'):.3f} (CPU {med(lora, 'median_cpu_s') / med(full, 'median_cpu_s'):.3f})")
    for mode in MODES:
        for clock, name in clocks.items():
            m = statistics.median(ratios[(mode, clock)])
            target = f" (target <= 1.0: {'met' if m <= 1.0 else 'missed'})" if mode == "lora" and name == "wall" else ""
            print(f"{mode}: median loom/HF {name} step time {m:.3f}{target} "
                  f"(rounds: {', '.join(f'{x:.3f}' for x in ratios[(mode, clock)])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
