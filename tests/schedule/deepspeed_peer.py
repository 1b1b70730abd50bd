"""Python side of the DeepSpeed checks in tests/schedule/test_schedules.cpp and
tests/precision: DeepSpeed's own classes on the cases the test wrote.

  deepspeed_peer.py CASES OUT

CASES is a JSON list; each case has a "kind":
  schedule     {"type", "lr", "warmup", "total", "params", "steps"}: DeepSpeed's scheduler class
               `type` built as HF's Trainer builds it from a config's scheduler section
               (warmup_max_lr = lr, warmup_num_steps = max(1, warmup), total_num_steps = total,
               "auto" filled), stepped after each optimizer step as DeepSpeed's engine does;
               out: the learning rate of each of `steps` optimizer steps.
  loss_scale   {"init_scale", "scale_window", "min_scale", "delayed_shift",
               "consecutive_hysteresis", "overflows"}: DynamicLossScaler.update_scale over the
               list of overflow flags; out: the scale before each step and after the last, or
               the index of the step whose overflow raised (the scale already at its minimum).
"""

import json
import logging
import sys

import torch

# DeepSpeed logs each overflow through deepspeed.comm's rank: one process, no group.
import deepspeed.comm as dist
dist.get_rank = lambda *a, **k: 0
from deepspeed.runtime import lr_schedules
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler

logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


def schedule(case):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=case["lr"])
    params = dict(case["params"])
    cls = getattr(lr_schedules, case["type"])
    if case["type"] != "WarmupCosineLR":
        params.setdefault("warmup_max_lr", case["lr"])
        params.setdefault("warmup_min_lr", 0)
    params["warmup_num_steps"] = max(1, case["warmup"])
    if case["type"] != "WarmupLR":
        params["total_num_steps"] = case["total"]
    s = cls(opt, **params)
    out = []
    for _ in range(case["steps"]):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


def loss_scale(case):
    s = DynamicLossScaler(init_scale=case["init_scale"], scale_window=case["scale_window"],
                          min_scale=case["min_scale"], delayed_shift=case["delayed_shift"],
                          consecutive_hysteresis=case["consecutive_hysteresis"])
    scales = []
    for i, overflow in enumerate(case["overflows"]):
        scales.append(s.cur_scale)
        try:
            s.update_scale(overflow)
        except Exception:  # "Current loss scale already at minimum"
            return {"scales": scales, "raised_at": i}
    scales.append(s.cur_scale)
    return {"scales": scales, "raised_at": None}


def main():
    cases = json.loads(open(sys.argv[1]).read())
    out = [schedule(c) if c["kind"] == "schedule" else loss_scale(c) for c in cases]
    open(sys.argv[2], "w").write(json.dumps(out))


if __name__ == "__main__":
    main()
