#!/usr/bin/env python3
"""Each rank's peak memory under FullShard against one process, a model read from a sharded HF
folder (issue 38 point 2).

A random Llama of about 200M parameters (hidden 1024, 15 layers, intermediate 2816, untied
head; the vocabulary of the token folder) is saved by transformers, sharded into files of 200 MB
with model.safetensors.index.json. examples/llama_sft then trains it from that folder for
--steps steps (--do_train: packed windows of 128 tokens, batch 1, fp32, no evaluation, the final
save included) two ways:
  * LoRA (r 16 on q_proj and v_proj: the example's default), the adapter saved;
  * full fine-tuning with plain SGD (--use_peft false --optim sgd), the whole model saved;
  * QLoRA (the same adapter on an NF4 base, double-quantized: --load_in_4bit
    --use_bnb_nested_quant): built without memory in every run, each layer quantized as it is
    read; one process keeps the whole 4-bit base, each FullShard rank its shard of it; the merged
    model (the base dequantized, float32) saved too, unit by unit. Each run
    also prints what each rank holds of the 4-bit base (the example's "holds the 4-bit base"
    line).
Each way runs as one process (--sharding no) and under torchrun at each --ranks world size
(--sharding full_shard: the example builds the model under loom::DeferredInit, so each rank
materializes only its slices). The same runs on a tiny model (hidden 32, 2 layers) give the
baseline: what a process holds without the model (libtorch, the data, the process group).

Each process runs under a small wrapper (this script, --measure) that starts it and reads its
peak resident set (getrusage RUSAGE_CHILDREN's ru_maxrss, the process's VmHWM), so every rank
is measured alone. Printed per way: one process's peak above its baseline, each world size's
largest rank peak above its baseline, and their ratio (the target: at most 0.6 at 2 ranks).
One intra-op thread (OMP_NUM_THREADS=1); glibc's mmap threshold at 64 KiB for every run
(MALLOC_MMAP_THRESHOLD_), so a freed block leaves the resident set at once, one process and
ranks alike.

  .venv/bin/python benchmarks/sharded_start/run.py --example build/examples/llama_sft \\
      --data data/kjv_sft --work /tmp/sharded_start [--ranks 2,4] [--steps 1] [--ways lora,full_sgd,qlora]
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys


def measure(out, command):
    """--measure: runs `command`, writes its peak RSS (bytes) to out.<RANK> and exits with its code."""
    code = subprocess.run(command).returncode
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    with open(f"{out}.{os.environ.get('RANK', '0')}", "w") as f:
        f.write(str(peak))
    sys.exit(code)


def make_folder(folder, data, hidden, layers, intermediate):
    if os.path.exists(os.path.join(folder, "config.json")):
        return
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    with open(os.path.join(data, "meta.json")) as f:
        vocab = json.load(f)["vocab_size"]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
                         num_key_value_heads=max(hidden // 64, 1), max_position_embeddings=256,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=1)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, max_shard_size="200MB")
    print(f"{folder}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"{len([n for n in os.listdir(folder) if n.endswith('.safetensors')])} weight files", flush=True)


def run(opts, folder, way, world, tag):
    out = os.path.join(opts.work, f"{tag}_{way}_{world}")
    peaks = os.path.join(opts.work, f"{tag}_{way}_{world}.peak")
    for name in os.listdir(opts.work):
        if name.startswith(os.path.basename(peaks) + "."):
            os.remove(os.path.join(opts.work, name))
    flags = [opts.example, "--model_name_or_path", folder, "--data_dir", opts.data, "--output_dir", out,
             "--overwrite_output_dir", "true", "--use_cpu", "--disable_tqdm", "--bf16", "false",
             "--max_steps", str(opts.steps), "--logging_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
             "--per_device_train_batch_size", "1", "--packing", "128", "--do_train",
             "--sharding", "full_shard" if world > 1 else "no"]
    if way == "full_sgd":
        flags += ["--use_peft", "false", "--optim", "sgd"]
    if way == "qlora":
        flags += ["--load_in_4bit", "--use_bnb_nested_quant", "--lora_save_merged"]
    wrapper = [sys.executable, os.path.abspath(__file__), "--measure", peaks, "--"]
    # glibc keeps freed blocks below its mmap threshold (up to 32 MB) in the heap, where the
    # RSS still counts them; every run, one process or a rank, returns them at once instead.
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    if world == 1:
        command = wrapper + flags
    else:
        command = [opts.torchrun, "--standalone", f"--nproc_per_node={world}", "--no-python"] + wrapper + flags
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    held = sorted((int(r), int(b)) for r, b in re.findall(r"rank (\d+) holds the 4-bit base in (\d+) bytes", done.stdout))
    if held and tag == "big":
        print(f"{way}: {world} process(es): " + ", ".join(f"rank {r} holds {b / 1e6:.2f} MB of the 4-bit base"
                                                         for r, b in held), flush=True)
    return [int(open(f"{peaks}.{r}").read()) for r in range(world)]


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--measure":
        measure(sys.argv[2], sys.argv[4:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--example", required=True)
    p.add_argument("--data", default="data/kjv_sft")
    p.add_argument("--work", required=True)
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--ways", default="lora,full_sgd,qlora")
    p.add_argument("--torchrun", default=os.path.join(os.path.dirname(sys.executable), "torchrun"))
    opts = p.parse_args()
    os.makedirs(opts.work, exist_ok=True)
    big, tiny = os.path.join(opts.work, "llama_200m"), os.path.join(opts.work, "llama_tiny")
    make_folder(big, opts.data, 1024, 15, 2816)
    make_folder(tiny, opts.data, 32, 2, 64)
    worlds = [1] + [int(w) for w in opts.ranks.split(",")]
    mb = 1e6
    for way in opts.ways.split(","):
        base = {w: max(run(opts, tiny, way, w, "tiny")) for w in worlds}
        peak = {w: run(opts, big, way, w, "big") for w in worlds}
        one = peak[1][0] - base[1]
        print(f"{way}: one process {peak[1][0] / mb:.0f} MB peak, {one / mb:.0f} MB above its baseline "
              f"({base[1] / mb:.0f} MB)", flush=True)
        for w in worlds[1:]:
            above = max(peak[w]) - base[w]
            ranks = ", ".join(f"{x / mb:.0f}" for x in peak[w])
            print(f"{way}: {w} ranks under FullShard, rank peaks {ranks} MB (baseline {base[w] / mb:.0f} MB): "
                  f"{above / mb:.0f} MB above, {above / one:.2f} of one process's", flush=True)


if __name__ == "__main__":
    main()
