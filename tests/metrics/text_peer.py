"""Python side of tests/metrics/test_metrics.cpp's text metrics: rouge-score's and sacrebleu's
numbers for the strings the test wrote.

  text_peer.py CASES OUT

CASES is {"predictions": [...], "references": [[...], ...]} (reference streams, as sacrebleu
takes them; the first stream is ROUGE's reference). OUT gets, per prediction, rouge-score's
tokens and its rouge1 / rouge2 / rougeL (precision, recall, fmeasure) against the first
reference, sacrebleu's 13a tokens of each string, and corpus_bleu over all predictions with
one stream and with every stream.
"""

import json
import sys

import sacrebleu
from rouge_score import rouge_scorer, tokenize
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


def bleu_fields(b):
    return {"score": b.score, "precisions": list(b.precisions), "bp": b.bp, "sys_len": b.sys_len,
            "ref_len": b.ref_len, "counts": list(b.counts), "totals": list(b.totals)}


def main():
    cases = json.loads(open(sys.argv[1], encoding="utf-8").read())
    predictions, streams = cases["predictions"], cases["references"]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"])  # evaluate's defaults: no stemmer
    rouge = []
    for prediction, reference in zip(predictions, streams[0]):
        scores = scorer.score(reference, prediction)
        rouge.append({k: [v.precision, v.recall, v.fmeasure] for k, v in scores.items()})
    thirteen = Tokenizer13a()
    texts = predictions + [r for s in streams for r in s]
    out = {
        "rouge": rouge,
        "rouge_tokens": [tokenize.tokenize(t, None) for t in texts],
        "bleu_tokens": [thirteen(t.rstrip()) for t in texts],
        "bleu_one": bleu_fields(sacrebleu.corpus_bleu(predictions, streams[:1])),
        "bleu_all": bleu_fields(sacrebleu.corpus_bleu(predictions, streams)),
    }
    open(sys.argv[2], "w", encoding="utf-8").write(json.dumps(out))


if __name__ == "__main__":
    main()
