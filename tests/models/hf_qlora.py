#!/usr/bin/env python3
"""bitsandbytes' and transformers' side of tests/models/test_qlora.cpp (run through $LOOM_PYTHON).

  hf_qlora.py format CASES
      CASES (safetensors, written by loom) holds weights, each with loom's 4-bit state of it:
      for case NAME, NAME.weight and NAME.packed / NAME.absmax (NAME.nested_absmax, NAME.offset
      and NAME.nested_code when double-quantized) / NAME.dequantized, with the case's quant type
      and double quantization in the file's metadata (NAME: "nf4,1"). Each weight is quantized by
      bitsandbytes.functional.quantize_4bit (blocksize 64) on the CPU; every tensor must equal
      loom's bit for bit, and so must dequantize_4bit's values. Cases that also hold NAME.x and
      NAME.grad_out compare matmul_4bit's output and input gradient with loom's linear_4bit
      (NAME.y, NAME.grad_x).

  hf_qlora.py model BASE ADAPTER EXPECTED QUANT_TYPE NESTED
      transformers opens the float folder BASE with BitsAndBytesConfig(load_in_4bit=True, the quant
      type, bnb_4bit_use_double_quant=NESTED, compute dtype float32), so its Linear4bit layers hold
      bitsandbytes' own codes of the same weights: those of layer 0's q_proj must equal EXPECTED's
      q_proj_packed. PEFT then puts loom's trained adapter (ADAPTER) on it; its loss on EXPECTED's
      input_ids / labels must equal EXPECTED's loom_loss within 1e-4 relative, and its logits
      loom_logits within 1e-4 relative to their largest.
"""
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
warnings.filterwarnings("ignore")

import torch
from safetensors import safe_open
from safetensors.torch import load_file


def format_check(path):
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    with safe_open(path, "pt") as f:
        meta = f.metadata() or {}
    t = load_file(path)
    failures = 0
    cases = sorted(k for k in meta if k.startswith("case"))
    for name in cases:
        quant_type, nested = meta[name].split(",")
        w = t[f"{name}.weight"]
        q, state = F.quantize_4bit(w, blocksize=64, quant_type=quant_type, compress_statistics=nested == "1")
        pairs = [("packed", q, t[f"{name}.packed"]), ("absmax", state.absmax, t[f"{name}.absmax"])]
        if nested == "1":
            pairs += [("nested_absmax", state.state2.absmax, t[f"{name}.nested_absmax"]),
                      ("offset", state.offset.reshape(()), t[f"{name}.offset"].reshape(())),
                      ("nested_code", state.state2.code, t[f"{name}.nested_code"])]
        pairs.append(("dequantized", F.dequantize_4bit(q, state), t[f"{name}.dequantized"]))
        if f"{name}.x" in t:
            x = t[f"{name}.x"].clone().requires_grad_(True)
            y = bnb.matmul_4bit(x, q.t(), quant_state=state)
            y.backward(t[f"{name}.grad_out"])
            pairs += [("matmul_4bit", y.detach(), t[f"{name}.y"]), ("grad_x", x.grad, t[f"{name}.grad_x"])]
        bad = [k for k, theirs, ours in pairs
               if theirs.dtype != ours.dtype or theirs.shape != ours.shape or not torch.equal(theirs, ours)]
        print(f"{name} ({quant_type}, nested {nested}, {tuple(w.shape)} {w.dtype}): "
              + ("equal" if not bad else "differs in " + ", ".join(bad)))
        for k, theirs, ours in pairs:
            if k in bad:
                print(f"  {k}: bitsandbytes {tuple(theirs.shape)} {theirs.dtype}, loom {tuple(ours.shape)} {ours.dtype}")
                if theirs.shape == ours.shape and theirs.dtype == ours.dtype:
                    diff = (theirs.float() - ours.float()).abs()
                    print(f"    {int((diff > 0).sum())} of {diff.numel()} differ, at most {diff.max().item():.3g}")
        failures += bool(bad)
    print(f"{len(cases)} cases, {failures} differ")
    return 0 if cases and failures == 0 else 1


def model_check(base, adapter, expected, quant_type, nested):
    import bitsandbytes as bnb
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                bnb_4bit_use_double_quant=nested == "1", bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(base, quantization_config=config, device_map="cpu",
                                                 dtype=torch.float32)
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    # On a CPU with AVX512-BF16, Linear4bit's inference path repacks the weight for a bf16
    # kernel; the float32 path (dequantize, then linear) is the one being compared.
    for m in layers:
        m.support_avx512bf16_for_cpu = False
    t = load_file(expected)
    ours = t["q_proj_packed"]
    theirs = model.model.layers[0].self_attn.q_proj.weight.data
    if theirs.shape != ours.shape or not torch.equal(theirs.view(torch.uint8), ours):
        print("layer 0's q_proj: transformers' 4-bit codes differ from loom's")
        return 1
    peft_model = PeftModel.from_pretrained(model, adapter)
    peft_model.eval()
    with torch.no_grad():
        out = peft_model(input_ids=t["input_ids"], labels=t["labels"])
    loss_rel = ((out.loss - t["loom_loss"].reshape(())).abs() / t["loom_loss"].abs()).item()
    want = t["loom_logits"]
    rel = ((out.logits.float() - want).abs().max() / want.abs().max()).item()
    print(f"{len(layers)} Linear4bit layers; peft on loom's adapter: loss {out.loss.item():.6f} "
          f"({loss_rel:.3g} relative), logits {rel:.3g} relative")
    return 0 if loss_rel <= 1e-4 and rel <= 1e-4 else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "format":
        return format_check(sys.argv[2])
    if len(sys.argv) == 7 and sys.argv[1] == "model":
        return model_check(*sys.argv[2:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
