#!/usr/bin/env python3
"""DPO with LoRA, loom's DPOTrainer against TRL's, on the CPU; and the memory of loom's three reference paths (issue 39 point 7).

One random Llama (vocabulary 32,000, hidden 256, 4 layers) is saved by transformers from a fixed
seed, and one PEFT adapter on it (r 16, alpha 32, dropout 0, q_proj and v_proj). The data:
preference pairs whose prompts are 48-80 tokens and completions 16-48, as token rows with
their completion labels. Both sides train the same adapter on the same pairs with the same flags
(batch 4 pairs, AdamW 5e-5 linear, sigmoid loss, beta 0.1, fp32, no saving or evaluation, one
intra-op thread), the reference the base with the adapter off (TRL's choice with peft_config,
loom's for an adapted policy), in rounds whose order reverses every round. The per-round ratio
is loom's median step time over TRL's (the first --warmup steps left out); the figure is the
median over the rounds. TRL computes the per-token log-probabilities with its own chunked
kernel at every position on the CPU; loom at the completion positions only.

Then loom alone, one run per reference path: the adapter off, a second copy of the model
(ReferenceModel), and log-probabilities precomputed before training. For each, the CPU tensor
bytes alive when training begins (the models, and the copy or the precomputed values), the
most alive at once during training (bench::CountingAllocator), and the process's peak RSS.

The last line is the figure:
  dpo step time loom/trl: R   (target <= 1.0)

  .venv/bin/python benchmarks/dpo/run.py --bench build/benchmarks/dpo --work /tmp/dpo_bench \\
      [--rounds 3] [--steps 8] [--warmup 2]
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
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "common"))
import rounds  # noqa: E402  (benchmarks/common/rounds.py: the round options)

import torch  # noqa: E402

LLAMA = dict(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=1)
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
PAIRS, PROMPT, COMPLETION = 256, (48, 80), (16, 48)
FLAGS = ["--per_device_train_batch_size", "4", "--learning_rate", "5e-5", "--lr_scheduler_type", "linear",
         "--warmup_steps", "0", "--logging_steps", "1000", "--save_strategy", "no", "--eval_strategy", "no",
         "--seed", "42", "--gradient_checkpointing", "false", "--max_grad_norm", "1.0", "--use_cpu", "true",
         "--disable_tqdm", "true", "--bf16", "false", "--report_to", "none"]
REFERENCES = ["adapter_off", "copy", "precompute"]


def make_inputs(work):
    """The base folder, the PEFT adapter folder and the pairs, from fixed seeds."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    init, adapter, data = (os.path.join(work, name) for name in ("init", "adapter", "pairs.safetensors"))
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(**LLAMA))
    base.save_pretrained(init)
    torch.manual_seed(1)
    get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **LORA)).save_pretrained(adapter)
    gen = torch.Generator().manual_seed(2)
    rand = lambda low, high: int(torch.randint(low, high + 1, (1,), generator=gen))
    t, scored = {}, 0
    prompts = [torch.randint(2, LLAMA["vocab_size"], (rand(*PROMPT),), generator=gen) for _ in range(PAIRS)]
    for side in ("chosen", "rejected"):
        rows = [(p, torch.randint(2, LLAMA["vocab_size"], (rand(*COMPLETION),), generator=gen)) for p in prompts]
        width = max(len(p) + len(c) for p, c in rows)
        ids = torch.full((PAIRS, width), LLAMA["pad_token_id"], dtype=torch.long)
        mask = torch.zeros(PAIRS, width, dtype=torch.long)
        labels = torch.full((PAIRS, width), -100, dtype=torch.long)
        for i, (p, c) in enumerate(rows):
            ids[i, : len(p) + len(c)] = torch.cat([p, c])
            mask[i, : len(p) + len(c)] = 1
            labels[i, len(p): len(p) + len(c)] = c
            scored += len(c)
        t[f"{side}_input_ids"], t[f"{side}_attention_mask"], t[f"{side}_labels"] = ids, mask, labels
    save_file(t, data)
    tokens = int(t["chosen_attention_mask"].sum() + t["rejected_attention_mask"].sum())
    return (init, adapter, data), scored / tokens


def trl_worker(init, adapter, data, result_file, flags):
    """TRL's DPOTrainer with a LoRA adapter (peft_config), its weights set to `adapter`'s."""
    from datasets import Dataset
    from peft import LoraConfig, load_peft_weights, set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, HfArgumentParser, PreTrainedTokenizerFast, TrainerCallback
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from trl import DPOConfig, DPOTrainer
    torch.set_num_threads(1)
    DPOTrainer._prepare_dataset = lambda self, dataset, *args, **kwargs: dataset  # pre-tokenized pairs
    t = load_file(data)
    rows = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for i in range(t["chosen_input_ids"].size(0)):
        for side in ("chosen", "rejected"):
            ids, labels = t[f"{side}_input_ids"][i], t[f"{side}_labels"][i]
            scored = (labels != -100).nonzero().flatten()
            start, end = int(scored[0]), int(scored[-1]) + 1
            if side == "chosen":
                rows["prompt_ids"].append(ids[:start].tolist())
            rows[f"{side}_ids"].append(ids[start:end].tolist())
    vocab = {f"t{i}": i for i in range(LLAMA["vocab_size"])}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")), pad_token="t1",
                                        eos_token="t1", unk_token="t2")
    (args,) = HfArgumentParser(DPOConfig).parse_args_into_dataclasses(flags + ["--output_dir", os.path.dirname(result_file)])

    class Probe(TrainerCallback):
        def __init__(self):
            self.ends, self.cpu_ends = [], []

        def on_train_begin(self, *a, **k):
            self.start, self.cpu_start = time.perf_counter(), time.process_time()

        def on_step_end(self, *a, **k):
            self.ends.append(time.perf_counter() - self.start)
            self.cpu_ends.append(time.process_time() - self.cpu_start)

    probe = Probe()
    model = AutoModelForCausalLM.from_pretrained(init, dtype=torch.float32)
    trainer = DPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict(rows), processing_class=tokenizer,
                         peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA), callbacks=[probe])
    set_peft_model_state_dict(trainer.model, load_peft_weights(adapter))  # loom's starting adapter
    result = trainer.train()
    with open(result_file, "w") as f:
        json.dump({"side": "trl", "step_end": probe.ends, "step_cpu_end": probe.cpu_ends,
                   "train_loss": result.training_loss}, f)


def run_one(side, reference, opts, inputs, flags, round_dir):
    init, adapter, data = inputs
    result_file = os.path.join(round_dir, f"{side}_{reference}.json")
    if side == "loom":
        cmd = [opts.bench, "--model_name_or_path", init, "--lora_adapter", adapter, "--data_file", data,
               "--result_file", result_file, "--reference", reference, "--threads", "1",
               "--output_dir", os.path.join(round_dir, "loom_out")] + flags
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--trl-worker", init, adapter, data, result_file, "--"] + flags
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"run.py: {side} {reference} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(result_file) as f:
        r = json.load(f)
    r["median_s"] = rounds.median_step_s(r["step_end"], opts.warmup)
    r["median_cpu_s"] = rounds.median_step_s(r["step_cpu_end"], opts.warmup)
    return r


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-worker":
        trl_worker(*sys.argv[2:6], sys.argv[7:])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bench", required=True, help="build/benchmarks/dpo")
    p.add_argument("--work", required=True, help="a scratch folder")
    rounds.add_round_options(p, "rounds of the two DPO runs", steps=8)
    opts = rounds.parse_round_options(p)
    os.makedirs(opts.work, exist_ok=True)
    inputs, scored = make_inputs(opts.work)
    flags = FLAGS + ["--max_steps", str(opts.warmup + opts.steps)]
    print(f"dpo: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"one intra-op thread per side, fp32; {opts.rounds} rounds x {opts.steps} steps (+{opts.warmup} warm-up); "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"llama: {json.dumps(LLAMA)}; LoRA {json.dumps(LORA)}; {PAIRS} pairs, prompts of {PROMPT[0]}-{PROMPT[1]} "
          f"tokens, completions of {COMPLETION[0]}-{COMPLETION[1]}: {scored:.3f} of the tokens scored; flags: "
          f"{' '.join(flags)}")
    ratios, cpu_ratios, losses = [], [], {"loom": set(), "trl": set()}
    print("\nround | loom ms/step (CPU) | trl ms/step (CPU) | loom/trl (CPU) | train_loss loom, trl")
    for r in range(opts.rounds):
        round_dir = os.path.join(opts.work, f"round{r}")
        os.makedirs(round_dir, exist_ok=True)
        res = {}
        for side in (["loom", "trl"] if r % 2 == 0 else ["trl", "loom"]):
            res[side] = run_one(side, "adapter_off", opts, inputs, flags, round_dir)
            losses[side].add(f"{res[side]['train_loss']:.6f}")
        ratios.append(res["loom"]["median_s"] / res["trl"]["median_s"])
        cpu_ratios.append(res["loom"]["median_cpu_s"] / res["trl"]["median_cpu_s"])
        print(f"{r} | {res['loom']['median_s'] * 1e3:.1f} ({res['loom']['median_cpu_s'] * 1e3:.1f}) | "
              f"{res['trl']['median_s'] * 1e3:.1f} ({res['trl']['median_cpu_s'] * 1e3:.1f}) | {ratios[-1]:.3f} "
              f"({cpu_ratios[-1]:.3f}) | {res['loom']['train_loss']:.6f}, {res['trl']['train_loss']:.6f}", flush=True)
    print(f"train_loss: loom {', '.join(sorted(losses['loom']))}; trl {', '.join(sorted(losses['trl']))}")
    print(f"dpo step time, rounds: {', '.join(f'{x:.3f}' for x in ratios)} (CPU time: median "
          f"{statistics.median(cpu_ratios):.3f})")

    print("\nreference | tensors alive at train begin MB | peak tensors in training MB | peak RSS MB | ms/step")
    memory_dir = os.path.join(opts.work, "memory")
    os.makedirs(memory_dir, exist_ok=True)
    for reference in REFERENCES:
        m = run_one("loom", reference, opts, inputs, flags, memory_dir)
        print(f"{reference} | {m['live_at_begin'] / 1e6:.1f} | {m['peak_tensor_bytes'] / 1e6:.1f} | "
              f"{m['peak_rss'] / 1e6:.1f} | {m['median_s'] * 1e3:.1f}", flush=True)
    print(f"dpo step time loom/trl: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
