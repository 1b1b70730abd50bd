#!/usr/bin/env python3
"""transformers' side of tests/models/test_bert_mlm.cpp (run through $LOOM_PYTHON).

  hf_bert_mlm.py make DIR
      Builds, with transformers itself (seeded, nothing downloaded):
        DIR/mlm          a tiny random BertForMaskedLM (tied decoder), saved by save_pretrained
        DIR/mlm_untied   the same with tie_word_embeddings false (its own decoder weight)
        DIR/pretraining  a BertForPreTraining (pooler and next-sentence head beside cls.predictions)
      and DIR/expected.safetensors: a padded batch (input_ids, attention_mask, labels with -100)
      with each model's logits and loss as BertForMaskedLM computes them (pretraining's read
      through BertForMaskedLM.from_pretrained, which skips its pooler and NSP head).

      For the masking rule: a BertTokenizerFast over a vocabulary written here ([PAD] [UNK]
      [CLS] [SEP] [MASK], then words), and DataCollatorForLanguageModeling(seed=SEED) on
      examples of different lengths: collator_input_ids (padded, before masking),
      collator_masked and collator_labels (what the collator returned), for each setting in
      SETTINGS (mlm_probability, mask_replace_prob, random_replace_prob), suffixed _0, _1, ...

  hf_bert_mlm.py check FOLDER INPUTS
      Opens FOLDER (written by loom) with BertForMaskedLM.from_pretrained, which must report no
      missing, unexpected or mismatched weight, and prints the largest difference of its logits
      from INPUTS' loom_logits. Exit status 0 when within 1e-5 relative.
"""
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

import torch
from safetensors.torch import load_file, save_file

SEED = 1234
SETTINGS = [(0.15, 0.8, 0.1), (0.5, 0.6, 0.3), (0.3, 1.0, 0.0)]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = 120


def config(**kw):
    from transformers import BertConfig
    return BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=48, max_position_embeddings=64, pad_token_id=0, **kw)


def make(out):
    from transformers import (BertForMaskedLM, BertForPreTraining, BertTokenizerFast,
                              DataCollatorForLanguageModeling)
    os.makedirs(out, exist_ok=True)
    expected = {}
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(5, VOCAB, (3, 11), generator=gen)
    mask = torch.ones_like(ids)
    ids[:, 0] = 2
    ids[0, 10] = 3
    ids[1, 7] = 3
    ids[1, 8:] = 0
    mask[1, 8:] = 0
    ids[2, 5] = 3
    ids[2, 6:] = 0
    mask[2, 6:] = 0
    labels = torch.full_like(ids, -100)
    for r, c in [(0, 1), (0, 4), (0, 9), (1, 2), (1, 3), (2, 4)]:
        labels[r, c] = int(torch.randint(5, VOCAB, (1,), generator=gen))
    expected.update(input_ids=ids, attention_mask=mask, labels=labels)

    torch.manual_seed(0)
    models = {"mlm": BertForMaskedLM(config()), "mlm_untied": BertForMaskedLM(config(tie_word_embeddings=False)),
              "pretraining": BertForPreTraining(config())}
    for name, model in models.items():
        with torch.no_grad():  # random prediction biases: HF initializes them to 0
            for n, p in model.named_parameters():
                if n.endswith("predictions.bias"):
                    p.normal_(0.0, 0.5)
        model.save_pretrained(os.path.join(out, name))
    for name in models:
        model = BertForMaskedLM.from_pretrained(os.path.join(out, name)).eval()
        with torch.no_grad():
            o = model(input_ids=ids, attention_mask=mask, labels=labels)
        expected[name + "_logits"] = o.logits.contiguous()
        expected[name + "_loss"] = o.loss.reshape(1)

    words = SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    assert len(tokenizer) == VOCAB and tokenizer.mask_token_id == 4 and tokenizer.pad_token_id == 0
    gen = torch.Generator().manual_seed(11)
    examples = []
    for n in [40, 17, 33, 64, 5, 28, 50, 12]:
        body = torch.randint(5, VOCAB, (n - 2,), generator=gen).tolist()
        body[len(body) // 3] = 1  # an [UNK] inside the text: special, never masked
        examples.append({"input_ids": [2] + body + [3]})
    for k, (p, mask_p, random_p) in enumerate(SETTINGS):
        collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=p, mask_replace_prob=mask_p,
                                                   random_replace_prob=random_p, seed=SEED, return_tensors="pt")
        padded = tokenizer.pad(examples, return_tensors="pt")["input_ids"]
        batch = collator([dict(e) for e in examples])
        expected[f"collator_input_ids_{k}"] = padded
        expected[f"collator_masked_{k}"] = batch["input_ids"]
        expected[f"collator_labels_{k}"] = batch["labels"]
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(out, "expected.safetensors"))
    print("made bert mlm", out)


def check(folder, inputs):
    from transformers import BertForMaskedLM
    data = load_file(inputs)
    model, info = BertForMaskedLM.from_pretrained(folder, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        print("loading info:", bad)
        return 1
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    ref = data["loom_logits"]
    rel = float((logits - ref).abs().max() / ref.abs().max())
    print(f"relative difference {rel:.3g}")
    return 0 if rel <= 1e-5 else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "check":
        sys.exit(check(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
