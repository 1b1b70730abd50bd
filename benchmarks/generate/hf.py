#!/usr/bin/env python3
"""transformers' side of benchmarks/generate: the same models' sizes and inputs' shapes, greedy
generate with and without the cache, one intra-op thread; prints the same table.

  .venv/bin/python benchmarks/generate/hf.py [--new_tokens 128] [--rounds 3]
"""
import argparse
import os
import statistics
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def main():
    p = argparse.ArgumentParser()
    for name, default in [("batch", 4), ("prompt", 32), ("new_tokens", 128), ("layers", 4), ("hidden", 256),
                          ("vocab", 4096), ("rounds", 3), ("threads", 1)]:
        p.add_argument("--" + name, type=int, default=default)
    b = p.parse_args()
    torch.set_num_threads(b.threads)
    torch.manual_seed(0)
    positions = b.prompt + b.new_tokens
    models = {
        "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=b.vocab, n_positions=positions, n_embd=b.hidden,
                                           n_layer=b.layers, n_head=b.hidden // 64, bos_token_id=None,
                                           eos_token_id=None)),
        "llama": LlamaForCausalLM(LlamaConfig(vocab_size=b.vocab, hidden_size=b.hidden,
                                              intermediate_size=b.hidden * 8 // 3, num_hidden_layers=b.layers,
                                              num_attention_heads=b.hidden // 64,
                                              num_key_value_heads=b.hidden // 128,
                                              max_position_embeddings=positions, bos_token_id=None,
                                              eos_token_id=None)),
    }
    print(f"transformers greedy generate: batch {b.batch}, prompt {b.prompt}, {b.new_tokens} new tokens; "
          f"{b.layers} layers, hidden {b.hidden}, vocab {b.vocab}; {b.threads} thread(s), median of {b.rounds}")
    print(f"{'model':<8} {'cache tok/s':>14} {'no cache tok/s':>14} {'speed-up':>10}")
    for name, model in models.items():
        model.eval()
        ids = torch.randint(0, b.vocab, (b.batch, b.prompt))
        seconds = {}
        for cache in (True, False):
            times = []
            for _ in range(b.rounds):
                begin = time.perf_counter()
                with torch.no_grad():
                    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=b.new_tokens,
                                   min_new_tokens=b.new_tokens, do_sample=False, use_cache=cache, pad_token_id=0)
                times.append(time.perf_counter() - begin)
            seconds[cache] = statistics.median(times)
        tokens = b.batch * b.new_tokens
        print(f"{name:<8} {tokens / seconds[True]:>14.1f} {tokens / seconds[False]:>14.1f} "
              f"{seconds[False] / seconds[True]:>9.1f}x")


if __name__ == "__main__":
    main()
