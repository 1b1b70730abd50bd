#!/usr/bin/env python3
"""Checks of the gpt2 and bert_classify example runs (tests/examples/*_gpt2.cmake, smoke_bert_classify.cmake).

  hf_examples_check.py kjv_data --kjv_text EXE --out DIR
      the fixture: a tiny KJV token folder (2000 verses, a 512-token BPE) from kjv_text and kjv.py
  hf_examples_check.py resumed --straight DIR --resumed DIR --from_step N
      a run resumed from checkpoint-N of `straight` logs the same losses after step N and ends
      with the same train_loss, eval_loss and global_step
  hf_examples_check.py same --keys K... -- DIR...
      the runs' all_results.json agree on the keys (relative 1e-5) and their model.safetensors
      hold the same names and shapes (every rank's part gathered)
  hf_examples_check.py transformers --model DIR --data DIR --results FILE [--block_size N | --max_seq_length N]
      transformers opens the saved folder (model and tokenizer) and, in fp32, gets the held-out
      eval_loss (and for BERT eval_accuracy) that loom reported in FILE
  hf_examples_check.py set_label --data DIR --out DIR --split NAME --example I --value V
      a copy of the token folder DIR whose classification split NAME gives example I the label V

Each prints one "... ok" line or exits non-zero with the reason.
"""
import argparse
import json
import math
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message):
    sys.exit(f"hf_examples_check: {message}")


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def close(a, b, rtol):
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(abs(a), abs(b))


def kjv_data(opts):
    kjv = os.path.join(HERE, "..", "..", "examples", "text_data", "kjv.py")
    done = subprocess.run([sys.executable, kjv, "--kjv_text", opts.kjv_text, "--out", opts.out,
                           "--limit", "2000", "--vocab_size", "512"], capture_output=True, text=True)
    print(done.stdout + done.stderr, end="")
    if done.returncode != 0:
        fail(f"kjv.py exited with {done.returncode}")
    meta = read_json(os.path.join(opts.out, "meta.json"))
    if meta["vocab_size"] != 512 or len(meta["classification"]["label_names"]) != 7:
        fail(f"unexpected meta.json: vocab_size {meta['vocab_size']}")
    print("kjv data ok")


def set_label(opts):
    import shutil
    import struct
    shutil.rmtree(opts.out, ignore_errors=True)
    shutil.copytree(opts.data, opts.out)
    labels = read_json(os.path.join(opts.out, "meta.json"))["classification"][opts.split]["labels"]
    with open(os.path.join(opts.out, labels), "r+b") as f:
        f.seek(8 * opts.example)
        f.write(struct.pack("<q", opts.value))
    print("set label ok")


def losses_by_step(state):
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def resumed(opts):
    s_state = read_json(os.path.join(opts.straight, "trainer_state.json"))
    r_state = read_json(os.path.join(opts.resumed, "trainer_state.json"))
    if s_state["global_step"] != r_state["global_step"]:
        fail(f"global_step {r_state['global_step']} after resume, {s_state['global_step']} straight")
    straight, again = losses_by_step(s_state), losses_by_step(r_state)
    after = sorted(step for step in straight if step > opts.from_step)
    if not after or [s for s in sorted(again) if s > opts.from_step] != after:
        fail(f"logged steps after {opts.from_step}: straight {after}, resumed {sorted(again)}")
    for step in after:
        if not close(straight[step], again[step], 1e-6):
            fail(f"step {step}: loss {again[step]!r} after resume, {straight[step]!r} straight")
    s_all = read_json(os.path.join(opts.straight, "all_results.json"))
    r_all = read_json(os.path.join(opts.resumed, "all_results.json"))
    for key in ("train_loss", "eval_loss"):
        if not close(s_all[key], r_all[key], 1e-6):
            fail(f"{key} {r_all[key]!r} after resume, {s_all[key]!r} straight")
    print(f"resume ok: steps {after} logged the same losses, train_loss {r_all['train_loss']:.6f}, "
          f"eval_loss {r_all['eval_loss']:.6f}")


def same(opts):
    from safetensors import safe_open

    first = None
    for d in opts.dirs:
        results = read_json(os.path.join(d, "all_results.json"))
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        values = {k: results[k] for k in opts.keys}
        if first is None:
            first = (d, values, shapes)
            continue
        if shapes != first[2]:
            fail(f"{d}/model.safetensors holds other tensors than {first[0]}'s")
        for k in opts.keys:
            if not close(values[k], first[1][k], 1e-5):
                fail(f"{d}: {k} {values[k]!r}, {first[0]}: {first[1][k]!r}")
    print(f"same results ok: {len(opts.dirs)} runs, " + ", ".join(f"{k} {first[1][k]:.6f}" for k in opts.keys))


def transformers_check(opts):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification, GPT2LMHeadModel

    torch.set_num_threads(1)
    meta = read_json(os.path.join(opts.data, "meta.json"))
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    reported = read_json(opts.results)
    AutoTokenizer.from_pretrained(opts.model)  # the tokenizer files were saved beside the model
    arch = AutoConfig.from_pretrained(opts.model).architectures[0]
    losses, correct, rows = [], 0, 0
    with torch.no_grad():
        if arch == "GPT2LMHeadModel":
            model = GPT2LMHeadModel.from_pretrained(opts.model).eval()
            ids = np.fromfile(os.path.join(opts.data, meta["lm"]["val"]["file"]), dtype=dtype).astype(np.int64)
            n = len(ids) // opts.block_size
            windows = torch.from_numpy(ids[: n * opts.block_size].reshape(n, opts.block_size))
            for batch in windows.split(32):
                losses.append(model(input_ids=batch, labels=batch).loss * len(batch))
                rows += len(batch)
        elif arch == "BertForSequenceClassification":
            model = BertForSequenceClassification.from_pretrained(opts.model).eval()
            files = meta["classification"]["val"]
            ids = np.fromfile(os.path.join(opts.data, files["ids"]), dtype=dtype).astype(np.int64)
            offsets = np.fromfile(os.path.join(opts.data, files["offsets"]), dtype="<u8").astype(np.int64)
            labels = torch.from_numpy(np.fromfile(os.path.join(opts.data, files["labels"]), dtype="<i8"))
            seqs = [ids[b:e][: opts.max_seq_length] for b, e in zip(offsets[:-1], offsets[1:])]
            for start in range(0, len(seqs), 32):
                part = seqs[start:start + 32]
                width = max(len(s) for s in part)
                input_ids = torch.full((len(part), width), meta["pad_token_id"], dtype=torch.long)
                mask = torch.zeros((len(part), width), dtype=torch.long)
                for i, s in enumerate(part):
                    input_ids[i, : len(s)] = torch.from_numpy(s)
                    mask[i, : len(s)] = 1
                logits = model(input_ids=input_ids, attention_mask=mask).logits
                target = labels[start:start + len(part)]
                losses.append(F.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(-1) == target).sum())
                rows += len(part)
        else:
            fail(f"{opts.model}: unexpected architecture {arch}")
    loss = float(torch.stack(losses).sum()) / rows
    if not close(loss, reported["eval_loss"], opts.rtol):
        fail(f"transformers' held-out loss {loss!r}, loom's eval_loss {reported['eval_loss']!r}")
    line = f"transformers ok: {arch} from {opts.model}, held-out loss {loss:.6f} (loom {reported['eval_loss']:.6f})"
    if arch == "BertForSequenceClassification":
        accuracy = correct / rows
        if abs(accuracy - reported["eval_accuracy"]) > 0.5 / rows:
            fail(f"transformers' accuracy {accuracy!r}, loom's eval_accuracy {reported['eval_accuracy']!r}")
        line += f", accuracy {accuracy:.4f} (loom {reported['eval_accuracy']:.4f})"
    print(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kjv_data")
    k.add_argument("--kjv_text", required=True)
    k.add_argument("--out", required=True)
    r = sub.add_parser("resumed")
    r.add_argument("--straight", required=True)
    r.add_argument("--resumed", required=True)
    r.add_argument("--from_step", type=int, required=True)
    s = sub.add_parser("same")
    s.add_argument("--keys", nargs="+", required=True)
    s.add_argument("dirs", nargs="+")
    t = sub.add_parser("transformers")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--results", required=True)
    t.add_argument("--block_size", type=int, default=128)
    t.add_argument("--max_seq_length", type=int, default=128)
    t.add_argument("--rtol", type=float, default=1e-5)
    b = sub.add_parser("set_label")
    b.add_argument("--data", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--split", required=True)
    b.add_argument("--example", type=int, required=True)
    b.add_argument("--value", type=int, required=True)
    opts = p.parse_args()
    {"set_label": set_label, "kjv_data": kjv_data, "resumed": resumed, "same": same, "transformers": transformers_check}[opts.command](opts)


if __name__ == "__main__":
    main()
