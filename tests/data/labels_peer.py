"""Python side of tests/data/test_labels.cpp and tests/examples/problem_types_bert_classify.cmake:
labelled JSON Lines for examples/text_data/prepare.py --classify, and transformers' loss on a
batch of the token folder it wrote.

  labels_peer.py jsonl DIR                  DIR/{single,multi,regression,targets}.jsonl: 48 short
                                            texts each, labels of each task (targets: 2 numbers)
  labels_peer.py loss MODEL DATA N OUT      transformers' BertForSequenceClassification from the
                                            HF folder MODEL (eval mode) on the first N examples of
                                            DATA's classification train split, read with numpy and
                                            batched by transformers' DataCollatorWithPadding; OUT
                                            gets {"loss", "logits", "labels"} (JSON)
"""

import json
import random
import sys
from pathlib import Path

import numpy as np

WORDS = "the quick brown fox jumps over a lazy dog while rain falls on green hills and still waters".split()


def jsonl(folder):
    r = random.Random(5)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tasks = {"single": lambda: r.choice(["neg", "neutral", "pos"]),
             "multi": lambda: sorted(r.sample(["a", "b", "c"], r.randint(0, 2))),
             "regression": lambda: round(r.uniform(-2, 3), 3),
             "targets": lambda: [round(r.uniform(0, 1), 3), round(r.uniform(-1, 1), 3)]}
    for name, label in tasks.items():
        lines = [json.dumps({"text": " ".join(r.choice(WORDS) for _ in range(r.randint(2, 14))), "label": label()})
                 for _ in range(48)]
        (folder / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


def loss(model_dir, data, n, out):
    import torch
    from transformers import BertForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast
    data = Path(data)
    meta = json.loads((data / "meta.json").read_text())
    cls = meta["classification"]
    files = cls["train"]
    ids = np.fromfile(data / files["ids"], dtype={"uint16": "<u2", "uint32": "<u4"}[meta["dtype"]])
    offsets = np.fromfile(data / files["offsets"], dtype="<u8")
    width = len(cls["label_names"])
    if cls.get("problem_type", "single_label_classification") == "single_label_classification":
        labels = np.fromfile(data / files["labels"], dtype="<i8").tolist()
    else:
        rows = np.fromfile(data / files["labels"], dtype="<f4").reshape(-1, width)
        # run_glue's regression label is one float; several targets and multi-hot rows are lists.
        labels = rows[:, 0].tolist() if cls["problem_type"] == "regression" and width == 1 else rows.tolist()
    tok = PreTrainedTokenizerFast.from_pretrained(str(data))
    features = [{"input_ids": ids[offsets[i]:offsets[i + 1]].astype(np.int64).tolist(), "label": labels[i]}
                for i in range(n)]
    batch = DataCollatorWithPadding(tok, return_tensors="pt")(features)
    model = BertForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        result = model(**batch)
    Path(out).write_text(json.dumps({"loss": result.loss.item(), "logits": result.logits.tolist(),
                                     "labels": batch["labels"].tolist(), "labels_dtype": str(batch["labels"].dtype),
                                     "problem_type": model.config.problem_type}))


if __name__ == "__main__":
    if sys.argv[1] == "jsonl":
        jsonl(sys.argv[2])
    else:
        loss(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
