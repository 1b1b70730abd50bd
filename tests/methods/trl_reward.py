#!/usr/bin/env python3
"""TRL's RewardTrainer, the peer of tests/methods/test_reward.cpp (issue 39 point 2).

  python trl_reward.py make DIR
      DIR/init: a tiny random LlamaForSequenceClassification (num_labels 1, pad_token_id 0) saved
      by transformers; DIR/pairs.safetensors: preference pairs (chosen / rejected token rows of
      random lengths, padded on the right with 0, their attention masks, and margins).
  python trl_reward.py train DIR OUT MARGIN CENTER [TrainingArguments flags...]
      trl.RewardTrainer (TRL 1.16) on DIR's pairs as pre-tokenized chosen_ids / rejected_ids
      (with the margin column when MARGIN is 1; center_rewards_coefficient CENTER unless
      "none"), the flags parsed into RewardConfig; its log_history to OUT/log_history.json.
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

BASE = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=1, pad_token_id=0,
            num_labels=1)
PAIRS, WIDTH = 24, 16


def make(folder):
    from transformers import LlamaConfig, LlamaForSequenceClassification
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(LlamaConfig(**BASE))
    with torch.no_grad():  # the score head's default init is tiny; larger rewards make the metrics move
        model.score.weight.mul_(20.0)
    model.save_pretrained(os.path.join(folder, "init"))
    gen = torch.Generator().manual_seed(1)
    t = {}
    for side, low in (("chosen", 6), ("rejected", 3)):
        lengths = torch.randint(low, WIDTH + 1, (PAIRS,), generator=gen)
        ids = torch.randint(2, BASE["vocab_size"], (PAIRS, WIDTH), generator=gen)
        mask = (torch.arange(WIDTH) < lengths[:, None]).long()
        t[f"{side}_input_ids"], t[f"{side}_attention_mask"] = ids * mask, mask
    t["margin"] = torch.rand(PAIRS, generator=gen) * 0.5
    save_file(t, os.path.join(folder, "pairs.safetensors"))
    print("made reward")


def tokenizer():
    """A word-level tokenizer over the ids (TRL reads the padding and EOS tokens from it)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(BASE["vocab_size"])}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t2")), pad_token="t0",
                                   eos_token="t1", bos_token="t1", unk_token="t2")


def train(folder, out, margin, center, flags):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, HfArgumentParser
    from trl import RewardConfig, RewardTrainer
    torch.set_num_threads(1)
    t = load_file(os.path.join(folder, "pairs.safetensors"))
    rows = {"chosen_ids": [], "rejected_ids": []}
    for side in ("chosen", "rejected"):
        for ids, mask in zip(t[f"{side}_input_ids"], t[f"{side}_attention_mask"]):
            rows[f"{side}_ids"].append(ids[: int(mask.sum())].tolist())
    if margin == "1":
        rows["margin"] = t["margin"].tolist()
    extra = [] if center == "none" else ["--center_rewards_coefficient", center]
    (args,) = HfArgumentParser(RewardConfig).parse_args_into_dataclasses(
        flags + extra + ["--output_dir", out, "--report_to", "none"])
    model = AutoModelForSequenceClassification.from_pretrained(os.path.join(folder, "init"), dtype=torch.float32)
    trainer = RewardTrainer(model=model, args=args, train_dataset=Dataset.from_dict(rows),
                            processing_class=tokenizer())
    trainer.train()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "log_history.json"), "w") as f:
        json.dump(trainer.state.log_history, f)
    print("trained reward")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    if len(sys.argv) >= 6 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
