"""Reference steps for tests/optim/test_optimizers.cpp, in Python's torch.optim (and HF's
Adafactor, and a Lion written out from its paper, since torch has none).

usage: reference.py INPUT.safetensors OUTPUT_PREFIX CONFIGS_JSON

INPUT holds p<i> (initial parameters) and g<i>.<s> (the gradient of parameter i at step s).
CONFIGS is a list (one Python start for every case) of
        {"optim": name, "base_lr": B, "kwargs": {...}, "factors": [f0, f1, ...],
         "groups": [{"params": [i, ...], "weight_decay": wd, "lr": lr or null}, ...]}
At step s every group steps at its lr (B when null) times factors[s], as a LambdaLR would
scale it. OUTPUT_PREFIX<k>.safetensors holds, for configs[k], p<i>.<s>: parameter i after
step s.
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file


class Lion(torch.optim.Optimizer):
    """Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2."""

    def __init__(self, params, lr, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                c = beta1 * m + (1 - beta1) * p.grad
                p.add_(torch.sign(c), alpha=-group["lr"])
                m.copy_(beta2 * m + (1 - beta2) * p.grad)


def make(optim, groups, base_lr, kwargs):
    if optim == "sgd":
        return torch.optim.SGD(groups, lr=base_lr, **kwargs)
    if optim == "adagrad":
        return torch.optim.Adagrad(groups, lr=base_lr, **kwargs)
    if optim == "rmsprop":
        return torch.optim.RMSprop(groups, lr=base_lr, **kwargs)
    if optim == "adamw_torch":
        return torch.optim.AdamW(groups, lr=base_lr, foreach=False, **kwargs)
    if optim == "adamw_torch_fused":
        return torch.optim.AdamW(groups, lr=base_lr, fused=True, **kwargs)
    if optim == "lion":
        return Lion(groups, lr=base_lr, **kwargs)
    if optim == "adafactor":
        from transformers.optimization import Adafactor

        # HF Trainer's --optim adafactor: a fixed lr from the schedule.
        defaults = dict(scale_parameter=False, relative_step=False, warmup_init=False)
        defaults.update(kwargs)
        return Adafactor(groups, lr=base_lr, **defaults)
    raise SystemExit(f"unknown optim {optim}")


def run(tensors, config, output):
    n = sum(1 for k in tensors if k.startswith("p"))
    params = [torch.nn.Parameter(tensors[f"p{i}"].clone()) for i in range(n)]
    groups = []
    for g in config["groups"]:
        group = {"params": [params[i] for i in g["params"]], "weight_decay": g["weight_decay"]}
        if g.get("lr") is not None:
            group["lr"] = g["lr"]
        groups.append(group)
    opt = make(config["optim"], groups, config["base_lr"], config["kwargs"])
    initial = [group["lr"] for group in opt.param_groups]
    out = {}
    for s, factor in enumerate(config["factors"]):
        for group, lr in zip(opt.param_groups, initial):
            group["lr"] = lr * factor
        for i, p in enumerate(params):
            p.grad = tensors[f"g{i}.{s}"].clone()
        opt.step()
        for i, p in enumerate(params):
            out[f"p{i}.{s}"] = p.detach().clone().contiguous()
    save_file(out, output)


def main():
    tensors = load_file(sys.argv[1])
    for k, config in enumerate(json.loads(sys.argv[3])):
        run(tensors, config, f"{sys.argv[2]}{k}.safetensors")


if __name__ == "__main__":
    main()
