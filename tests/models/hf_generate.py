#!/usr/bin/env python3
"""transformers' side of tests/models/test_generate.cpp (run through $LOOM_PYTHON).

  hf_generate.py make DIR
      Builds three tiny random causal LMs with transformers itself (seeded, nothing downloaded)
      and saves each with save_pretrained:
        gpt2    GPT2LMHeadModel (tied head), no eos/bos in the config
        llama   LlamaForCausalLM with grouped-query attention (4 heads, 2 key/value heads)
        qwen3   Qwen3ForCausalLM (q/k RMSNorm per head, perturbed from 1), head_dim 16
        mistral MistralForCausalLM with sliding_window 5: the prompt and the new tokens pass it
        phi3    Phi3ForCausalLM (qkv_proj, gate_up_proj fused) with sliding_window 6
        gemma   GemmaForCausalLM ((1 + w) norms, scaled embeddings, GeGLU), tied
        gemma2  Gemma2ForCausalLM, 3 layers alternating sliding (window 5) and full, soft-caps that
                bind (attention 1.0, logits 5.0), eager attention
        gemma3_text  Gemma3ForCausalLM, 3 layers (sliding_window_pattern 2, window 5), a rope per
                layer type (full: linear, factor 2), sdpa
        mixtral MixtralForCausalLM, 4 experts, top 2, sliding_window 5
        qwen3_moe  Qwen3MoeForCausalLM, 3 layers (layer 1 dense: mlp_only_layers), 4 experts of
                width 32, top 2, norm_topk_prob
      then runs transformers' greedy generate (do_sample=False, the default DynamicCache) on
      fixed prompts and writes DIR/expected.safetensors:
        PREFIX_single_ids / _out       one prompt of 7 tokens, 12 new tokens
        PREFIX_batch_ids / _mask / _out  three prompts of 7, 4 and 2 tokens, left-padded with
                                       the pad id 0 (attention_mask 0 there), 12 new tokens
        PREFIX_eos / PREFIX_eos_out    the same batch with eos ids taken from what the first
                                       run generated (one for gpt2, two for the others), so rows
                                       stop early and then emit pad 0
      and the sampling warpers on fixed scores: warp_scores (float [3, 100]) and warped
      (LogitsProcessorList of TemperatureLogitsWarper(0.7), TopKLogitsWarper(10),
      TopPLogitsWarper(0.8), HF's order).
"""
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore")

import torch
from safetensors.torch import save_file

NEW_TOKENS = 12
PAD = 0


def models():
    from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, GemmaConfig,
                              GemmaForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                              MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Phi3Config,
                              Phi3ForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      initializer_range=0.2, bos_token_id=None, eos_token_id=None,
                                      attn_implementation="sdpa"))
    torch.manual_seed(1)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         initializer_range=0.2, bos_token_id=None, eos_token_id=None,
                                         attn_implementation="sdpa"))
    torch.manual_seed(2)
    qwen3 = Qwen3ForCausalLM(Qwen3Config(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=64, initializer_range=0.2, bos_token_id=None,
                                         eos_token_id=None, attn_implementation="sdpa"))
    with torch.no_grad():  # the q/k norms start at 1: perturbed, so that they count
        for pname, p in qwen3.named_parameters():
            if pname.endswith("q_norm.weight") or pname.endswith("k_norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    torch.manual_seed(3)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=101, hidden_size=48, intermediate_size=96,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               sliding_window=5, max_position_embeddings=64, initializer_range=0.2,
                                               bos_token_id=None, eos_token_id=None, attn_implementation="sdpa"))
    torch.manual_seed(4)
    phi3 = Phi3ForCausalLM(Phi3Config(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, sliding_window=6,
                                      max_position_embeddings=64, original_max_position_embeddings=64,
                                      initializer_range=0.2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                      attn_implementation="sdpa"))
    torch.manual_seed(5)
    gemma = GemmaForCausalLM(GemmaConfig(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                         max_position_embeddings=64, initializer_range=0.2, bos_token_id=None,
                                         eos_token_id=None, pad_token_id=None, attn_implementation="sdpa"))
    with torch.no_grad():  # Gemma's norms start at 0 (a factor of 1): perturbed, so that they count
        for pname, p in gemma.named_parameters():
            if pname.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    gemma_sizes = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=64, initializer_range=0.2,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None, sliding_window=5,
                       query_pre_attn_scalar=24)
    torch.manual_seed(6)
    gemma2 = Gemma2ForCausalLM(Gemma2Config(**gemma_sizes, attn_logit_softcapping=1.0, final_logit_softcapping=5.0,
                                            attn_implementation="eager"))
    torch.manual_seed(7)
    gemma3 = Gemma3ForCausalLM(Gemma3TextConfig(**gemma_sizes, sliding_window_pattern=2, rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, attn_implementation="sdpa"))
    with torch.no_grad():  # their norms (q/k norms too) start at 0 as Gemma's: perturbed
        for model in (gemma2, gemma3):
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.add_(0.3 * torch.randn_like(p))
    moe_sizes = dict(vocab_size=101, hidden_size=48, intermediate_size=96, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, bos_token_id=None,
                     eos_token_id=None, attn_implementation="sdpa")
    torch.manual_seed(8)
    mixtral = MixtralForCausalLM(MixtralConfig(**moe_sizes, num_hidden_layers=2, num_local_experts=4,
                                               num_experts_per_tok=2, sliding_window=5))
    torch.manual_seed(9)
    qwen3_moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(**moe_sizes, num_hidden_layers=3, head_dim=16, num_experts=4,
                                                   num_experts_per_tok=2, moe_intermediate_size=32,
                                                   mlp_only_layers=[1], norm_topk_prob=True))
    return {"gpt2": gpt2, "llama": llama, "qwen3": qwen3, "mistral": mistral, "phi3": phi3, "gemma": gemma,
            "gemma2": gemma2, "gemma3_text": gemma3, "mixtral": mixtral, "qwen3_moe": qwen3_moe}


def prompts(vocab):
    g = torch.Generator().manual_seed(7)
    single = torch.randint(1, vocab, (1, 7), generator=g)
    lengths = [7, 4, 2]
    ids = torch.full((3, 7), PAD, dtype=torch.long)
    mask = torch.zeros((3, 7), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, 7 - n:] = torch.randint(1, vocab, (n,), generator=g)
        mask[row, 7 - n:] = 1
    return single, ids, mask


def greedy(model, ids, mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=PAD, **kwargs)


def make(folder):
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    os.makedirs(folder, exist_ok=True)
    t = {}
    for name, model in models().items():
        model.eval()
        model.save_pretrained(os.path.join(folder, name))
        single, ids, mask = prompts(model.config.vocab_size)
        t[name + "_single_ids"] = single
        t[name + "_single_out"] = greedy(model, single, torch.ones_like(single))
        t[name + "_batch_ids"] = ids
        t[name + "_batch_mask"] = mask
        out = greedy(model, ids, mask)
        t[name + "_batch_out"] = out
        # eos ids the rows meet: gpt2, row 1's 3rd generated token; the others, row 0's 4th and row 2's 7th.
        eos = [int(out[1, 7 + 2])] if name == "gpt2" else [int(out[0, 7 + 3]), int(out[2, 7 + 6])]
        eos = sorted(set(eos) - {PAD})
        t[name + "_eos"] = torch.tensor(eos, dtype=torch.long)
        t[name + "_eos_out"] = greedy(model, ids, mask, eos_token_id=eos if len(eos) > 1 else eos[0])
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 100, generator=g) * 3
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.8)])
    t["warp_scores"] = scores
    t["warped"] = warpers(None, scores.clone())
    save_file({k: v.contiguous() for k, v in t.items()}, os.path.join(folder, "expected.safetensors"))
    print("made generate")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        sys.exit(__doc__)
