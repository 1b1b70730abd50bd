#!/usr/bin/env python3
"""transformers' side of tests/models/test_hf_models.cpp (run through $LOOM_PYTHON).

  hf_models.py make DIR
      Builds tiny random GPT2LMHeadModel and BertForSequenceClassification models (a
      classifier and a regressor) with transformers itself (seeded, nothing downloaded),
      saves each with save_pretrained twice, as one model.safetensors (DIR/<name>) and
      sharded with an index (DIR/<name>_sharded), and writes DIR/expected.safetensors: the
      inputs (GPT-2 labels with ignored tokens, BERT batches with padding) and transformers'
      logits and loss for them. The classifier is saved again once per problem_type
      (DIR/bert_<problem_type>, DIR/bert_unset for none), with labels of that kind and its loss.

  hf_models.py check KIND,FOLDER,INPUTS,KEY_PREFIX[,exact] ...
      For each group: opens FOLDER (written by loom) with transformers' from_pretrained,
      which must report no missing, unexpected or mismatched weights, runs it on the inputs
      of INPUTS and prints the largest difference from INPUTS' <KEY_PREFIX>_logits (and
      loss). Exit status 0 when every group's logits are equal to within 1e-5 relative (with
      `exact`: identical). One process for all groups: importing transformers takes seconds.
"""
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from safetensors.torch import load_file, save_file

GPT2 = dict(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4)
BERT = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64)


def problem_type_cases(gen):
    """(problem_type, labels for 4 examples and 3 labels) for each of HF's loss rules; unset with
    float labels infers multi_label_classification."""
    targets = (torch.rand(4, 3, generator=gen) > 0.5).float()
    return [("single_label_classification", torch.tensor([1, 0, 2, 2])),
            ("multi_label_classification", targets),
            ("regression", torch.randn(4, 3, generator=gen)),
            (None, targets.flip(0).contiguous())]


def gpt2_class():
    from transformers import GPT2LMHeadModel
    return GPT2LMHeadModel


def bert_class():
    from transformers import BertForSequenceClassification
    return BertForSequenceClassification


def run(kind, model, t, prefix):
    """(logits, loss) of `model` on the inputs named `prefix`_* in `t`."""
    model.eval()
    with torch.no_grad():
        if kind == "gpt2":
            out = model(input_ids=t[f"{prefix}_input_ids"], labels=t[f"{prefix}_labels"])
        else:
            out = model(input_ids=t[f"{prefix}_input_ids"], attention_mask=t[f"{prefix}_attention_mask"],
                        labels=t[f"{prefix}_labels"])
    return out.logits.contiguous(), out.loss.reshape(1).contiguous()


def make(folder):
    from transformers import BertConfig, GPT2Config
    os.makedirs(folder, exist_ok=True)
    t = {}
    torch.manual_seed(0)
    # GPT-2: dropout left at its defaults (the comparison runs in eval mode).
    gpt2 = gpt2_class()(GPT2Config(**GPT2, bos_token_id=0, eos_token_id=0))
    ids = torch.randint(0, GPT2["vocab_size"], (3, 16))
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt that is not scored
    labels[2, 10:] = -100
    t["gpt2_input_ids"], t["gpt2_labels"] = ids, labels

    bert = bert_class()(BertConfig(**BERT, num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                   label2id={"neg": 0, "neu": 1, "pos": 2}))
    bert_reg = bert_class()(BertConfig(**BERT, num_labels=1))
    lengths = [12, 9, 5, 12]
    ids = torch.randint(1, BERT["vocab_size"], (4, 12))
    mask = torch.zeros(4, 12, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    ids = ids * mask  # pad_token_id 0 after each sequence
    t["bert_input_ids"], t["bert_attention_mask"] = ids, mask
    t["bert_labels"] = torch.tensor([0, 2, 1, 2])
    t["bert_reg_input_ids"], t["bert_reg_attention_mask"] = ids.clone(), mask.clone()
    t["bert_reg_labels"] = torch.tensor([0.5, -1.0, 2.0, 0.25])

    for name, kind, model in (("gpt2", "gpt2", gpt2), ("bert", "bert", bert), ("bert_reg", "bert", bert_reg)):
        model.save_pretrained(os.path.join(folder, name))
        model.save_pretrained(os.path.join(folder, name + "_sharded"), max_shard_size="20KB")
        t[f"{name}_logits"], t[f"{name}_loss"] = run(kind, model, t, name)
    # HF's loss for each problem_type, on the classifier's weights and inputs: a folder per
    # problem_type (config.json carries it), its labels and transformers' logits and loss.
    gen = torch.Generator().manual_seed(5)
    for problem_type, labels in problem_type_cases(gen):
        name = f"bert_{problem_type or 'unset'}"
        bert.config.problem_type = problem_type  # None: inferred at the forward (which sets it)
        bert.save_pretrained(os.path.join(folder, name))
        t[f"{name}_input_ids"], t[f"{name}_attention_mask"], t[f"{name}_labels"] = ids.clone(), mask.clone(), labels
        t[f"{name}_logits"], t[f"{name}_loss"] = run("bert", bert, t, name)
    save_file(t, os.path.join(folder, "expected.safetensors"))
    shards = [f for f in os.listdir(os.path.join(folder, "gpt2_sharded")) if f.startswith("model-")]
    print(f"made gpt2, bert, bert_reg (gpt2 sharded into {len(shards)} files)")


def check(kind, folder, inputs, prefix, exact):
    cls = gpt2_class() if kind == "gpt2" else bert_class()
    model, info = cls.from_pretrained(folder, output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    if problems:
        print(f"loading {folder}: {problems}")
        return 1
    t = load_file(inputs)
    logits, loss = run(kind, model, t, prefix)
    want_logits, want_loss = t[f"{prefix}_logits"], t[f"{prefix}_loss"]
    diff = (logits - want_logits).abs().max().item()
    rel = diff / want_logits.abs().max().item()
    loss_rel = ((loss - want_loss).abs() / want_loss.abs()).item()
    print(f"{prefix}: largest logit difference {diff:.3g} ({rel:.3g} relative), loss {loss_rel:.3g} relative")
    if kind == "bert":
        print(f"id2label {model.config.id2label}")
    if exact:
        return 0 if torch.equal(logits, want_logits) and torch.equal(loss, want_loss) else 1
    return 0 if rel <= 1e-5 and loss_rel <= 1e-5 else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
        return 0
    if len(sys.argv) > 2 and sys.argv[1] == "check":
        failed = 0
        for group in sys.argv[2:]:
            kind, folder, inputs, prefix, *exact = group.split(",")
            if check(kind, folder, inputs, prefix, exact == ["exact"]) != 0:
                print(f"FAILED {prefix} ({folder})")
                failed += 1
        return 1 if failed else 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
