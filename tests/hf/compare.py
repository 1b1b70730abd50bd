#!/usr/bin/env python3
"""loom against transformers.Trainer, bit for bit (issue 14; docs/semantics.md, "Identical to HF").

For each configuration below, the same command line runs transformers.Trainer (in this
process) and loom (tests/hf/peer.cpp, built as hf_peer) on the same model, data and initial
weights, on the CPU in fp32 with one thread. Then it compares:
  - log_history, entry by entry: every key and value but timings, bit for bit (loss,
    grad_norm, learning_rate, epoch, step, eval_accuracy ...); eval_loss within EVAL_LOSS_RTOL
    (HF averages the repeated per-batch losses in float32 with numpy, loom in double);
  - trainer_state.json: every other key, exactly;
  - train_results.json, eval_results.json, all_results.json: the same keys, the same values
    (timings excepted, eval_loss as above);
  - the final weights: every tensor bit for bit.

  compare.py --peer build/tests/hf_peer --work /tmp/hf [--only NAME] [--ranks 2] [--models]

--ranks 2 runs the DDP configurations under torchrun (gloo) on both sides instead.
--models runs the transformer configurations instead (MODEL_CONFIGS): tiny random
GPT2LMHeadModel, BertForSequenceClassification and Llama-architecture folders (every family
loom/models/llama.hpp reads: Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma, Gemma 2, Gemma 3 text,
Mixtral, Qwen3-MoE) saved by transformers, trained by the unmodified transformers.Trainer and
by loom's models (loom/models/) with the same command line.
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the Hub

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

FEATURES, HIDDEN, CLASSES = 8, 16, 3
EVAL_LOSS_RTOL = 1e-6
TIMINGS = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "eval_runtime",
           "eval_samples_per_second", "eval_steps_per_second"}

COMMON = ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--logging_steps", "1",
          "--seed", "7", "--save_strategy", "no", "--use_cpu", "true"]

# name -> (training examples, flags)
CONFIGS = {
    "adamw_fused_warmup_linear_clip": (96, [
        "--optim", "adamw_torch_fused", "--learning_rate", "3e-3", "--lr_scheduler_type", "linear",
        "--warmup_steps", "3", "--max_grad_norm", "1.0", "--num_train_epochs", "2", "--eval_strategy", "epoch"]),
    "adamw_cosine_decay_accumulation": (96, [
        "--optim", "adamw_torch", "--learning_rate", "5e-3", "--lr_scheduler_type", "cosine",
        "--weight_decay", "0.1", "--warmup_steps", "0.1", "--gradient_accumulation_steps", "3",
        "--max_grad_norm", "0.5", "--num_train_epochs", "3", "--eval_strategy", "epoch"]),
    "adamw_fused_no_clipping": (96, [
        "--optim", "adamw_torch_fused", "--learning_rate", "2e-3", "--lr_scheduler_type", "linear",
        "--weight_decay", "0.01", "--max_grad_norm", "0", "--num_train_epochs", "2", "--eval_strategy", "epoch"]),
    "sgd_no_evaluation": (96, [
        "--optim", "sgd", "--learning_rate", "0.05", "--lr_scheduler_type", "constant", "--weight_decay", "0.01",
        "--max_grad_norm", "1.0", "--num_train_epochs", "2"]),
    "partial_batch_log_every_4_eval_steps": (100, [
        "--optim", "adamw_torch", "--learning_rate", "3e-3", "--lr_scheduler_type", "cosine", "--logging_steps", "4",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--num_train_epochs", "2",
        "--eval_strategy", "steps", "--eval_steps", "5"]),
    "checkpoints_best_model_at_end": (96, [
        "--optim", "adamw_torch_fused", "--learning_rate", "3e-3", "--lr_scheduler_type", "linear",
        "--max_grad_norm", "1.0", "--num_train_epochs", "2", "--eval_strategy", "steps", "--eval_steps", "5",
        "--save_strategy", "steps", "--save_steps", "10", "--load_best_model_at_end", "true",
        "--metric_for_best_model", "accuracy", "--save_total_limit", "2"]),
    "resume_from_checkpoint_10": (96, [
        "--optim", "adamw_torch", "--learning_rate", "3e-3", "--lr_scheduler_type", "cosine", "--weight_decay", "0.05",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--num_train_epochs", "3",
        "--eval_strategy", "epoch", "--save_strategy", "steps", "--save_steps", "10",
        "--restore_callback_states_from_checkpoint", "true"]),
    # The same, resumed with ignore_data_skip: the resumed epoch starts again at its first batch.
    "resume_ignore_data_skip_10": (96, [
        "--optim", "adamw_torch", "--learning_rate", "3e-3", "--lr_scheduler_type", "cosine", "--weight_decay", "0.05",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--num_train_epochs", "3",
        "--eval_strategy", "epoch", "--save_strategy", "steps", "--save_steps", "10", "--ignore_data_skip", "true"]),
}
# The transformer configurations (--models): name -> (model, training sequences, flags).
# Dropout is 0 in the saved configs (transformers and loom draw different masks). One
# micro-batch per step: with accumulation transformers divides a model's own mean loss by
# nothing when the model's forward takes **kwargs (BERT's does), which loom does not copy.
MODEL_CONFIGS = {
    "gpt2_adamw_cosine_clip": ("gpt2", 40, [
        "--optim", "adamw_torch", "--learning_rate", "3e-3", "--lr_scheduler_type", "cosine", "--warmup_steps", "2",
        "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "4",
        "--num_train_epochs", "1", "--eval_strategy", "epoch"]),
    "gpt2_accumulation_2": ("gpt2", 40, [
        "--optim", "adamw_torch_fused", "--learning_rate", "2e-3", "--lr_scheduler_type", "linear",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "0.5", "--per_device_train_batch_size", "4",
        "--num_train_epochs", "2", "--eval_strategy", "epoch"]),
    # The Llama architecture: grouped-query attention, llama3 rope, untied head. transformers
    # counts the shifted labels itself for LlamaForCausalLM (its loss_type is ForCausalLM), so
    # position 0 stays a label here.
    "llama_adamw_cosine_clip": ("llama", 40, [
        "--optim", "adamw_torch", "--learning_rate", "3e-3", "--lr_scheduler_type", "cosine", "--warmup_steps", "2",
        "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "4",
        "--num_train_epochs", "1", "--eval_strategy", "epoch"]),
    # Prompt-masked sequences (labels -100 before a random point, as instruction data): the
    # ranks hold different numbers of scored tokens, so HF's average_tokens_across_devices
    # decides how their gradients weigh (DDP_MODEL_CONFIGS runs both settings).
    "llama_masked_accumulation_2": ("llama:masked", 40, [
        "--optim", "adamw_torch_fused", "--learning_rate", "3e-3", "--lr_scheduler_type", "linear",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "2",
        "--num_train_epochs", "1", "--eval_strategy", "epoch"]),
    "llama_masked_local_average": ("llama:masked", 40, [
        "--optim", "adamw_torch_fused", "--learning_rate", "3e-3", "--lr_scheduler_type", "linear",
        "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "2",
        "--num_train_epochs", "1", "--eval_strategy", "epoch", "--average_tokens_across_devices", "false"]),
    "bert_adamw_linear_padding": ("bert", 40, [
        "--optim", "adamw_torch_fused", "--learning_rate", "2e-3", "--lr_scheduler_type", "linear",
        "--weight_decay", "0.01", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "4",
        "--num_train_epochs", "1", "--eval_strategy", "epoch"]),
}
GPT2 = dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
BERT = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=3)
SEQ = 16
# The other families of loom/models/llama.hpp, each a tiny random folder transformers makes from
# FAMILY_BASE and its own keys (transformers' defaults otherwise; no pad_token_id, so no
# embedding row is frozen as padding): grouped-query attention everywhere, sliding windows
# that bind on the 16-token rows (Mistral, Phi-3, Gemma 2, Gemma 3, Mixtral), Qwen3's q/k norms,
# Phi-3's fused projections, Gemma's (1 + w) norms and scaled embeddings, Gemma 2's soft-caps
# (transformers' eager attention, the only one that caps), Gemma 3's rope per layer type, and the
# two sparse MoE families with output_router_logits (the loss adds router_aux_loss_coef times
# the load-balancing loss, masked by the attention_mask).
FAMILY_BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=32, bos_token_id=0, eos_token_id=0,
                   pad_token_id=None)
FAMILIES = {
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(head_dim=16, attention_bias=True),
    "mistral": dict(sliding_window=8),
    "phi3": dict(sliding_window=8, original_max_position_embeddings=32),
    "gemma": dict(head_dim=16),
    "gemma2": dict(num_hidden_layers=3, head_dim=16, sliding_window=8, query_pre_attn_scalar=24,
                   attn_logit_softcapping=1.0, final_logit_softcapping=5.0, initializer_range=0.2),
    "gemma3_text": dict(num_hidden_layers=3, head_dim=16, sliding_window=8, sliding_window_pattern=2,
                        query_pre_attn_scalar=24),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=8, output_router_logits=True,
                    router_aux_loss_coef=0.5),
    "qwen3_moe": dict(num_hidden_layers=3, head_dim=16, num_experts=4, num_experts_per_tok=2,
                      moe_intermediate_size=32, mlp_only_layers=[1], output_router_logits=True,
                      router_aux_loss_coef=0.5),
}


def family_attention(model):
    """transformers' attention for a family: eager for Gemma 2 (its sdpa refuses the soft-cap), else sdpa."""
    return "eager" if model == "gemma2" else "sdpa"


# Each family trains on instruction-like rows (prompt-masked) with gradient accumulation 2: micro-batches of unequal token counts, whose
# loss transformers' causal LMs divide by the group's count (num_items_in_batch).
FAMILY_FLAGS = [
    "--optim", "adamw_torch_fused", "--learning_rate", "3e-3", "--lr_scheduler_type", "linear",
    "--gradient_accumulation_steps", "2", "--max_grad_norm", "1.0", "--per_device_train_batch_size", "2",
    "--num_train_epochs", "1", "--eval_strategy", "epoch"]
MODEL_CONFIGS.update({f"{family}_sft_accumulation_2": (f"{family}:masked", 40, FAMILY_FLAGS) for family in FAMILIES})
# The sparse MoE families, whose experts transformers 5.23 fuses at load (3-d
# experts.gate_up_proj / down_proj in memory, per-expert tensors in the files): their final
# weights are compared as save_pretrained writes them, by the files' names, which loom keeps.
SAVED_BY_FILE_NAMES = {"mixtral", "qwen3_moe"}
# LoRA on Llama: transformers.Trainer trains a peft PeftModel (LoraConfig with PEFT's default
# targets for Llama, q_proj and v_proj; r 8, alpha 16, dropout 0), loom its own adapter
# (loom/peft/) read from the folder peft saved before training (--lora_adapter), so both start
# from the same A and B. The final weights compared are the two adapter_model.safetensors.
MODEL_CONFIGS["llama_lora_sft_accumulation_2"] = ("llama:masked:lora", 40, FAMILY_FLAGS)
LORA = dict(r=8, lora_alpha=16, lora_dropout=0.0)
# Right-padded instruction rows with an attention_mask (a collator's output: the padding's labels
# -100, its keys masked in attention and in the MoE load-balancing loss): Llama, Mixtral (MoE,
# sliding window) and Gemma 2 (eager attention). One micro-batch of step 8 scores a single
# token, where an LM head product over the scored rows alone rounds otherwise than
# transformers' over every position (so loom's reference kernels multiply every position).
# The other families matched padded too when tried; three keep hf.models' time down.
MODEL_CONFIGS.update({f"{family}_padded_accumulation_2": (f"{family}:masked:padded", 40, FAMILY_FLAGS)
                      for family in ("llama", "mixtral", "gemma2")})
# The transformer configurations run with --ranks 2 (transformers.Trainer under DDP; loom
# under --loom_sharding). Not BERT: under DDP transformers.Trainer multiplies the loss by the
# number of processes for a model whose forward takes **kwargs (it assumes the model divided
# by num_items_in_batch, which BertForSequenceClassification ignores), so its gradients are
# twice the true ones. Not total_flos: transformers sums it over the ranks, loom's Trainer
# reports one rank's (a difference of the Trainer, left to it).
DDP_MODEL_CONFIGS = ["gpt2_adamw_cosine_clip", "gpt2_accumulation_2", "llama_adamw_cosine_clip",
                     "llama_masked_accumulation_2", "llama_masked_local_average"]
# Configurations whose point shows only with several ranks (not run at one), and those not
# run against loom's FullShard (the item weighting they check is the engines' shared code,
# which hf.models_ddp covers; the test suite's multi-process chain is its longest part).
DDP_ONLY = {"llama_masked_local_average"}
NOT_FULL_SHARD = {"llama_masked_accumulation_2", "llama_masked_local_average"}
# Configurations compared within a tolerance of their own, and why. With micro-batches of
# unequal token counts the two sides round differently: transformers' model divides the
# micro-batch's summed loss by the group's count, loom's Trainer divides the model's mean by
# (group count / micro-batch count), and under DDP scales each rank's gradient by its share
# where transformers multiplies the loss by the ranks and DDP averages. Measured: 4.1e-7 of
# the weights at one rank, 5.0e-6 at two (Adam's normalization amplifies the last bits); the
# two settings of average_tokens_across_devices end 0.18 apart, so 1e-5 tells them apart.
OWN_TOLERANCE = {"llama_masked_accumulation_2": 1e-5, "llama_masked_local_average": 1e-5}
DDP_MODEL_SKIP = {"total_flos"}

# Configurations whose run is repeated from one of its checkpoints on both sides (HF's
# train(resume_from_checkpoint=...), loom's --resume_from_checkpoint), then compared again.
RESUME = {"resume_from_checkpoint_10": "checkpoint-10", "resume_ignore_data_skip_10": "checkpoint-10"}
# Resumed runs that train other batches than the uninterrupted one (so their train_loss differs).
RESUME_OTHER_DATA = {"resume_ignore_data_skip_10"}
# The configurations run with --ranks 2 (DDP on both sides), and their own flags: an eval
# batch that splits the 40 evaluation rows evenly over the ranks (otherwise accelerate pads
# the last round with repeated rows and HF's eval_loss includes their losses; loom's does not).
DDP_CONFIGS = ["adamw_fused_warmup_linear_clip", "adamw_cosine_decay_accumulation"]
DDP_FLAGS = ["--per_device_eval_batch_size", "10"]


class Net(nn.Module):
    """fc1 -> LayerNorm -> ReLU -> fc2, as NetImpl in peer.cpp."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x, labels=None):
        logits = self.fc2(torch.relu(self.norm(self.fc1(x))))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class Rows(torch.utils.data.Dataset):
    """The rows of `split`_* tensors of a data file, as {name: row} (x/labels, input_ids/...)."""

    def __init__(self, data, split):
        self.columns = {k[len(split) + 1:]: v for k, v in data.items() if k.startswith(split + "_")}

    def __len__(self):
        return len(next(iter(self.columns.values())))

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.columns.items()}


def accuracy(p):
    return {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).sum()) / len(p.label_ids)}


def merge(common, flags):
    """common's flag/value pairs, those in `flags` replacing them (loom refuses a flag given twice)."""
    pairs = dict(zip(common[::2], common[1::2]))
    pairs.update(zip(flags[::2], flags[1::2]))
    return [x for pair in pairs.items() for x in pair]


def make_model_inputs(work, model, n_train, masked=False, padded=False, lora=False):
    """A tiny random HF folder saved by transformers, and token data, from fixed seeds: causal
    LM sequences (labels = inputs; `masked`: -100 before a random point of each row, a prompt;
    `padded`: right-padded rows with an attention_mask), or padded BERT sequences with 3 classes.
    `lora`: also a LoRA adapter folder `adapter`, peft's fresh one (LORA) on that model."""
    from transformers import (AutoConfig, AutoModelForCausalLM, BertConfig, BertForSequenceClassification, GPT2Config,
                              GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM)
    folder = os.path.join(work, f"inputs-{model}-{n_train}" + ("-masked" if masked else "") +
                          ("-padded" if padded else "") + ("-lora" if lora else ""))
    gen = torch.Generator().manual_seed(1234)
    n = n_train + 16
    data = {}
    if model != "bert":
        # A learnable pattern: each sequence counts up from a random start, modulo the vocabulary.
        start = torch.randint(0, GPT2["vocab_size"], (n, 1), generator=gen)
        ids = (start + torch.arange(SEQ)) % GPT2["vocab_size"]
        cols = {"input_ids": ids, "labels": ids.clone()}
        if model == "gpt2":
            # Position 0 is never a target (the loss shifts by one). transformers 5.23 leaves
            # GPT-2's loss_type unset, so its Trainer counts every label of a row in
            # num_items_in_batch, position 0 included, where it counts labels[..., 1:] for the
            # ForCausalLM loss types (docs/semantics.md, "Loss normalization"): with -100 there
            # both counts are the predicted tokens, loom's count.
            cols["labels"][:, 0] = -100
        if masked:
            prompt = torch.randint(1, SEQ - 2, (n, 1), generator=gen)
            cols["labels"] = ids.masked_fill(torch.arange(SEQ) < prompt, -100)
        if padded:
            # Instruction rows right-padded with token 0 from a random length (at least 8): the
            # padding's labels are -100 and its attention_mask 0 (a collator's output).
            lengths = torch.randint(8, SEQ + 1, (n, 1), generator=gen)
            real = torch.arange(SEQ) < lengths
            cols["input_ids"] = ids.masked_fill(~real, 0)
            cols["labels"] = cols["labels"].masked_fill(~real, -100)
            cols["attention_mask"] = real.long()
    else:
        ids = torch.randint(1, BERT["vocab_size"], (n, SEQ), generator=gen)
        lengths = torch.randint(4, SEQ + 1, (n,), generator=gen)
        mask = (torch.arange(SEQ) < lengths[:, None]).long()
        ids = ids * mask  # pad_token_id 0
        cols = {"input_ids": ids, "attention_mask": mask, "labels": ids[:, 0] % BERT["num_labels"]}
    for k, v in cols.items():
        data[f"train_{k}"], data[f"eval_{k}"] = v[:n_train].contiguous(), v[n_train:].contiguous()
    os.makedirs(folder, exist_ok=True)
    save_file(data, os.path.join(folder, "data.safetensors"))
    torch.manual_seed(0)
    if model == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(**GPT2))
    elif model == "llama":
        hf = LlamaForCausalLM(LlamaConfig(**LLAMA))
    elif model in FAMILIES:
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model, **{**FAMILY_BASE, **FAMILIES[model]}),
                                              attn_implementation=family_attention(model))
    else:
        hf = BertForSequenceClassification(BertConfig(**BERT))
    hf.save_pretrained(os.path.join(folder, "init"))
    if lora:
        from peft import LoraConfig, get_peft_model
        get_peft_model(hf, LoraConfig(task_type="CAUSAL_LM", **LORA)).save_pretrained(os.path.join(folder, "adapter"))
    return folder


def lora_adapter(inputs):
    """The inputs' LoRA adapter folder (make_model_inputs' `lora`), or None."""
    folder = os.path.join(inputs, "adapter")
    return folder if os.path.isdir(folder) else None


def hf_model(model, inputs):
    """The model compare.py trains: Net, or the HF folder's model."""
    init = os.path.join(inputs, "init")
    if model == "gpt2":
        from transformers import GPT2LMHeadModel
        return GPT2LMHeadModel.from_pretrained(init)
    if model == "llama":
        from transformers import LlamaForCausalLM
        base = LlamaForCausalLM.from_pretrained(init)
        if lora_adapter(inputs):
            from peft import PeftModel
            return PeftModel.from_pretrained(base, lora_adapter(inputs), is_trainable=True)
        return base
    if model in FAMILIES:
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM.from_pretrained(init, attn_implementation=family_attention(model))
    if model == "bert":
        from transformers import BertForSequenceClassification
        return BertForSequenceClassification.from_pretrained(init)
    net = Net()
    net.load_state_dict(load_file(os.path.join(init, "model.safetensors")))
    return net


def make_inputs(work, n_train):
    """Data (a noisy linear 3-class problem) and initial weights, both from fixed seeds."""
    folder = os.path.join(work, f"inputs-{n_train}")
    os.makedirs(os.path.join(folder, "init"), exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    w = torch.randn(FEATURES, CLASSES, generator=gen)
    x = torch.randn(n_train + 40, FEATURES, generator=gen)
    labels = (x @ w + 0.5 * torch.randn(n_train + 40, CLASSES, generator=gen)).argmax(1)
    save_file({"train_x": x[:n_train].contiguous(), "train_labels": labels[:n_train].contiguous(),
               "eval_x": x[n_train:].contiguous(), "eval_labels": labels[n_train:].contiguous()},
              os.path.join(folder, "data.safetensors"))
    torch.manual_seed(0)
    save_file(Net().state_dict(), os.path.join(folder, "init", "model.safetensors"))
    return folder


def run_hf(flags, inputs, out, model_kind="net"):
    """transformers.Trainer on `flags`, writing what loom's peer writes."""
    from transformers import HfArgumentParser, Trainer, TrainingArguments

    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        flags + ["--output_dir", out, "--report_to", "none"])
    data = load_file(os.path.join(inputs, "data.safetensors"))
    model = hf_model(model_kind, inputs)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(data, "train"), eval_dataset=Rows(data, "eval"),
                      compute_metrics=accuracy if model_kind in ("net", "bert") else None)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "hf.log"), "w") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        # loom's train() writes these two itself (as HF's run_*.py examples do after train()).
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()
        trainer.save_metrics("eval", trainer.evaluate())
    if trainer.is_world_process_zero() and lora_adapter(inputs):
        # A PeftModel's save_model writes its adapter (adapter_model.safetensors) alone.
        trainer.save_model(os.path.join(out, "final-adapter"))
        shutil.copyfile(os.path.join(out, "final-adapter", "adapter_model.safetensors"),
                        os.path.join(out, "final.safetensors"))
    elif trainer.is_world_process_zero() and model_kind in SAVED_BY_FILE_NAMES:
        model.save_pretrained(os.path.join(out, "final-model"))
        shutil.copyfile(os.path.join(out, "final-model", "model.safetensors"), os.path.join(out, "final.safetensors"))
    elif trainer.is_world_process_zero():
        # named_parameters: a tied weight (GPT-2's lm_head) once, under its first name.
        save_file({k: v.detach().contiguous() for k, v in model.named_parameters()},
                  os.path.join(out, "final.safetensors"))


# The tests' warm Python when this runs under it (tests/warm_python.py), else None.
WARM_PYTHON = os.environ.get("LOOM_WARM_PYTHON_CLIENT")


def torchrun():
    """torchrun's command: on the warm Python when there is one."""
    if WARM_PYTHON:
        return [WARM_PYTHON, "-m", "torch.distributed.run"]
    return [os.path.join(os.path.dirname(sys.executable), "torchrun")]


def run_loom(peer, flags, inputs, out, ranks, model_kind="net", sharding="ddp"):
    cmd = [peer] + flags + ["--data_file", os.path.join(inputs, "data.safetensors"), "--model_name_or_path",
                            os.path.join(inputs, "init"), "--weights_out", os.path.join(out, "final.safetensors"),
                            "--output_dir", out, "--model", "llama" if model_kind in FAMILIES else model_kind]
    if model_kind != "net" and lora_adapter(inputs):
        cmd += ["--lora_adapter", lora_adapter(inputs)]
    if ranks > 1:
        cmd = torchrun() + ["--standalone", f"--nproc_per_node={ranks}", "--no-python"] + cmd + ["--sharding", sharding]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"hf_peer failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


def run_hf_ranks(jobs, work, ranks):
    """HF under torchrun: this script re-entered with --hf-worker, once for every job (a list of
    [flags, inputs, out, model_kind]), so that each rank imports transformers once rather than
    once a configuration (about 10 s a process on a 2-core machine)."""
    jobs_file = os.path.join(work, "hf_jobs.json")
    with open(jobs_file, "w") as f:
        json.dump(jobs, f)
    # Each rank's Python: the warm one too, when there is one (torchrun --no-python runs it).
    program = ["--no-python", WARM_PYTHON] if WARM_PYTHON else []
    cmd = torchrun() + ["--standalone", f"--nproc_per_node={ranks}"] + program + [os.path.abspath(__file__),
                                                                                "--hf-worker", jobs_file]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"HF under torchrun failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")


class Report:
    def __init__(self, skip=()):
        self.skip = set(skip) | TIMINGS  # keys not compared
        self.problems = []
        self.worst = 0.0            # largest relative difference of any other value or weight
        self.worst_eval_loss = 0.0  # ... of eval_loss

    def value(self, where, hf, lm, rtol=0.0):
        if isinstance(hf, float) or isinstance(lm, float):
            if hf is None or lm is None:
                self.problems.append(f"{where}: HF {hf!r}, loom {lm!r}")
                return
            if math.isnan(hf) and math.isnan(lm):
                return
            rel = abs(hf - lm) / max(abs(hf), 1e-30)
            if where.endswith("eval_loss]"):
                self.worst_eval_loss = max(self.worst_eval_loss, rel)
            else:
                self.worst = max(self.worst, rel)
            if hf != lm and rel > rtol:
                self.problems.append(f"{where}: HF {hf!r}, loom {lm!r} (relative {rel:.3g})")
        elif hf != lm:
            self.problems.append(f"{where}: HF {hf!r}, loom {lm!r}")

    def metrics(self, where, hf, lm, rtol):
        hk, lk = set(hf) - self.skip, set(lm) - self.skip
        if hk != lk:
            self.problems.append(f"{where}: keys only in HF {sorted(hk - lk)}, only in loom {sorted(lk - hk)}")
        for k in sorted(hk & lk):
            self.value(f"{where}[{k}]", hf[k], lm[k], rtol(k))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def compare_state(report, where, hf_file, loom_file, rtol):
    """Two trainer_state.json files: log_history entry by entry, then every other key."""
    hs, ls = read_json(hf_file), read_json(loom_file)
    hl, ll = hs.pop("log_history"), ls.pop("log_history")
    if len(hl) != len(ll):
        report.problems.append(f"{where} log_history: HF {len(hl)} entries, loom {len(ll)}")
    for i, (h, l) in enumerate(zip(hl, ll)):
        report.metrics(f"{where} log_history[{i}]", h, l, rtol)
    for s in (hs, ls):  # the two runs write to different output_dirs
        if s.get("best_model_checkpoint"):
            s["best_model_checkpoint"] = os.path.basename(s["best_model_checkpoint"])
    report.metrics(where, hs, ls, lambda k: 0.0)


def compare_weights(report, where, hf_file, loom_file, tolerance):
    hw, lw = load_file(hf_file), load_file(loom_file)
    if set(hw) != set(lw):
        report.problems.append(f"{where}: HF {sorted(hw)}, loom {sorted(lw)}")
    for k in sorted(set(hw) & set(lw)):
        if not torch.equal(hw[k], lw[k]):
            diff = ((hw[k] - lw[k]).abs().max() / hw[k].abs().max().clamp_min(1e-30)).item()
            report.worst = max(report.worst, diff)
            if diff > tolerance:
                report.problems.append(f"{where} {k}: max difference {diff:.3g} of its largest value")


def compare(hf_out, loom_out, tolerance, skip=()):
    report = Report(skip)
    rtol = (lambda k: max(tolerance, EVAL_LOSS_RTOL) if k.endswith("eval_loss") else tolerance)
    compare_state(report, "trainer_state.json", os.path.join(hf_out, "trainer_state.json"),
                  os.path.join(loom_out, "trainer_state.json"), rtol)
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        report.metrics(name, read_json(os.path.join(hf_out, name)), read_json(os.path.join(loom_out, name)), rtol)
    compare_weights(report, "final weights", os.path.join(hf_out, "final.safetensors"),
                    os.path.join(loom_out, "final.safetensors"), tolerance)
    # Checkpoints: the same folders, each with the same trainer_state.json and weights.
    folders = [sorted(d for d in os.listdir(out) if d.startswith("checkpoint-")) for out in (hf_out, loom_out)]
    if folders[0] != folders[1]:
        report.problems.append(f"checkpoints: HF {folders[0]}, loom {folders[1]}")
    for d in folders[0]:
        if d in folders[1]:
            compare_state(report, f"{d}/trainer_state.json", os.path.join(hf_out, d, "trainer_state.json"),
                          os.path.join(loom_out, d, "trainer_state.json"), rtol)
            compare_weights(report, f"{d}/model.safetensors", os.path.join(hf_out, d, "model.safetensors"),
                            os.path.join(loom_out, d, "model.safetensors"), tolerance)
    return report


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--hf-worker":
        torch.set_num_threads(1)
        with open(sys.argv[2]) as f:
            for flags, inputs, out, model_kind in json.load(f):
                run_hf(flags, inputs, out, model_kind)
        # HF leaves the process group to the interpreter's exit, where gloo's threads can
        # abort the process ("terminate called without an active exception").
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", required=True, help="the hf_peer executable")
    parser.add_argument("--work", required=True, help="a scratch folder (emptied)")
    parser.add_argument("--only", help="run one configuration")
    parser.add_argument("--ranks", type=int, default=1, help="2: the DDP configurations under torchrun")
    parser.add_argument("--models", action="store_true", help="the transformer configurations (MODEL_CONFIGS)")
    parser.add_argument("--loom_sharding", default="ddp",
                        help="with --ranks 2: loom's policy (ddp, or full_shard against transformers' DDP)")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="relative tolerance of values and weights (0: bit for bit)")
    opts = parser.parse_args()
    torch.set_num_threads(1)
    shutil.rmtree(opts.work, ignore_errors=True)
    if opts.models:
        names = DDP_MODEL_CONFIGS if opts.ranks > 1 else [n for n in MODEL_CONFIGS if n not in DDP_ONLY]
        if opts.loom_sharding == "full_shard":
            names = [n for n in names if n not in NOT_FULL_SHARD]
    else:
        names = DDP_CONFIGS if opts.ranks > 1 else list(CONFIGS)
    if opts.only:
        names = [opts.only]
    runs = {}  # name -> (model_kind, inputs, flags)
    for name in names:
        if name in MODEL_CONFIGS:
            model_kind, n_train, flags = MODEL_CONFIGS[name]
            model_kind, *variant = model_kind.split(":")
            inputs = make_model_inputs(opts.work, model_kind, n_train, masked="masked" in variant,
                                       padded="padded" in variant, lora="lora" in variant)
        else:
            model_kind, (n_train, flags) = "net", CONFIGS[name]
            inputs = make_inputs(opts.work, n_train)
        # (The transformer configurations' 16 evaluation rows split evenly as they are.)
        flags = merge(COMMON, flags + (DDP_FLAGS if opts.ranks > 1 and model_kind == "net" else []))
        runs[name] = (model_kind, inputs, flags)
    if opts.ranks > 1:
        run_hf_ranks([[flags, inputs, os.path.join(opts.work, name, "hf"), model_kind]
                      for name, (model_kind, inputs, flags) in runs.items()], opts.work, opts.ranks)
    failed = 0
    for name in names:
        model_kind, inputs, flags = runs[name]
        hf_out, loom_out = (os.path.join(opts.work, name, side) for side in ("hf", "loom"))
        if opts.ranks == 1:
            run_hf(flags, inputs, hf_out, model_kind)
        run_loom(opts.peer, flags, inputs, loom_out, opts.ranks, model_kind, opts.loom_sharding)
        report = compare(hf_out, loom_out, max(opts.tolerance, OWN_TOLERANCE.get(name, 0.0)),
                         skip=DDP_MODEL_SKIP if opts.ranks > 1 and model_kind != "net" else ())
        if name in RESUME and opts.ranks == 1 and not report.problems:
            # HF restarts train_loss from 0 on resume (it averages this session's steps only);
            # loom's equals the uninterrupted run's (docs/semantics.md): checked against that.
            hf_res, loom_res = (os.path.join(opts.work, name, side) for side in ("hf-resumed", "loom-resumed"))
            run_hf(merge(flags, ["--resume_from_checkpoint", os.path.join(hf_out, RESUME[name])]), inputs, hf_res)
            run_loom(opts.peer, merge(flags, ["--resume_from_checkpoint", os.path.join(loom_out, RESUME[name])]),
                     inputs, loom_res, 1)
            report = compare(hf_res, loom_res, opts.tolerance, skip={"train_loss"})
            straight = read_json(os.path.join(loom_out, "train_results.json"))["train_loss"]
            resumed = read_json(os.path.join(loom_res, "train_results.json"))["train_loss"]
            if straight != resumed and name not in RESUME_OTHER_DATA:
                report.problems.append(f"loom's train_loss after resume {resumed!r}, uninterrupted {straight!r}")
            name += " (resumed from " + RESUME[name] + ")"
        steps = read_json(os.path.join(hf_out, "trainer_state.json"))["global_step"]
        if report.problems:
            failed += 1
            print(f"FAIL {name} ({steps} steps):")
            for p in report.problems[:25]:
                print(f"  {p}")
            if len(report.problems) > 25:
                print(f"  ... {len(report.problems) - 25} more")
        else:
            how = "bit for bit" if report.worst == 0.0 else f"largest relative difference {report.worst:.3g}"
            how += f"; eval_loss within {report.worst_eval_loss:.3g} relative"
            print(f"ok {name} ({steps} steps, {opts.ranks} rank(s)): {how}")
    print(f"hf compare: {len(names) - failed} of {len(names)} configurations match")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
