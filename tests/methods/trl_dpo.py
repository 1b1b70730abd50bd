#!/usr/bin/env python3
"""TRL's DPOTrainer, the peer of tests/methods/test_dpo.cpp (issue 39 point 3).

  python trl_dpo.py make DIR
      DIR/init: a tiny random LlamaForCausalLM (pad_token_id 0) saved by transformers;
      DIR/pairs.safetensors: preference pairs (prompt + chosen / prompt + rejected token rows of
      random lengths, right-padded with 0, their attention masks, and labels: the completion's
      ids, -100 on the prompt and the padding); DIR/cases.json: the runs compared (CASES).
  python trl_dpo.py train DIR OUT
      for each case, trl.DPOTrainer (TRL 1.16) on DIR's pairs as pre-tokenized prompt_ids /
      chosen_ids / rejected_ids; its log_history to OUT/<case>/log_history.json, an evaluation
      after training to OUT/<case>/eval.json where the case asks, and with LoRA the adapter it
      started from to OUT/<case>/init_adapter. One process for all of them.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=1, pad_token_id=0)
PAIRS = 24

# TrainingArguments flags every case shares (TRL's DPOConfig turns gradient checkpointing and,
# where it can, bf16 on by default: both off here, float32 on both sides).
FLAGS = ["--per_device_train_batch_size", "4", "--learning_rate", "5e-3", "--lr_scheduler_type", "linear",
         "--warmup_steps", "1", "--max_steps", "6", "--logging_steps", "1", "--save_strategy", "no", "--seed", "42",
         "--gradient_checkpointing", "false", "--max_grad_norm", "1.0", "--use_cpu", "true",
         "--disable_tqdm", "true", "--bf16", "false"]

# Each case: DPOConfig's fields (lists as TRL takes them), whether the policy is a LoRA adapter
# on the base (the reference then the base with the adapter off), and the relative tolerance
# of the comparison where it is not the 1e-6; with "evaluate", the trained model is
# evaluated on the same pairs after training (TRL's eval_ metrics).
CASES = {
    "sigmoid": {"dpo": {}, "lora": False, "evaluate": True},
    "ipo_hinge_robust": {"dpo": {"beta": 0.2, "loss_type": ["ipo", "hinge", "robust"], "loss_weights": [1.0, 0.5, 0.25],
                                 "label_smoothing": 0.1}, "lora": False},
    # Six losses summed: its drift from TRL sits at the edge of 1e-6 (1.17e-6 at step 4 once
    # from_pretrained read one tensor at a time instead of the whole file first). Its arithmetic
    # did not change; the likeliest cause, not proven, is the weights' place in memory (CPU GEMM
    # kernels may round differently with alignment).
    "pairwise": {"dpo": {"beta": 0.3, "label_smoothing": 0.05,
                         "loss_type": ["exo_pair", "nca_pair", "bco_pair", "sppo_hard", "apo_zero", "apo_down"]},
                 "lora": False, "tolerance": 2e-6},
    "sorted": {"dpo": {"beta": 0.3, "label_smoothing": 0.05, "loss_type": ["aot", "aot_unpaired"]}, "lora": False},
    # The SFT term's gradient goes through every chosen token's log-softmax, which TRL's kernel
    # differentiates in its own order: after its first update this case drifts to 6e-6.
    "normalized": {"dpo": {"beta": 0.3, "loss_type": ["discopop", "sft", "sigmoid_norm"]}, "lora": False,
                   "tolerance": 1e-5},
    "ld_alpha_divergence": {"dpo": {"ld_alpha": 0.5, "f_divergence_type": "alpha_divergence",
                                    "f_alpha_divergence_coef": 0.3}, "lora": False},
    "precompute": {"dpo": {"precompute_ref_log_probs": True, "precompute_ref_batch_size": 5}, "lora": False},
    "lora": {"dpo": {}, "lora": True},
}
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def make(folder):
    from transformers import LlamaConfig, LlamaForCausalLM
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**BASE)).save_pretrained(os.path.join(folder, "init"))
    gen = torch.Generator().manual_seed(1)
    rand = lambda low, high: int(torch.randint(low, high + 1, (1,), generator=gen))
    tokens = lambda n: torch.randint(2, BASE["vocab_size"], (n,), generator=gen).tolist()
    rows = {"chosen": [], "rejected": []}
    for _ in range(PAIRS):
        prompt = tokens(rand(2, 5))
        for side, low in (("chosen", 2), ("rejected", 1)):
            rows[side].append((prompt, tokens(rand(low, 7))))
    t = {}
    for side, pairs in rows.items():
        width = max(len(p) + len(c) for p, c in pairs)
        ids = torch.zeros(PAIRS, width, dtype=torch.long)
        mask = torch.zeros(PAIRS, width, dtype=torch.long)
        labels = torch.full((PAIRS, width), -100, dtype=torch.long)
        for i, (p, c) in enumerate(pairs):
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            mask[i, : len(p) + len(c)] = 1
            labels[i, len(p): len(p) + len(c)] = torch.tensor(c)
        t[f"{side}_input_ids"], t[f"{side}_attention_mask"], t[f"{side}_labels"] = ids, mask, labels
    save_file(t, os.path.join(folder, "pairs.safetensors"))
    with open(os.path.join(folder, "cases.json"), "w") as f:
        json.dump({"flags": FLAGS, "cases": CASES, "lora": LORA}, f)
    print("made dpo")


def tokenizer():
    """A word-level tokenizer over the ids (TRL reads the padding and EOS tokens from it)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(BASE["vocab_size"])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")), pad_token="t0",
                                   eos_token="t1", bos_token="t1", unk_token="t2")


def dataset(folder):
    """The pairs as TRL's tokenized columns: prompt_ids, chosen_ids, rejected_ids."""
    from datasets import Dataset
    t = load_file(os.path.join(folder, "pairs.safetensors"))
    rows = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for i in range(PAIRS):
        for side in ("chosen", "rejected"):
            ids, labels = t[f"{side}_input_ids"][i], t[f"{side}_labels"][i]
            scored = (labels != -100).nonzero().flatten()
            start, end = int(scored[0]), int(scored[-1]) + 1
            if side == "chosen":
                rows["prompt_ids"].append(ids[:start].tolist())
            rows[f"{side}_ids"].append(ids[start:end].tolist())
    return Dataset.from_dict(rows)


def train(folder, out):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, HfArgumentParser
    from trl import DPOConfig, DPOTrainer
    torch.set_num_threads(1)
    # The pairs are token ids already: TRL's own tokenization (prompt extraction, EOS, chat
    # templates) is prepare.py's work on loom's side, so it is left out on both.
    DPOTrainer._prepare_dataset = lambda self, data, *args, **kwargs: data
    data = dataset(folder)
    for name, case in CASES.items():
        where = os.path.join(out, name)
        (args,) = HfArgumentParser(DPOConfig).parse_args_into_dataclasses(
            FLAGS + ["--output_dir", where, "--report_to", "none"])
        for key, value in case["dpo"].items():
            setattr(args, key, value)
        model = AutoModelForCausalLM.from_pretrained(os.path.join(folder, "init"), dtype=torch.float32)
        peft_config = LoraConfig(**LORA) if case["lora"] else None
        trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer(),
                             peft_config=peft_config, eval_dataset=data if case.get("evaluate") else None)
        os.makedirs(where, exist_ok=True)
        if case["lora"]:
            trainer.model.save_pretrained(os.path.join(where, "init_adapter"))
        trainer.train()
        with open(os.path.join(where, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
        if case.get("evaluate"):
            with open(os.path.join(where, "eval.json"), "w") as f:
                json.dump(trainer.evaluate(), f)
    print("trained dpo")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
