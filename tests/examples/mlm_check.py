#!/usr/bin/env python3
"""transformers' side of tests/examples/smoke_bert_mlm.cmake.

  mlm_check.py MODEL DATA
      Opens MODEL (the bert_mlm example's output folder) with BertForMaskedLM.from_pretrained,
      which must report no missing, unexpected or mismatched weight, and the tokenizer saved
      beside it; runs transformers' fill-mask pipeline on a held-out verse of DATA with one
      token replaced by [MASK], which must return candidates for it.
"""
import json
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")


def main(model_dir, data_dir):
    import numpy as np
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM, pipeline

    torch.set_num_threads(1)
    model, info = BertForMaskedLM.from_pretrained(model_dir, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        sys.exit(f"mlm check: loading {model_dir} reported {bad}")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    meta = json.load(open(os.path.join(data_dir, "meta.json")))
    files = meta["classification"]["val"]
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    ids = np.fromfile(os.path.join(data_dir, files["ids"]), dtype=dtype).astype(np.int64)
    offsets = np.fromfile(os.path.join(data_dir, files["offsets"]), dtype="<u8").astype(np.int64)
    # The first words of a verse (without [CLS] and [SEP]): short enough, re-tokenized by the
    # pipeline, for the example's max_seq_length positions.
    verse = ids[offsets[0]:offsets[1]][1:-1].tolist()[:10]
    verse[len(verse) // 2] = meta["mask_token_id"]
    text = tokenizer.decode(verse)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    answers = fill(text, top_k=3)
    if len(answers) != 3 or any("token" not in a for a in answers):
        sys.exit(f"mlm check: fill-mask gave {answers!r}")
    print(f"mlm check ok: BertForMaskedLM from {model_dir}, fill-mask on {text!r}: "
          + ", ".join(f"{a['token_str']!r} {a['score']:.3f}" for a in answers))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
