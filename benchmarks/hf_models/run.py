#!/usr/bin/env python3
"""loom's Trainer against transformers.Trainer on GPT-2 and BERT, on the CPU (issue 9 point 5).

For each model, one random HF folder (saved here by transformers, seeded) is trained by both
Trainers from the same weights, on the same KJV token data (examples/text_data/prepare.py's
folder), with the same command line (tests/hf/compare.py's way: one flag list parsed by
HfArgumentParser on one side and loom::parse_args on the other), in fp32 with one intra-op
thread on both sides (torch.set_num_threads(1) / loom's --threads 1, OMP_NUM_THREADS=1). Each
run is a fresh process: loom's is build/benchmarks/hf_models, transformers' is this script
re-entered with --hf-worker. The two alternate within a round (the order flips every round),
so drift in machine load hits both alike.

A step's time is the time between the ends of consecutive optimizer steps (on_step_end on both
sides: data loading, forward, backward, clipping, the optimizer and the Trainer's bookkeeping),
the first --warmup steps left out; tokens/s is tokens per step (GPT-2: batch x block; BERT:
batch x the padded length) over the run's median step time. Dropout is 0, so both sides compute
the same losses; the final train_loss of each pair is printed as a check that they did the same
work. Per round: loom / transformers step time; at the end the median of those ratios.

  .venv/bin/python benchmarks/hf_models/run.py --bench build/benchmarks/hf_models --data data/kjv \\
      --work /tmp/hf_bench [--rounds 5] [--steps 20] [--warmup 3] [--models gpt2 bert]
"""
import argparse
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

# The models (issue 9 point 5: GPT-2 n_layer 4, n_embd 256, block 128, batch 8; BERT of a similar size).
SIZES = {
    "gpt2": dict(n_layer=4, n_head=4, n_embd=256, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "bert": dict(num_hidden_layers=4, num_attention_heads=4, hidden_size=256, intermediate_size=1024,
                 max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
}
BLOCK, MAX_SEQ_LENGTH = 128, 64
FLAGS = ["--per_device_train_batch_size", "8", "--learning_rate", "1e-4", "--optim", "adamw_torch_fused",
         "--lr_scheduler_type", "linear", "--weight_decay", "0.01", "--max_grad_norm", "1.0",
         "--logging_steps", "1000", "--save_strategy", "no", "--eval_strategy", "no", "--seed", "42",
         "--disable_tqdm", "true", "--use_cpu", "true"]


def read_meta(data):
    with open(os.path.join(data, "meta.json")) as f:
        return json.load(f)


def make_init(work, model, meta):
    """One random HF folder per model, saved by transformers from a fixed seed."""
    from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel
    folder = os.path.join(work, model, "init")
    torch.manual_seed(0)
    if model == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=meta["vocab_size"], bos_token_id=meta["eos_token_id"],
                                        eos_token_id=meta["eos_token_id"], **SIZES["gpt2"]))
    else:
        labels = meta["classification"]["label_names"]
        hf = BertForSequenceClassification(BertConfig(
            vocab_size=meta["vocab_size"], pad_token_id=meta["pad_token_id"], num_labels=len(labels),
            id2label=dict(enumerate(labels)), problem_type="single_label_classification", **SIZES["bert"]))
    hf.save_pretrained(folder)
    return folder


def train_rows(model, data, meta):
    """The training data as transformers gets it, the same examples as loom's datasets give."""
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    if model == "gpt2":
        # TokenFileDataset: train.bin cut into windows of BLOCK, labels = input_ids. Position 0
        # is never a target; -100 there makes transformers' num_items_in_batch count the
        # predicted tokens, as loom's loss does (compare.py explains).
        ids = np.fromfile(os.path.join(data, meta["lm"]["train"]["file"]), dtype=dtype).astype(np.int64)
        n = len(ids) // BLOCK
        windows = torch.from_numpy(ids[: n * BLOCK].reshape(n, BLOCK))
        labels = windows.clone()
        labels[:, 0] = -100
        return compare.Rows({"train_input_ids": windows, "train_labels": labels}, "train")
    # TokenSequenceDataset + DataCollatorWithPadding(max_length): each verse truncated to
    # MAX_SEQ_LENGTH ids and padded to it with the pad id, attention_mask 0 on the padding.
    files = meta["classification"]["train"]
    ids = np.fromfile(os.path.join(data, files["ids"]), dtype=dtype).astype(np.int64)
    offsets = np.fromfile(os.path.join(data, files["offsets"]), dtype="<u8").astype(np.int64)
    labels = torch.from_numpy(np.fromfile(os.path.join(data, files["labels"]), dtype="<i8").copy())
    n = len(offsets) - 1
    input_ids = torch.full((n, MAX_SEQ_LENGTH), meta["pad_token_id"], dtype=torch.long)
    mask = torch.zeros((n, MAX_SEQ_LENGTH), dtype=torch.long)
    for i in range(n):
        seq = ids[offsets[i]:offsets[i + 1]][:MAX_SEQ_LENGTH]
        input_ids[i, : len(seq)] = torch.from_numpy(seq)
        mask[i, : len(seq)] = 1
    return compare.Rows({"train_input_ids": input_ids, "train_attention_mask": mask, "train_labels": labels}, "train")


def hf_worker(model, init, data, times_file, flags):
    """transformers.Trainer on `flags` (this script re-entered), timed step by step."""
    from transformers import (BertForSequenceClassification, GPT2LMHeadModel, HfArgumentParser, Trainer,
                              TrainerCallback, TrainingArguments)
    torch.set_num_threads(1)
    meta = read_meta(data)
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        flags + ["--output_dir", os.path.join(os.path.dirname(times_file), "hf_out"), "--report_to", "none"])
    net = (GPT2LMHeadModel if model == "gpt2" else BertForSequenceClassification).from_pretrained(init)
    ends = []

    class StepClock(TrainerCallback):
        def on_train_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            ends.append(time.perf_counter() - self.start)

    trainer = Trainer(model=net, args=args, train_dataset=train_rows(model, data, meta), callbacks=[StepClock()])
    result = trainer.train()
    tokens = args.per_device_train_batch_size * (BLOCK if model == "gpt2" else MAX_SEQ_LENGTH)
    with open(times_file, "w") as f:
        json.dump({"side": "transformers", "step_end": ends, "train_loss": result.training_loss,
                   "tokens_per_step": tokens, "threads": torch.get_num_threads()}, f)


def run_side(side, opts, model, init, flags, round_dir):
    times = os.path.join(round_dir, f"{side}.json")
    if side == "loom":
        cmd = [opts.bench, "--model", model, "--model_name_or_path", init, "--data_dir", opts.data,
               "--times_file", times, "--threads", "1", "--output_dir", os.path.join(round_dir, "loom_out"),
               "--block_size", str(BLOCK), "--max_seq_length", str(MAX_SEQ_LENGTH)] + flags
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--hf-worker", model, init, opts.data, times, "--"] + flags
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run.py: {side} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(times) as f:
        result = json.load(f)
    median = rounds.median_step_s(result["step_end"], opts.warmup)
    return {"median_s": median, "tokens_per_s": result["tokens_per_step"] / median,
            "train_loss": result["train_loss"], "threads": result["threads"],
            "steps": len(result["step_end"]) - opts.warmup}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-worker":
        model, init, data, times = sys.argv[2:6]
        hf_worker(model, init, data, times, sys.argv[7:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="build/benchmarks/hf_models")
    p.add_argument("--data", required=True, help="prepare.py's folder (make kjv-data: data/kjv)")
    p.add_argument("--work", required=True, help="a scratch folder")
    p.add_argument("--models", nargs="+", default=["gpt2", "bert"], choices=["gpt2", "bert"])
    rounds.add_round_options(p, "loom/transformers pairs per model", steps=20)
    opts = rounds.parse_round_options(p)
    meta = read_meta(opts.data)
    flags = compare.merge(FLAGS, ["--max_steps", str(opts.warmup + opts.steps)])
    print(f"hf_models: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}, one intra-op thread per side, fp32; {opts.rounds} rounds x {opts.steps} steps "
          f"(+{opts.warmup} warm-up) per side; {time.strftime('%Y-%m-%d %H:%M')}")
    summary = {}
    for model in opts.models:
        init = make_init(opts.work, model, meta)
        ratios = []
        print(f"\n{model}: {json.dumps(SIZES[model])}, batch 8, "
              f"{'block ' + str(BLOCK) if model == 'gpt2' else 'padded length ' + str(MAX_SEQ_LENGTH)}")
        print("round | loom ms/step | HF ms/step | loom tokens/s | HF tokens/s | loom/HF step time | train_loss loom / HF")
        for r in range(opts.rounds):
            round_dir = os.path.join(opts.work, model, f"round{r}")
            os.makedirs(round_dir, exist_ok=True)
            order = ["loom", "transformers"] if r % 2 == 0 else ["transformers", "loom"]
            res = {side: run_side(side, opts, model, init, flags, round_dir) for side in order}
            lm, hf = res["loom"], res["transformers"]
            ratios.append(lm["median_s"] / hf["median_s"])
            print(f"{r} | {lm['median_s'] * 1e3:.1f} | {hf['median_s'] * 1e3:.1f} | {lm['tokens_per_s']:.0f} | "
                  f"{hf['tokens_per_s']:.0f} | {ratios[-1]:.3f} | {lm['train_loss']:.6f} / {hf['train_loss']:.6f}",
                  flush=True)
        summary[model] = statistics.median(ratios)
        print(f"{model}: median loom/HF step time {summary[model]:.3f} (rounds: "
              + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
