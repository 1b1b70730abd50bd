"""transformers.Trainer's side of benchmarks/gpu_gpt: GPT2LMHeadModel of the same size, data,
batch and flags as build/benchmarks/gpu_gpt, timed the same way (a synchronize where the window
starts, after --warmup steps, and one where it ends). Prints one JSON line; --result writes it."""

import argparse
import json
import math
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

SIZES = {"tiny": (2, 64, 2), "124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20),
         "1558m": (48, 1600, 25)}


class Windows(torch.utils.data.Dataset):
    """Random token windows from the seed the C++ side uses (torch's CPU generator, 1234)."""

    def __init__(self, n, block, vocab):
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(vocab, (n, block), generator=g)

    def __len__(self):
        return self.ids.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Window(TrainerCallback):
    def __init__(self, warmup, last, cuda):
        self.warmup, self.last, self.cuda = warmup, last, cuda
        self.start = self.end = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.warmup, self.last):
            if self.cuda:
                torch.cuda.synchronize()
            if state.global_step == self.warmup:
                self.start = time.perf_counter()
            else:
                self.end = time.perf_counter()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", default="124m", choices=sorted(SIZES))
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--torch_compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--result", default="")
    a = p.parse_args()
    layers, width, heads = SIZES[a.size]
    vocab = 512 if a.size == "tiny" else 50257
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                        n_positions=max(1024, a.block_size), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    cpu = a.device == "cpu"
    args = TrainingArguments(
        output_dir="/tmp/loom_bench_gpu_gpt_hf", per_device_train_batch_size=a.per_device_train_batch_size,
        max_steps=a.max_steps, learning_rate=6e-4, weight_decay=0.1, adam_beta2=0.95, lr_scheduler_type="cosine",
        warmup_steps=5, bf16=True, optim="adamw_torch_fused", max_grad_norm=1.0, save_strategy="no",
        logging_steps=1_000_000, report_to="none", disable_tqdm=True, use_cpu=cpu,
        train_sampling_strategy="sequential", dataloader_num_workers=0, seed=0,
        torch_compile=a.torch_compile)
    window = Window(a.warmup, a.max_steps, not cpu)
    data = Windows(a.per_device_train_batch_size * a.max_steps, a.block_size, vocab)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[window])
    if not cpu:
        torch.cuda.reset_peak_memory_stats()
    out = trainer.train()
    seconds = window.end - window.start
    timed = a.max_steps - a.warmup
    tokens_per_second = timed * a.per_device_train_batch_size * a.block_size / seconds
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    per_token = 6.0 * n + 12.0 * layers * width * a.block_size
    result = {"mode": "hf_compile" if a.torch_compile else "hf", "size": a.size, "device": a.device, "batch": a.per_device_train_batch_size,
              "block_size": a.block_size, "timed_steps": timed, "step_ms": 1e3 * seconds / timed,
              "tokens_per_second": tokens_per_second,
              "peak_allocated_gib": 0.0 if cpu else torch.cuda.max_memory_allocated() / 2**30,
              "flops_per_token": per_token, "mfu": per_token * tokens_per_second / (a.peak_tflops * 1e12),
              "loss": out.training_loss}
    print(json.dumps(result))
    if a.result:
        with open(a.result, "w") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
