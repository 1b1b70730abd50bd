"""Python side of tests/metrics/test_metrics.cpp: scikit-learn's, SciPy's and HF's values for
the cases the test wrote.

  metrics_peer.py CASES OUT

CASES is a JSON list of {"name", "kind", "predictions", "labels", "options"}; OUT gets
{name: value or [values]}, NaN written as null. Kinds:
  prf             sklearn's precision_recall_fscore_support (predictions: class ids or logits,
                  argmax over the last axis; labels -100 dropped first, as HF's token-level
                  compute_metrics do) and accuracy_score; multi-label: indicators from
                  sigmoid(logits) > 0.5
  regression      sklearn's mean_squared_error, root_mean_squared_error, mean_absolute_error,
                  r2_score; scipy.stats.pearsonr for one output
  sequence_exact  the share of rows (with a counted position) predicted right where labels != -100
  perplexity      exp of the mean cross-entropy, after transformers' ForCausalLMLoss shift
  exact_match     HF evaluate's exact_match formula (numpy's char functions)
"""

import json
import math
import string
import sys
import warnings
from pathlib import Path

import numpy as np
from scipy import stats
from sklearn import metrics


def nan_to_none(v):
    return None if isinstance(v, float) and math.isnan(v) else v


def prf(case):
    o = case["options"]
    labels = np.asarray(case["labels"])
    predictions = np.asarray(case["predictions"])
    if o.get("multi_label"):
        y_true = labels.astype(np.int64)
        y_pred = (1 / (1 + np.exp(-predictions)) > 0.5).astype(np.int64)
    else:
        y_pred = predictions.argmax(-1) if predictions.ndim == labels.ndim + 1 else predictions
        keep = labels != -100
        y_true, y_pred = labels[keep].astype(np.int64), y_pred[keep].astype(np.int64)
    zero = o.get("zero_division", "warn")
    if zero == "nan":
        zero = np.nan
    kwargs = {"average": o.get("average", "binary"), "pos_label": o.get("pos_label", 1), "zero_division": zero}
    if "num_labels" in o and not o.get("multi_label"):
        kwargs["labels"] = list(range(o["num_labels"]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p, r, f, _ = metrics.precision_recall_fscore_support(y_true, y_pred, **kwargs)
    warned = any(issubclass(w.category, metrics._classification.UndefinedMetricWarning) for w in caught)
    return [nan_to_none(float(p)), nan_to_none(float(r)), nan_to_none(float(f)),
            float(metrics.accuracy_score(y_true, y_pred)), warned]


def regression(case):
    y_pred, y_true = np.asarray(case["predictions"], dtype=np.float64), np.asarray(case["labels"], dtype=np.float64)
    out = [metrics.mean_squared_error(y_true, y_pred), metrics.root_mean_squared_error(y_true, y_pred),
           metrics.mean_absolute_error(y_true, y_pred), metrics.r2_score(y_true, y_pred)]
    if y_true.ndim == 1:
        out.append(float(stats.pearsonr(y_pred, y_true).statistic))
    return [float(v) for v in out]


def sequence_exact(case):
    labels = np.asarray(case["labels"])
    predictions = np.asarray(case["predictions"]).argmax(-1)
    counted = labels != -100
    rows = counted.any(1)
    right = ((predictions == labels) | ~counted).all(1)
    return float(right[rows].mean())


def perplexity(case):
    import torch
    logits = torch.tensor(case["predictions"], dtype=torch.float64)
    labels = torch.tensor(case["labels"], dtype=torch.long)
    if case["options"].get("shift"):
        # transformers' ForCausalLMLoss shift (loss/loss_utils.py), kept in float64 (it upcasts to float32 only)
        labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    return math.exp(loss.item())


def exact_match(case):
    # HF evaluate's exact_match (evaluate/metrics/exact_match), its formula without regexes_to_ignore.
    o = case["options"]
    predictions, references = np.asarray(case["predictions"]), np.asarray(case["labels"])
    if o.get("ignore_case"):
        predictions, references = np.char.lower(predictions), np.char.lower(references)
    for flag, chars in (("ignore_punctuation", string.punctuation), ("ignore_numbers", string.digits)):
        if o.get(flag):
            table = chars.maketrans("", "", chars)
            predictions, references = np.char.translate(predictions, table), np.char.translate(references, table)
    return float(np.mean(predictions == references))


def main():
    cases = json.loads(Path(sys.argv[1]).read_text())
    kinds = {"prf": prf, "regression": regression, "sequence_exact": sequence_exact, "perplexity": perplexity,
             "exact_match": exact_match}
    out = {case["name"]: kinds[case["kind"]](case) for case in cases}
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
