"""transformers.Trainer's side of benchmarks/gpu_gpt: GPT2LMHeadModel of the same size, data,
batch and flags as build/benchmarks/gpu_gpt, timed the same way (a synchronize where the window
starts, after --warmup steps, and one where it ends). Prints one JSON line; --result writes it.

--model llama_lora: LoRA SFT of a Llama instead (main.cpp's comment at the top says what and how
the FLOPs are counted): LlamaForCausalLM of the size's shape (1b: TinyLlama's), peft's LoRA on its
default Llama targets (q_proj, v_proj) with --lora_r, --lora_alpha and --lora_dropout, trained by
transformers.Trainer with the same flags; --torch_compile as for GPT-2."""

import argparse
import json
import math
import time

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback,
                          TrainingArguments)

SIZES = {"tiny": (2, 64, 2), "124m": (12, 768, 12), "350m": (24, 1024, 16), "774m": (36, 1280, 20),
         "1558m": (48, 1600, 25)}
# llama_lora: hidden, layers, heads, key/value heads, MLP width, vocabulary (main.cpp's llama_config_for).
LLAMA_SIZES = {"tiny": (64, 2, 4, 2, 128, 512), "1b": (2048, 22, 32, 4, 5632, 32000)}


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
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama_lora"])
    p.add_argument("--size", default="124m", choices=sorted(set(SIZES) | set(LLAMA_SIZES)))
    p.add_argument("--lora_r", type=int, default=16)
    p.add_argument("--lora_alpha", type=float, default=32)
    p.add_argument("--lora_dropout", type=float, default=0.05)
    p.add_argument("--per_device_train_batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=1024)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak_tflops", type=float, default=989.0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--torch_compile", action="store_true", help="TrainingArguments(torch_compile=True)")
    p.add_argument("--result", default="")
    a = p.parse_args()
    torch.manual_seed(0)
    if a.model == "gpt2":
        if a.size not in SIZES:
            p.error(f"--model gpt2: --size is one of {', '.join(SIZES)}")
        layers, width, heads = SIZES[a.size]
        vocab = 512 if a.size == "tiny" else 50257
        config = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                            n_positions=max(1024, a.block_size), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = GPT2LMHeadModel(config)
        n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
        per_token = per_token_6n = 6.0 * n + 12.0 * layers * width * a.block_size
        extra = {}
    else:
        from peft import LoraConfig, get_peft_model
        if a.size not in LLAMA_SIZES:
            p.error(f"--model llama_lora: --size is one of {', '.join(LLAMA_SIZES)}")
        width, layers, heads, kv_heads, mlp, vocab = LLAMA_SIZES[a.size]
        config = LlamaConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=kv_heads, intermediate_size=mlp, vocab_size=vocab,
                             rms_norm_eps=1e-5, max_position_embeddings=max(2048, a.block_size),
                             tie_word_embeddings=False, attn_implementation="sdpa")
        model = LlamaForCausalLM(config)
        # PEFT's default targets for Llama (q_proj, v_proj): target_modules left unset.
        model = get_peft_model(model, LoraConfig(r=a.lora_r, lora_alpha=a.lora_alpha, lora_dropout=a.lora_dropout,
                                                 task_type="CAUSAL_LM"))
        # The FLOPs a LoRA step does (main.cpp's comment): 4 N + 6 n + 12 L d T, and 6 N_all + 12 L d T.
        frozen_matmul = adapter = base = 0
        for name, t in model.named_parameters():
            if t.requires_grad:
                adapter += t.numel()
                continue
            base += t.numel()
            if t.dim() == 2 and "embed_tokens" not in name:
                frozen_matmul += t.numel()
        attention = 12.0 * layers * width * a.block_size
        per_token, per_token_6n = 4.0 * frozen_matmul + 6.0 * adapter + attention, 6.0 * base + attention
        extra = {"trainable_params": adapter, "total_params": adapter + base}
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
    result = {"model": a.model, "mode": "hf_compile" if a.torch_compile else "hf", "size": a.size, "device": a.device, "batch": a.per_device_train_batch_size,
              "block_size": a.block_size, "timed_steps": timed, "step_ms": 1e3 * seconds / timed,
              "tokens_per_second": tokens_per_second,
              "peak_allocated_gib": 0.0 if cpu else torch.cuda.max_memory_allocated() / 2**30,
              "flops_per_token": per_token, "mfu": per_token * tokens_per_second / (a.peak_tflops * 1e12),
              "mfu_6n": per_token_6n * tokens_per_second / (a.peak_tflops * 1e12),
              "loss": out.training_loss, **extra}
    print(json.dumps(result))
    if a.result:
        with open(a.result, "w") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
