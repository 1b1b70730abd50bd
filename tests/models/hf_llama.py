#!/usr/bin/env python3
"""transformers' side of tests/models/test_llama.cpp (run through $LOOM_PYTHON).

  hf_llama.py make DIR
      Builds tiny random Llama-architecture models with transformers itself (seeded, nothing
      downloaded) and saves each with save_pretrained:
        llama          grouped-query attention (4 heads, 2 key/value heads), rope llama3, untied head
        llama_tied     tied embeddings, default rope, attention_bias and mlp_bias, head_dim 12 (not
                       hidden_size / heads)
        qwen2          Qwen2ForCausalLM (bias on q, k, v), tied, rope_theta 1e6
        qwen3          Qwen3ForCausalLM (RMSNorm on each head of q and k), head_dim 16, attention_bias
        mistral        MistralForCausalLM (sliding_window 64, longer than the inputs)
        mistral_window MistralForCausalLM with sliding_window 8: every layer's window binds
        qwen2_window   Qwen2ForCausalLM with use_sliding_window, sliding_window 8, max_window_layers 1
                       (layer 0 full attention, layer 1 sliding)
        llama_linear   rope_type linear, factor 4
        llama_yarn     rope_type yarn, factor 4, original_max_position_embeddings 32
        llama_dynamic  rope_type dynamic (NTK), factor 2, max_position_embeddings 16 < the 24-token inputs
        llama_longrope rope_type longrope, original_max_position_embeddings 16 < 24: the long factors
        qwen3_yarn     yarn with factor null (max_position_embeddings / original), beta_fast, mscale,
                       mscale_all_dim and truncate false
        phi3           Phi3ForCausalLM (qkv_proj and gate_up_proj fused), sliding_window 8
        phi3_longrope  Phi3ForCausalLM with longrope, original_max_position_embeddings 16 < 24
        phi3_partial   phi3_longrope with partial_rotary_factor 0.5 (Phi-4-mini's layout)
        gemma          GemmaForCausalLM ((1 + w) RMSNorm, embeddings times sqrt(hidden_size), GeGLU with
                       gelu_pytorch_tanh), head_dim 16, tied
        gemma2         Gemma2ForCausalLM, 3 layers (sliding, full, sliding) with sliding_window 8 < 24,
                       sandwich norms, query_pre_attn_scalar 24, attention and final logit soft-caps that
                       bind (1.0 and 5.0, initializer_range 0.2), eager attention (transformers' only
                       exact path for the cap)
        gemma3_text    Gemma3ForCausalLM, 3 layers (sliding_window_pattern 2: sliding, full, sliding),
                       sliding_window 8, q/k (1 + w) norms, a rope per layer type (full: linear, factor
                       4, theta 1e6; sliding: default, theta 100), sdpa
        mixtral        MixtralForCausalLM, 4 experts, top 2 (renormalized), sliding_window 16 < 24,
                       output_router_logits with router_aux_loss_coef 0.5 (the loss adds the
                       load-balancing loss), initializer_range 0.2 (routing far from ties)
        qwen3_moe      Qwen3MoeForCausalLM, 3 layers (layer 1 in mlp_only_layers: the dense MLP),
                       4 experts of moe_intermediate_size 32, top 2 not renormalized, q/k norms,
                       output_router_logits, router_aux_loss_coef 0.5
        llama_sharded  llama again, in shards with an index
        llama_bf16     llama saved in bfloat16
      and DIR/expected.safetensors: the inputs (labels with ignored tokens) and transformers'
      logits and loss for each (llama_bf16's read back in float32 by transformers); for the MoE
      folders also NAME_masked_loss (attention_mask 0 on row 2 from token 17: the auxiliary loss
      counts the tokens only) and NAME_aux_loss (the load-balancing loss alone, unmasked).

  hf_llama.py lora_make DIR
      (after make DIR) PEFT's LoRA on DIR/llama: r 4, alpha 8, q_proj, v_proj and down_proj,
      with B random (init_lora_weights=False), saved by PEFT to DIR/peft_adapter; the same on a
      tiny GPT-2 (DIR/gpt2, targets c_attn and c_proj: HF's Conv1D) to DIR/gpt2_peft_adapter; and
      DIR/lora_expected.safetensors: PeftModel's logits (lora_logits, gpt2_lora_logits). And a
      tiny BertForSequenceClassification (DIR/bert, 3 labels) with PEFT's sequence-classification
      adapter (task_type SEQ_CLS, PEFT's default BERT targets query and value, the classifier
      trained whole and perturbed) in DIR/bert_peft_adapter, its padded inputs (bert_input_ids,
      bert_attention_mask, bert_labels) and logits (bert_lora_logits).

  hf_llama.py lora_check BASE ADAPTER EXPECTED
      PeftModel.from_pretrained(BASE's model, ADAPTER) (an adapter loom saved): its logits on
      EXPECTED's input_ids (and attention_mask, when it holds one) must equal EXPECTED's
      loom_logits within 1e-5 relative. BASE is a causal LM, or a BERT classifier.

  hf_llama.py check NAME,FOLDER,INPUTS ...
      Opens FOLDER (written by loom) with AutoModelForCausalLM.from_pretrained, which must
      report no missing, unexpected or mismatched weights and be of NAME's class, runs it on
      INPUTS' inputs and prints the difference from INPUTS' NAME_logits. Exit status 0 when
      every group is within 1e-5 relative.
"""
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

import torch
from safetensors.torch import load_file, save_file

BASE = dict(vocab_size=100, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=128, bos_token_id=0, eos_token_id=1)
CLASSES = {"llama": "LlamaForCausalLM", "llama_tied": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "qwen3": "Qwen3ForCausalLM", "mistral_window": "MistralForCausalLM",
           "qwen2_window": "Qwen2ForCausalLM", "llama_linear": "LlamaForCausalLM", "llama_yarn": "LlamaForCausalLM",
           "qwen3_yarn": "Qwen3ForCausalLM", "llama_dynamic": "LlamaForCausalLM", "llama_longrope": "LlamaForCausalLM",
           "mistral": "MistralForCausalLM", "llama_sharded": "LlamaForCausalLM", "llama_bf16": "LlamaForCausalLM",
           "merged": "LlamaForCausalLM", "llama_seqcls": "LlamaForSequenceClassification",
           "qwen2_reward": "Qwen2ForSequenceClassification", "gpt2_seqcls": "GPT2ForSequenceClassification",
           "phi3": "Phi3ForCausalLM", "phi3_longrope": "Phi3ForCausalLM", "phi3_partial": "Phi3ForCausalLM",
           "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
           "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}
# The sparse MoE folders: their loss adds the load-balancing loss (output_router_logits).
MOE = ("mixtral", "qwen3_moe")
# Sequence classifiers (issue 39 point 1): their folders, and the labels each is checked with.
SEQCLS = {"llama_seqcls": "cls_labels", "qwen2_reward": "reward_labels", "gpt2_seqcls": "multi_labels"}


def configs():
    from transformers import (Gemma2Config, Gemma3TextConfig, GemmaConfig, LlamaConfig, MistralConfig, MixtralConfig,
                              Phi3Config, Qwen2Config, Qwen3Config, Qwen3MoeConfig)
    llama3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    return {
        "llama": LlamaConfig(**BASE, num_key_value_heads=2, rope_parameters=llama3),
        "llama_tied": LlamaConfig(**BASE, tie_word_embeddings=True, attention_bias=True, mlp_bias=True, head_dim=12),
        "qwen2": Qwen2Config(**BASE, num_key_value_heads=2, tie_word_embeddings=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        "qwen3": Qwen3Config(**BASE, num_key_value_heads=2, head_dim=16, attention_bias=True,
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
        "mistral": MistralConfig(**BASE, num_key_value_heads=1, sliding_window=64),
        "mistral_window": MistralConfig(**BASE, num_key_value_heads=2, sliding_window=8),
        "llama_linear": LlamaConfig(**BASE, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                             "factor": 4.0}),
        "llama_yarn": LlamaConfig(**BASE, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                           "original_max_position_embeddings": 32}),
        "llama_dynamic": LlamaConfig(**{**BASE, "max_position_embeddings": 16},
                                     rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
        "llama_longrope": LlamaConfig(**{**BASE, "max_position_embeddings": 64}, rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 16,
            "short_factor": [1.0, 1.1, 1.3, 1.7, 2.2, 3.0], "long_factor": [1.0, 1.5, 2.5, 4.0, 6.5, 9.0]}),
        "qwen3_yarn": Qwen3Config(**{**BASE, "max_position_embeddings": 256}, num_key_value_heads=2, head_dim=16,
                                  rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": None,
                                                   "original_max_position_embeddings": 64, "beta_fast": 16.0,
                                                   "mscale": 0.8, "mscale_all_dim": 0.6, "truncate": False}),
        "qwen2_window": Qwen2Config(**BASE, num_key_value_heads=2, use_sliding_window=True, sliding_window=8,
                                    max_window_layers=1),
        # Phi-3: q, k, v fused as qkv_proj and gate, up as gate_up_proj; a sliding window that binds.
        "phi3": Phi3Config(**BASE, num_key_value_heads=2, sliding_window=8, pad_token_id=None,
                           original_max_position_embeddings=128),
        # Phi-3's longrope: short factors up to original_max_position_embeddings, long beyond.
        "phi3_longrope": Phi3Config(**{**BASE, "max_position_embeddings": 64}, pad_token_id=None,
                                    original_max_position_embeddings=16, rope_parameters={
                                        "rope_type": "longrope", "rope_theta": 10000.0,
                                        "short_factor": [1.0, 1.1, 1.3, 1.7, 2.2, 3.0],
                                        "long_factor": [1.0, 1.5, 2.5, 4.0, 6.5, 9.0]}),
        # Phi-4-mini's layout: the rotary embedding turns half of each head (6 of 12 channels),
        # longrope past original_max_position_embeddings 16.
        "phi3_partial": Phi3Config(**{**BASE, "max_position_embeddings": 64}, num_key_value_heads=2,
                                   pad_token_id=None, original_max_position_embeddings=16, rope_parameters={
                                       "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                       "short_factor": [1.0, 1.2, 1.5], "long_factor": [1.0, 2.0, 4.0]}),
        # Gemma 1: (1 + w) norms, scaled embeddings, GeGLU; its norms drawn away from zero below.
        "gemma": GemmaConfig(**BASE, num_key_value_heads=2, head_dim=16, pad_token_id=None),
        # Gemma 2: soft-caps small enough to bend the scores and logits; the cap needs eager attention.
        "gemma2": Gemma2Config(**{**BASE, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=16,
                               pad_token_id=None, sliding_window=8, query_pre_attn_scalar=24,
                               attn_logit_softcapping=1.0, final_logit_softcapping=5.0, initializer_range=0.2,
                               attn_implementation="eager"),
        # Gemma 3: a rope per layer type, the sliding layers' window binding.
        "gemma3_text": Gemma3TextConfig(**{**BASE, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=16,
                                        pad_token_id=None, sliding_window=8, sliding_window_pattern=2,
                                        query_pre_attn_scalar=24, initializer_range=0.2, rope_parameters={
                                            "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                               "rope_theta": 1000000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
                                        attn_implementation="sdpa"),
        # Mixtral: every layer sparse, the window binding; the router's weights large enough
        # that no token's top 2 is a near tie.
        "mixtral": MixtralConfig(**BASE, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                 sliding_window=16, initializer_range=0.2, output_router_logits=True,
                                 router_aux_loss_coef=0.5),
        # Qwen3-MoE: a dense layer between two sparse ones, experts narrower than the dense MLP.
        "qwen3_moe": Qwen3MoeConfig(**{**BASE, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=16,
                                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    mlp_only_layers=[1], initializer_range=0.2, output_router_logits=True,
                                    router_aux_loss_coef=0.5),
    }


def seqcls_configs():
    from transformers import GPT2Config, LlamaConfig, Qwen2Config
    return {"llama_seqcls": LlamaConfig(**BASE, num_key_value_heads=2, pad_token_id=0, num_labels=3),
            "qwen2_reward": Qwen2Config(**BASE, num_key_value_heads=2, pad_token_id=0, num_labels=1),
            "gpt2_seqcls": GPT2Config(vocab_size=BASE["vocab_size"], n_positions=64, n_embd=48, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, pad_token_id=0, num_labels=2)}


def seqcls_inputs(t):
    """Rows of 20 tokens (never the padding id 0): row 1 and 2 padded on the right, row 3 on the
    left (its attention_mask keeps the tokens off the padding); 3-class ids and rewards."""
    ids = torch.randint(2, BASE["vocab_size"], (4, 20))
    ids[1, 14:] = 0
    ids[2, 9:] = 0
    ids[3, :5] = 0
    t["cls_input_ids"], t["cls_attention_mask"] = ids, (ids != 0).long()
    t["cls_labels"] = torch.tensor([2, 0, 1, 2])
    t["reward_labels"] = torch.tensor([0.5, -1.0, 2.0, 0.25])
    t["multi_labels"] = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 1.0]])


def run_seqcls(model, t, name):
    model.eval()
    with torch.no_grad():
        out = model(input_ids=t["cls_input_ids"], attention_mask=t["cls_attention_mask"], labels=t[SEQCLS[name]])
    return out.logits.float().contiguous(), out.loss.reshape(1).float().contiguous()


def run(model, t, name):
    if name in SEQCLS:
        return run_seqcls(model, t, name)
    model.eval()
    with torch.no_grad():
        out = model(input_ids=t["input_ids"], labels=t["labels"])
    return out.logits.float().contiguous(), out.loss.reshape(1).float().contiguous()


def perturbed(model):
    """transformers initializes norms to 1 and biases to 0: perturbed here so that they count."""
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight") or pname.endswith(".bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model


def make(folder):
    from transformers import AutoModelForCausalLM
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    t = {}
    ids = torch.randint(0, BASE["vocab_size"], (3, 24))
    labels = ids.clone()
    labels[0, :5] = -100  # a prompt that is not scored
    labels[2, 17:] = -100
    t["input_ids"], t["labels"] = ids, labels
    for name, config in configs().items():
        model = perturbed(AutoModelForCausalLM.from_config(config))
        model.save_pretrained(os.path.join(folder, name))
        t[f"{name}_logits"], t[f"{name}_loss"] = run(model, t, name)
        if name in MOE:
            mask = torch.ones_like(ids)
            mask[2, 17:] = 0
            t["attention_mask"] = mask
            with torch.no_grad():
                masked = model(input_ids=ids, attention_mask=mask, labels=labels)
                t[f"{name}_masked_loss"] = masked.loss.reshape(1).float().contiguous()
                t[f"{name}_aux_loss"] = model(input_ids=ids).aux_loss.reshape(1).float().contiguous()
        if name == "llama":
            model.save_pretrained(os.path.join(folder, "llama_sharded"), max_shard_size="40KB")
            model.to(torch.bfloat16).save_pretrained(os.path.join(folder, "llama_bf16"))
            back = AutoModelForCausalLM.from_pretrained(os.path.join(folder, "llama_bf16"), dtype=torch.float32)
            t["llama_bf16_logits"], t["llama_bf16_loss"] = run(back, t, "llama_bf16")
    t["llama_sharded_logits"], t["llama_sharded_loss"] = t["llama_logits"].clone(), t["llama_loss"].clone()
    from transformers import AutoModelForSequenceClassification
    seqcls_inputs(t)
    for name, config in seqcls_configs().items():
        model = perturbed(AutoModelForSequenceClassification.from_config(config))
        model.save_pretrained(os.path.join(folder, name))
        t[f"{name}_logits"], t[f"{name}_loss"] = run_seqcls(model, t, name)
    save_file(t, os.path.join(folder, "expected.safetensors"))
    shards = [f for f in os.listdir(os.path.join(folder, "llama_sharded")) if f.startswith("model-")]
    print(f"made {', '.join(CLASSES)} (llama sharded into {len(shards)} files)")


def lora_make(folder):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1)
    GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(os.path.join(folder, "gpt2"))
    t = load_file(os.path.join(folder, "expected.safetensors"))
    out = {"input_ids": t["input_ids"]}
    for base_name, targets, adapter, key in (("llama", ["q_proj", "v_proj", "down_proj"], "peft_adapter", "lora_logits"),
                                             ("gpt2", ["c_attn", "c_proj"], "gpt2_peft_adapter", "gpt2_lora_logits")):
        base = AutoModelForCausalLM.from_pretrained(os.path.join(folder, base_name))
        config = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0, init_lora_weights=False,
                            task_type="CAUSAL_LM")
        model = get_peft_model(base, config)
        model.save_pretrained(os.path.join(folder, adapter))
        model.eval()
        with torch.no_grad():
            out[key] = model(input_ids=t["input_ids"]).logits.float().contiguous()
    bert_lora_make(folder, out)
    save_file(out, os.path.join(folder, "lora_expected.safetensors"))
    print("made peft_adapter, gpt2_peft_adapter, bert_peft_adapter")


def bert_lora_make(folder, out):
    """PEFT's SEQ_CLS adapter on a tiny BERT classifier; its inputs and logits into `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(2)
    base = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                                    num_attention_heads=4, intermediate_size=64,
                                                    max_position_embeddings=32, num_labels=3))
    base.save_pretrained(os.path.join(folder, "bert"))
    ids = torch.randint(1, 100, (3, 20))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0
    mask[2, 9:] = 0
    out["bert_input_ids"], out["bert_attention_mask"] = ids * mask, mask
    out["bert_labels"] = torch.tensor([2, 0, 1])
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, init_lora_weights=False,
                                            task_type="SEQ_CLS"))
    with torch.no_grad():  # the head as training would leave it, so the adapter's copy counts
        for name, p in model.named_parameters():
            if ".classifier.modules_to_save." in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(os.path.join(folder, "bert_peft_adapter"))
    model.eval()
    with torch.no_grad():
        out["bert_lora_logits"] = model(input_ids=out["bert_input_ids"],
                                        attention_mask=out["bert_attention_mask"]).logits.contiguous()


def lora_check(base_folder, adapter, expected):
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification
    bert = AutoConfig.from_pretrained(base_folder).model_type == "bert"
    base = (AutoModelForSequenceClassification if bert else AutoModelForCausalLM).from_pretrained(base_folder)
    model = PeftModel.from_pretrained(base, adapter)
    model.eval()
    t = load_file(expected)
    with torch.no_grad():
        logits = model(input_ids=t["input_ids"], attention_mask=t.get("attention_mask")).logits.float()
    want = t["loom_logits"]
    rel = ((logits - want).abs().max() / want.abs().max()).item()
    print(f"peft on loom's adapter: logits {rel:.3g} relative")
    return 0 if rel <= 1e-5 else 1


def check(name, folder, inputs):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
    from transformers.utils import logging
    logging.disable_progress_bar()
    auto = AutoModelForSequenceClassification if name in SEQCLS else AutoModelForCausalLM
    model, info = auto.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"loading {folder}: {problems}")
        return 1
    if type(model).__name__ != CLASSES[name]:
        print(f"{folder} opened as {type(model).__name__}, not {CLASSES[name]}")
        return 1
    t = load_file(inputs)
    logits, loss = run(model, t, name)
    want = t[f"{name}_logits"]
    rel = ((logits - want).abs().max() / want.abs().max()).item()
    loss_rel = ((loss - t[f"{name}_loss"]).abs() / t[f"{name}_loss"].abs()).item()
    print(f"{name}: logits {rel:.3g} relative, loss {loss_rel:.3g} relative ({type(model).__name__})")
    return 0 if rel <= 1e-5 and loss_rel <= 1e-5 else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "lora_make":
        lora_make(sys.argv[2])
        return 0
    if len(sys.argv) == 5 and sys.argv[1] == "lora_check":
        return lora_check(sys.argv[2], sys.argv[3], sys.argv[4])
    if len(sys.argv) > 2 and sys.argv[1] == "check":
        failed = 0
        for group in sys.argv[2:]:
            name, folder, inputs = group.split(",")
            if check(name, folder, inputs) != 0:
                print(f"FAILED {name} ({folder})")
                failed += 1
        return 1 if failed else 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
