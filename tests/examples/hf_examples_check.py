#!/usr/bin/env python3
"""Checks of the gpt2 and bert_classify example runs (tests/examples/*_gpt2.cmake, smoke_bert_classify.cmake).

  hf_examples_check.py kjv_data --kjv_text EXE --out DIR
      the fixture: a tiny KJV token folder (2000 verses, a 512-token BPE) from kjv_text and kjv.py
  hf_examples_check.py resumed --straight DIR --resumed DIR --from_step N
      a run resumed from checkpoint-N of `straight` logs the same losses after step N and ends
      with the same train_loss, eval_loss and global_step
  hf_examples_check.py same --keys K... -- DIR...
      the runs' all_results.json agree on the keys (relative 1e-5) and their model.safetensors
      hold the same names and shapes (every rank's part gathered)
  hf_examples_check.py same_weights [--rtol R] [--bitwise DIR DIR] -- DIR...
      transformers opens each folder as a causal LM (AutoModelForCausalLM, float32) and every
      folder's state_dict holds the same names, shapes and values (each tensor within R of the
      first folder's, relative to its largest magnitude); the two --bitwise folders exactly
  hf_examples_check.py transformers --model DIR --data DIR --results FILE [--block_size N | --max_seq_length N]
      transformers opens the saved folder (model and tokenizer) and, in fp32, gets the held-out
      eval_loss (and for BERT eval_accuracy) that loom reported in FILE
  hf_examples_check.py set_label --data DIR --out DIR --split NAME --example I --value V
      a copy of the token folder DIR whose classification split NAME gives example I the label V
  hf_examples_check.py kjv_sft_data --kjv_text EXE --out DIR
      the llama_sft fixture: KJV instructions (1500 verses) as SFT token files, a 512-token BPE
  hf_examples_check.py peft --output DIR --data DIR --results FILE
      PEFT opens the adapter folder DIR onto the base its adapter_config.json names, with the
      logits of the merged folder DIR/merged, and in fp32 gets the held-out completion loss
      (one example per batch, prompt labelled -100) that loom reported in FILE
  hf_examples_check.py complete --model DIR --prompt TEXT --max_new_tokens N --log FILE
      transformers' greedy generate on DIR (its tokenizer encoding TEXT) gives the completion that
      an example's --prompt printed into FILE ("<program>: completion \"...\"")
  hf_examples_check.py predictions --model DIR --prompts FILE --predictions FILE --max_new_tokens N
      each line of an example's --predict_file output is transformers' greedy completion of its
      prompt, generated alone, with the same token counts
  hf_examples_check.py classify --model DIR --data DIR --sentence TEXT --max_seq_length N --log FILE
      transformers' BertForSequenceClassification on DIR, the sentence encoded as prepare.py
      encodes an example ([CLS] text [SEP]), gives the labels and probabilities that
      bert_classify's --predict printed into FILE
  hf_examples_check.py family_folders --data DIR --out DIR
      a tiny random folder, saved by transformers, of each family loom's Llama architecture reads
      (tests/hf/compare.py's facts, llama with llama3 rope), sized to DIR's vocabulary: OUT/<model_type>
  hf_examples_check.py families --folders DIR --runs DIR --data DIR --prompt TEXT --prompts FILE --max_new_tokens N
      for each family folder, llama_sft's runs in RUNS/<model_type> (families_llama_sft.cmake): the
      adapter targets PEFT's default modules (loom refused, in refused.log, exactly the families
      PEFT has none for); PEFT opens the adapter onto the folder with the merged folder's logits,
      which the adapter changed; transformers' greedy generate on the merged folder gives the
      completion --prompt printed (generate.log) and each line of --predict_file's
      predictions.jsonl; the full fine-tuning run's folder, where there is one, gives the
      completion its --prompt printed after training (full.log)
  hf_examples_check.py kjv_dpo_data --kjv_text EXE --out DIR
      the llama_dpo fixture: KJV preference pairs (400 verses) as preference token files
  hf_examples_check.py same_logs --keys K... [--rtol R] -- DIR...
      the runs' trainer_state.json logged the same values of the keys at every training step
  hf_examples_check.py reward_model --model DIR --data DIR --results FILE --batch N --max_length N
      transformers opens DIR as a sequence classifier with one label and, batch by batch over
      the held-out pairs, gets the eval_accuracy and eval_margin loom reported in FILE

Each prints one "... ok" line or exits non-zero with the reason.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = os.path.dirname(os.path.abspath(__file__))


# The Python that runs the tools: the tests' warm one when this runs under it (tests/warm_python.py).
PYTHON = os.environ.get("LOOM_WARM_PYTHON_CLIENT", sys.executable)

def fail(message):
    sys.exit(f"hf_examples_check: {message}")


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")


def close(a, b, rtol):
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(abs(a), abs(b))


def kjv_data(opts):
    kjv = os.path.join(HERE, "..", "..", "examples", "text_data", "kjv.py")
    done = subprocess.run([PYTHON, kjv, "--kjv_text", opts.kjv_text, "--out", opts.out,
                           "--limit", "2000", "--vocab_size", "512"], capture_output=True, text=True)
    print(done.stdout + done.stderr, end="")
    if done.returncode != 0:
        fail(f"kjv.py exited with {done.returncode}")
    meta = read_json(os.path.join(opts.out, "meta.json"))
    if meta["vocab_size"] != 512 or len(meta["classification"]["label_names"]) != 7:
        fail(f"unexpected meta.json: vocab_size {meta['vocab_size']}")
    print("kjv data ok")


def kjv_sft_data(opts):
    root = os.path.join(HERE, "..", "..", "examples", "text_data")
    os.makedirs(opts.out, exist_ok=True)
    pairs = os.path.join(opts.out, "instructions.jsonl")
    for cmd in ([os.path.join(root, "kjv.py"), "--kjv_text", opts.kjv_text, "--instructions", pairs, "--limit", "1500"],
                [os.path.join(root, "prepare.py"), "--sft", pairs, "--out", opts.out, "--vocab_size", "512"]):
        done = subprocess.run([PYTHON] + cmd, capture_output=True, text=True)
        print(done.stdout + done.stderr, end="")
        if done.returncode != 0:
            fail(f"{os.path.basename(cmd[0])} exited with {done.returncode}")
    meta = read_json(os.path.join(opts.out, "meta.json"))
    if meta["vocab_size"] != 512 or sorted(meta["sft"]) != ["format", "train", "val"]:
        fail(f"unexpected meta.json: vocab_size {meta['vocab_size']}, sft {sorted(meta.get('sft', {}))}")
    print("kjv sft data ok")


def sft_val(data):
    """The held-out instruction files of a prepare.py --sft folder: ids, offsets, loss mask."""
    import numpy as np

    meta = read_json(os.path.join(data, "meta.json"))
    files = meta["sft"]["val"]
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    ids = np.fromfile(os.path.join(data, files["ids"]), dtype=dtype).astype(np.int64)
    offsets = np.fromfile(os.path.join(data, files["offsets"]), dtype="<u8").astype(np.int64)
    return ids, offsets, np.fromfile(os.path.join(data, files["mask"]), dtype=np.uint8)


def peft_check(opts):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    adapter = read_json(os.path.join(opts.output, "adapter_config.json"))
    base = adapter["base_model_name_or_path"]
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), opts.output).eval()
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(opts.output, "merged"), dtype=torch.float32).eval()
    ids, offsets, mask = sft_val(opts.data)
    reported = read_json(opts.results)
    losses, worst = [], 0.0
    with torch.no_grad():
        for i, (b, e) in enumerate(zip(offsets[:-1], offsets[1:])):
            x = torch.from_numpy(ids[b:e]).unsqueeze(0)
            labels = torch.where(torch.from_numpy(mask[b:e].astype(np.int64)).unsqueeze(0) == 1, x, -100)
            logits = model(input_ids=x).logits
            if i < 8:
                m = merged(input_ids=x).logits
                worst = max(worst, float((logits - m).abs().max() / m.abs().max()))
            losses.append(F.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100))
    loss = float(torch.stack(losses).mean())
    if worst > 1e-5:
        fail(f"PEFT's adapted logits differ from the merged folder's by {worst:.3g} (relative)")
    if not close(loss, reported["eval_loss"], opts.rtol):
        fail(f"PEFT's held-out completion loss {loss!r}, loom's eval_loss {reported['eval_loss']!r}")
    print(f"peft ok: adapter on {base}, merged logits {worst:.2g} relative, held-out loss {loss:.6f} "
          f"(loom {reported['eval_loss']:.6f})")


def generate_check(opts):
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    from transformers import AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(opts.model)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    ids, offsets, mask = sft_val(opts.data)
    reported = read_json(opts.results)
    right = rows = tokens = same = text_right = 0
    texts, references = [], []
    written = []
    if opts.generations:
        with open(opts.generations, encoding="utf-8") as f:
            written = [json.loads(line) for line in f]
    with torch.no_grad():
        for b, e in zip(offsets[:-1], offsets[1:]):
            m = mask[b:e].copy()
            m[0] = 0  # an example's first token is never labelled
            first = int(np.argmax(m == 1))
            last = int(len(m) - 1 - np.argmax(m[::-1] == 1))
            prompt = torch.from_numpy(ids[b:b + first]).unsqueeze(0)
            reference = torch.from_numpy(ids[b + first:b + last + 1])
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                 max_new_tokens=len(reference))[0, first:]
            n = min(len(out), len(reference))
            same += int((out[:n] == reference[:n]).sum())
            tokens += len(reference)
            right += int(n == len(reference) and bool((out[:n] == reference).all()))
            # HF evaluate's exact_match on the texts: the completion through its end of text and
            # the reference, decoded without special tokens, stripped.
            kept = out.tolist()
            for i, t in enumerate(kept):
                if t in eos:
                    kept = kept[: i + 1]
                    break
            text = tokenizer.decode(kept, skip_special_tokens=True).strip()
            wanted = tokenizer.decode(reference.tolist(), skip_special_tokens=True).strip()
            text_right += int(text == wanted)
            texts.append(text)
            references.append(wanted)
            if written and (written[rows]["completion"] != text or written[rows]["reference"] != wanted):
                fail(f"row {rows}: loom wrote {written[rows]!r}; transformers: {text!r}, reference {wanted!r}")
            rows += 1
    exact, text_exact = right / rows, text_right / rows
    if abs(exact - reported["eval_token_exact_match"]) > 0.5 / rows:
        fail(f"transformers' greedy token exact match {exact!r}, loom's eval_token_exact_match "
             f"{reported['eval_token_exact_match']!r}")
    if abs(text_exact - reported["eval_exact_match"]) > 0.5 / rows:
        fail(f"transformers' greedy text exact match {text_exact!r}, loom's eval_exact_match {reported['eval_exact_match']!r}")
    if written and len(written) != rows:
        fail(f"{opts.generations}: {len(written)} rows for {rows} held-out prompts")
    # ROUGE-L (rouge-score, evaluate's defaults, each pair's F averaged) and sacrebleu's corpus
    # BLEU of the same texts.
    import sacrebleu
    from rouge_score import rouge_scorer
    scorer = rouge_scorer.RougeScorer(["rougeL"])
    rouge_l = sum(scorer.score(r, t)["rougeL"].fmeasure for t, r in zip(texts, references)) / rows
    bleu = sacrebleu.corpus_bleu(texts, [references]).score
    for name, value in (("eval_rougeL", rouge_l), ("eval_bleu", bleu)):
        if abs(value - reported[name]) > 1e-9 * max(1.0, abs(value)):
            fail(f"rouge-score / sacrebleu give {name[5:]} {value!r} on transformers' completions, loom's {name} "
                 f"{reported[name]!r}")
    print(f"generate ok: {rows} held-out prompts, exact match {text_exact:.4f} on the texts (loom "
          f"{reported['eval_exact_match']:.4f}), {exact:.4f} token for token (loom {reported['eval_token_exact_match']:.4f}), "
          f"{same} of {tokens} reference tokens generated in place" + (", each row as written" if written else "") +
          f"; rougeL {rouge_l:.6f}, BLEU {bleu:.4f} as loom's")


def printed(log, label):
    """The text after `label` on the line of `log` that has it: a {fmt} {:?} string unescaped."""
    with open(log, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if label in line]
    if not lines:
        fail(f"{log}: no line with {label!r}")
    text = lines[-1].split(label, 1)[1]
    if not (text.startswith('"') and text.endswith('"')):
        fail(f"{log}: {label!r} is not followed by a quoted string: {text!r}")
    out, i, body = [], 0, text[1:-1]
    simple = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
        elif body[i + 1] in simple:
            out.append(simple[body[i + 1]])
            i += 2
        elif body[i + 1] in "xuU":  # {fmt}'s \xHH, \uHHHH, \UHHHHHHHH (a code point's hex digits)
            width = {"x": 2, "u": 4, "U": 8}[body[i + 1]]
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            fail(f"{log}: unknown escape {body[i:i + 2]!r}")
    return "".join(out)


def greedy(model, tokenizer, prompt, max_new_tokens):
    """transformers' greedy completion of `prompt` (encoded by `tokenizer`) on `model`, generated alone:
    the prompt's token count, the generated ids through the first end of text, and their text
    decoded without special tokens."""
    import torch

    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens)[0, ids.shape[1]:]
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    kept = out.tolist()
    for i, t in enumerate(kept):
        if t in eos:
            kept = kept[: i + 1]
            break
    return ids.shape[1], kept, tokenizer.decode(kept, skip_special_tokens=True)


def check_completion(model, tokenizer, log, prompt, max_new_tokens, where=""):
    """The completion an example's --prompt printed into `log` is transformers' greedy one; returns the
    prompt's and the completion's token counts."""
    printed_prompt = printed(log, ": prompt ")
    if printed_prompt.rstrip() != prompt.rstrip():
        fail(f"{where}the example completed {printed_prompt!r}, not the prompt given {prompt!r}")
    prompt_tokens, kept, expected = greedy(model, tokenizer, printed_prompt, max_new_tokens)
    got = printed(log, ": completion ")
    if got != expected:
        fail(f"{where}the example printed the completion {got!r}, transformers generates {expected!r}")
    return prompt_tokens, len(kept)


def check_predictions(model, tokenizer, prompts, predictions, max_new_tokens, where=""):
    """Each line of a --predict_file run's predictions.jsonl is transformers' greedy completion of its
    prompt, generated alone (the example generated them in left-padded batches); returns the count."""
    with open(prompts, encoding="utf-8") as f:
        given = [json.loads(line)["prompt"] for line in f if line.strip()]
    with open(predictions, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    if len(rows) != len(given):
        fail(f"{predictions}: {len(rows)} lines for {len(given)} prompts")
    for prompt, row in zip(given, rows):
        if row["prompt"].rstrip() != prompt.rstrip():
            fail(f"{where}line for {prompt!r} holds the prompt {row['prompt']!r}")
        prompt_tokens, kept, expected = greedy(model, tokenizer, row["prompt"], max_new_tokens)
        if row["completion"] != expected or row["prompt_tokens"] != prompt_tokens or row["completion_tokens"] != len(kept):
            fail(f"{where}{prompt!r}: the example wrote {row!r}; transformers generates {expected!r} "
                 f"({prompt_tokens} prompt tokens, {len(kept)} generated)")
    return len(rows)


def complete_check(opts):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(opts.model)
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32).eval()
    prompt_tokens, generated = check_completion(model, tokenizer, opts.log, opts.prompt, opts.max_new_tokens)
    print(f"complete ok: {generated} tokens generated after {prompt_tokens} prompt tokens, the same text as transformers")


def predictions_check(opts):
    """Each line of a --predict_file run's predictions.jsonl is transformers' greedy completion of its prompt,
    generated alone (the example generated them in left-padded batches)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(opts.model)
    model = AutoModelForCausalLM.from_pretrained(opts.model, dtype=torch.float32).eval()
    rows = check_predictions(model, tokenizer, opts.prompts, opts.predictions, opts.max_new_tokens)
    print(f"predictions ok: {rows} prompts, each completion transformers' greedy one generated alone")


def family_facts():
    """The families of loom/models/llama.hpp as tests/hf/compare.py makes them: FAMILY_BASE, each
    family's own keys, and the attention transformers runs it with; llama with llama3 rope."""
    sys.path.insert(0, os.path.join(HERE, "..", "hf"))
    from compare import FAMILIES, FAMILY_BASE, LLAMA, family_attention

    return FAMILY_BASE, {"llama": dict(rope_parameters=LLAMA["rope_parameters"]), **FAMILIES}, family_attention


# The family folders' positions: as many as the runs' packed windows and generated texts need.
FAMILY_POSITIONS = 256


def family_folders(opts):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    base, families, attention = family_facts()
    meta = read_json(os.path.join(opts.data, "meta.json"))
    for family, keys in families.items():
        torch.manual_seed(0)
        config = {**base, **keys, "vocab_size": meta["vocab_size"], "max_position_embeddings": FAMILY_POSITIONS,
                  "bos_token_id": meta["eos_token_id"], "eos_token_id": meta["eos_token_id"],
                  "pad_token_id": meta["pad_token_id"]}
        if "original_max_position_embeddings" in config:  # Phi-3: no long-context scaling at these lengths
            config["original_max_position_embeddings"] = FAMILY_POSITIONS
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config),
                                                 attn_implementation=attention(family))
        model.save_pretrained(os.path.join(opts.out, family))
    print(f"family folders ok: {' '.join(families)} in {opts.out}")


def families_check(opts):
    import numpy as np
    import torch
    from peft import PeftModel
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_defaults
    from transformers import AutoModelForCausalLM, TokenizersBackend

    torch.set_num_threads(1)
    _, families, attention = family_facts()
    # The folders' tokenizer.json as tokenizer_config.json names it (TokenizersBackend): the
    # fixture's BPE, which the example encodes with. Not AutoTokenizer, which for a qwen2 config
    # makes a Qwen2Tokenizer instead, Qwen2's own pre-tokenizer (digits one by one) over it.
    tokenizer_of = TokenizersBackend.from_pretrained
    ids, offsets, _ = sft_val(opts.data)
    rows = [torch.from_numpy(ids[b:e]).unsqueeze(0) for b, e in zip(offsets[:2], offsets[1:3])]

    def load(folder, family):
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                    attn_implementation=attention(family)).eval()

    for family in families:
        where = f"{family}: "
        folder, runs = os.path.join(opts.folders, family), os.path.join(opts.runs, family)
        lora = os.path.join(runs, "lora")
        if read_json(os.path.join(folder, "config.json"))["model_type"] != family:
            fail(f"{where}{folder} is not a {family} folder")
        # The targets: PEFT's defaults for the model type; where PEFT has none, loom refused the
        # run without --lora_target_modules, as PEFT refuses it.
        adapter = read_json(os.path.join(lora, "adapter_config.json"))
        refused = os.path.join(runs, "refused.log")
        if family in peft_defaults:
            if os.path.exists(refused):
                fail(f"{where}loom refused the default targets, PEFT's are {peft_defaults[family]}")
            if sorted(adapter["target_modules"]) != sorted(peft_defaults[family]):
                fail(f"{where}the adapter targets {adapter['target_modules']}, PEFT's default {peft_defaults[family]}")
            targets = "PEFT's default targets"
        else:
            if not os.path.exists(refused):
                fail(f"{where}PEFT has no default targets for it, and loom did not refuse the run without them")
            with open(refused, encoding="utf-8") as f:
                if f'PEFT has no default target modules for model type "{family}"' not in f.read():
                    fail(f"{where}{refused} does not hold loom's refusal of the default targets")
            targets = f"targets {adapter['target_modules']} (PEFT has no default)"
        if os.path.realpath(adapter["base_model_name_or_path"]) != os.path.realpath(folder):
            fail(f"{where}the adapter names the base {adapter['base_model_name_or_path']}, not {folder}")
        # PEFT's adapter on the folder is the merged folder, and not the folder itself.
        merged = load(os.path.join(lora, "merged"), family)
        peft = PeftModel.from_pretrained(load(folder, family), lora).eval()
        worst = moved = 0.0
        with torch.no_grad():
            for x in rows:
                m, a = merged(input_ids=x).logits, peft(input_ids=x).logits
                with peft.disable_adapter():
                    b = peft(input_ids=x).logits
                worst = max(worst, float((a - m).abs().max() / m.abs().max()))
                moved = max(moved, float((a - b).abs().max() / b.abs().max()))
        if worst > 1e-5:
            fail(f"{where}PEFT's adapted logits differ from the merged folder's by {worst:.3g} (relative)")
        if moved < 1e-3:
            fail(f"{where}the trained adapter moves the logits by {moved:.3g} only (relative): it was not trained")
        # Generation from the merged folder: --prompt and --predict_file.
        tokenizer = tokenizer_of(os.path.join(lora, "merged"))
        _, generated = check_completion(merged, tokenizer, os.path.join(runs, "generate.log"), opts.prompt,
                                        opts.max_new_tokens, where)
        predicted = check_predictions(merged, tokenizer, opts.prompts,
                                      os.path.join(runs, "generate", "predictions.jsonl"), opts.max_new_tokens, where)
        line = (f"{family}: {targets}; PEFT's logits the merged folder's ({worst:.2g}), moved {moved:.2g} by the "
                f"adapter; --prompt's {generated} tokens and {predicted} --predict_file completions transformers' greedy ones")
        full = os.path.join(runs, "full")
        if os.path.isdir(full):
            if os.path.exists(os.path.join(full, "adapter_config.json")):
                fail(f"{where}the full fine-tuning run wrote an adapter")
            model = load(full, family)
            _, generated = check_completion(model, tokenizer_of(full), os.path.join(runs, "full.log"),
                                            opts.prompt, opts.max_new_tokens, where + "full fine-tuning: ")
            line += f"; full fine-tuning's folder generates its {generated} tokens"
        print(line)
    print(f"families ok: {len(families)}")


def classify_check(opts):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.set_num_threads(1)
    meta = read_json(os.path.join(opts.data, "meta.json"))
    tokenizer = AutoTokenizer.from_pretrained(opts.model)
    model = BertForSequenceClassification.from_pretrained(opts.model).eval()
    body = tokenizer(opts.sentence, add_special_tokens=False)["input_ids"][: opts.max_seq_length - 2]
    ids = torch.tensor([[meta["cls_token_id"]] + body + [meta["sep_token_id"]]])
    with torch.no_grad():
        probs = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].softmax(-1)
    order = probs.argsort(descending=True).tolist()
    names = model.config.id2label
    listed = ", ".join(f"{names[i]} {float(probs[i]):.6f}" for i in order[:3])
    expected = f"bert_classify: predicted {names[order[0]]} (softmax, most likely first: {listed})"
    with open(opts.log, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f if line.startswith("bert_classify: predicted ")]
    if not lines:
        fail(f"{opts.log}: no 'bert_classify: predicted' line")
    got = lines[-1]
    # The probabilities may differ in the last printed digit (float32 on both sides).
    got_pairs = re.findall(r"([^\s:,]+) (\d+\.\d+)", got.split("(", 1)[-1])
    want_pairs = [(names[i], float(probs[i])) for i in order[:3]]
    if got.split("(")[0] != expected.split("(")[0] or [n for n, _ in got_pairs] != [n for n, _ in want_pairs] or \
            any(abs(float(a) - b) > 2e-6 for (_, a), (_, b) in zip(got_pairs, want_pairs)):
        fail(f"the example printed {got!r}, transformers gives {expected!r}")
    print(f"classify ok: {expected}")


def set_label(opts):
    import shutil
    import struct
    shutil.rmtree(opts.out, ignore_errors=True)
    shutil.copytree(opts.data, opts.out)
    labels = read_json(os.path.join(opts.out, "meta.json"))["classification"][opts.split]["labels"]
    with open(os.path.join(opts.out, labels), "r+b") as f:
        f.seek(8 * opts.example)
        f.write(struct.pack("<q", opts.value))
    print("set label ok")


def losses_by_step(state):
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


def resumed(opts):
    s_state = read_json(os.path.join(opts.straight, "trainer_state.json"))
    r_state = read_json(os.path.join(opts.resumed, "trainer_state.json"))
    if s_state["global_step"] != r_state["global_step"]:
        fail(f"global_step {r_state['global_step']} after resume, {s_state['global_step']} straight")
    straight, again = losses_by_step(s_state), losses_by_step(r_state)
    after = sorted(step for step in straight if step > opts.from_step)
    if not after or [s for s in sorted(again) if s > opts.from_step] != after:
        fail(f"logged steps after {opts.from_step}: straight {after}, resumed {sorted(again)}")
    for step in after:
        if not close(straight[step], again[step], 1e-6):
            fail(f"step {step}: loss {again[step]!r} after resume, {straight[step]!r} straight")
    s_all = read_json(os.path.join(opts.straight, "all_results.json"))
    r_all = read_json(os.path.join(opts.resumed, "all_results.json"))
    for key in ("train_loss", "eval_loss"):
        if not close(s_all[key], r_all[key], 1e-6):
            fail(f"{key} {r_all[key]!r} after resume, {s_all[key]!r} straight")
    print(f"resume ok: steps {after} logged the same losses, train_loss {r_all['train_loss']:.6f}, "
          f"eval_loss {r_all['eval_loss']:.6f}")


def kjv_dpo_data(opts):
    root = os.path.join(HERE, "..", "..", "examples", "text_data")
    os.makedirs(opts.out, exist_ok=True)
    pairs = os.path.join(opts.out, "preferences.jsonl")
    for cmd in ([os.path.join(root, "kjv.py"), "--kjv_text", opts.kjv_text, "--preferences", pairs, "--limit", "400"],
                [os.path.join(root, "prepare.py"), "--preference", pairs, "--out", opts.out, "--vocab_size", "512",
                 "--val_fraction", "0.1"]):
        done = subprocess.run([PYTHON] + cmd, capture_output=True, text=True)
        print(done.stdout + done.stderr, end="")
        if done.returncode != 0:
            fail(f"{os.path.basename(cmd[0])} exited with {done.returncode}")
    meta = read_json(os.path.join(opts.out, "meta.json"))
    if meta["vocab_size"] != 512 or sorted(meta.get("preference", {})) != ["format", "margin", "train", "val"]:
        fail(f"unexpected meta.json: vocab_size {meta['vocab_size']}, preference {sorted(meta.get('preference', {}))}")
    print("kjv dpo data ok")


def same_logs(opts):
    """The runs logged the same values of opts.keys at every training step (within opts.rtol)."""
    first = None
    for d in opts.dirs:
        logs = [e for e in read_json(os.path.join(d, "trainer_state.json"))["log_history"] if "loss" in e]
        table = {e["step"]: {k: e[k] for k in opts.keys} for e in logs}
        if not table:
            fail(f"{d}: no training log")
        if first is None:
            first = (d, table)
            continue
        if sorted(table) != sorted(first[1]):
            fail(f"{d} logged steps {sorted(table)}, {first[0]} {sorted(first[1])}")
        for step, values in table.items():
            for k, v in values.items():
                w = first[1][step][k]
                if not (abs(v - w) <= opts.rtol * max(1.0, abs(w))):
                    fail(f"step {step}: {d} logged {k} {v!r}, {first[0]} {w!r}")
    print(f"same logs ok: {len(opts.dirs)} runs, {len(first[1])} steps, " + ", ".join(opts.keys))


def pref_split(data, split):
    """The (chosen, rejected) token rows of a prepare.py --preference split, prompt and completion."""
    import numpy as np

    meta = read_json(os.path.join(data, "meta.json"))
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    sides = []
    for side in ("chosen", "rejected"):
        files = meta["preference"][split][side]
        ids = np.fromfile(os.path.join(data, files["ids"]), dtype=dtype).astype(np.int64)
        offsets = np.fromfile(os.path.join(data, files["offsets"]), dtype="<u8").astype(np.int64)
        sides.append([ids[a:b] for a, b in zip(offsets[:-1], offsets[1:])])
    return list(zip(*sides))


def reward_model_check(opts):
    """transformers opens the reward model (one label) and scores the held-out pairs as loom reported."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.set_num_threads(1)
    config = AutoConfig.from_pretrained(opts.model)
    if config.num_labels != 1 or config.architectures != ["LlamaForSequenceClassification"]:
        fail(f"{opts.model}: num_labels {config.num_labels}, architectures {config.architectures}")
    model = AutoModelForSequenceClassification.from_pretrained(opts.model, dtype=torch.float32).eval()
    reported = read_json(opts.results)
    pairs = pref_split(opts.data, "val")
    accuracies, margins = [], []
    with torch.no_grad():
        for start in range(0, len(pairs), opts.batch):  # TRL's metrics: the mean of the batches' means
            chunk = pairs[start:start + opts.batch]
            score = lambda row: float(model(input_ids=torch.tensor(row[: opts.max_length])[None]).logits[0, 0])
            chosen = torch.tensor([score(c) for c, _ in chunk])
            rejected = torch.tensor([score(r) for _, r in chunk])
            accuracies.append(float((chosen > rejected).float().mean()))
            margins.append(float((chosen - rejected).mean()))
    accuracy, margin = sum(accuracies) / len(accuracies), sum(margins) / len(margins)
    if abs(accuracy - reported["eval_accuracy"]) > 1e-6 or abs(margin - reported["eval_margin"]) > 1e-4 * max(1, abs(margin)):
        fail(f"transformers: accuracy {accuracy!r}, margin {margin!r}; loom: eval_accuracy "
             f"{reported['eval_accuracy']!r}, eval_margin {reported['eval_margin']!r}")
    print(f"reward model ok: {len(pairs)} held-out pairs, accuracy {accuracy:.4f}, margin {margin:.6f} as loom reports")


def same(opts):
    from safetensors import safe_open

    first = None
    for d in opts.dirs:
        results = read_json(os.path.join(d, "all_results.json"))
        weights = os.path.join(d, "model.safetensors")
        if not os.path.exists(weights):  # a LoRA run saves its adapter
            weights = os.path.join(d, "adapter_model.safetensors")
        with safe_open(weights, "pt") as f:
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        values = {k: results[k] for k in opts.keys}
        if first is None:
            first = (d, values, shapes)
            continue
        if shapes != first[2]:
            fail(f"{d}/model.safetensors holds other tensors than {first[0]}'s")
        for k in opts.keys:
            if not close(values[k], first[1][k], 1e-5):
                fail(f"{d}: {k} {values[k]!r}, {first[0]}: {first[1][k]!r}")
    print(f"same results ok: {len(opts.dirs)} runs, " + ", ".join(f"{k} {first[1][k]:.6f}" for k in opts.keys))


def same_weights(opts):
    import torch
    from transformers import AutoModelForCausalLM

    first, worst, states = None, 0.0, {}
    for d in opts.dirs:
        state = {k: v.float() for k, v in AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).state_dict().items()}
        states[d] = state
        if first is None:
            first = (d, state)
            continue
        if {k: tuple(v.shape) for k, v in state.items()} != {k: tuple(v.shape) for k, v in first[1].items()}:
            fail(f"{d} holds other tensors than {first[0]}")
        for k, v in state.items():
            ref = first[1][k]
            diff = float((v - ref).abs().max()) / max(float(ref.abs().max()), 1e-30)
            worst = max(worst, diff)
            if not diff <= opts.rtol:
                fail(f"{d}: {k} differs from {first[0]}'s by {diff:.3g} (relative), more than {opts.rtol}")
    line = f"same weights ok: {len(opts.dirs)} folders, {len(first[1])} tensors, largest difference {worst:.3g} (relative)"
    if opts.bitwise:
        a, b = (states[d] for d in opts.bitwise)
        for k, v in a.items():
            if not torch.equal(v, b[k]):
                fail(f"{opts.bitwise[1]}: {k} is not bitwise {opts.bitwise[0]}'s")
        line += f"; {opts.bitwise[0]} and {opts.bitwise[1]} bitwise"
    print(line)


def transformers_check(opts):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification, GPT2LMHeadModel

    torch.set_num_threads(1)
    meta = read_json(os.path.join(opts.data, "meta.json"))
    dtype = np.uint16 if meta["dtype"] == "uint16" else np.uint32
    reported = read_json(opts.results)
    AutoTokenizer.from_pretrained(opts.model)  # the tokenizer files were saved beside the model
    arch = AutoConfig.from_pretrained(opts.model).architectures[0]
    losses, correct, rows = [], 0, 0
    with torch.no_grad():
        if arch == "GPT2LMHeadModel":
            model = GPT2LMHeadModel.from_pretrained(opts.model).eval()
            ids = np.fromfile(os.path.join(opts.data, meta["lm"]["val"]["file"]), dtype=dtype).astype(np.int64)
            n = len(ids) // opts.block_size
            windows = torch.from_numpy(ids[: n * opts.block_size].reshape(n, opts.block_size))
            for batch in windows.split(32):
                losses.append(model(input_ids=batch, labels=batch).loss * len(batch))
                rows += len(batch)
        elif arch == "BertForSequenceClassification":
            model = BertForSequenceClassification.from_pretrained(opts.model).eval()
            files = meta["classification"]["val"]
            ids = np.fromfile(os.path.join(opts.data, files["ids"]), dtype=dtype).astype(np.int64)
            offsets = np.fromfile(os.path.join(opts.data, files["offsets"]), dtype="<u8").astype(np.int64)
            labels = torch.from_numpy(np.fromfile(os.path.join(opts.data, files["labels"]), dtype="<i8"))
            seqs = [ids[b:e][: opts.max_seq_length] for b, e in zip(offsets[:-1], offsets[1:])]
            for start in range(0, len(seqs), 32):
                part = seqs[start:start + 32]
                width = max(len(s) for s in part)
                input_ids = torch.full((len(part), width), meta["pad_token_id"], dtype=torch.long)
                mask = torch.zeros((len(part), width), dtype=torch.long)
                for i, s in enumerate(part):
                    input_ids[i, : len(s)] = torch.from_numpy(s)
                    mask[i, : len(s)] = 1
                logits = model(input_ids=input_ids, attention_mask=mask).logits
                target = labels[start:start + len(part)]
                losses.append(F.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(-1) == target).sum())
                rows += len(part)
        else:
            fail(f"{opts.model}: unexpected architecture {arch}")
    loss = float(torch.stack(losses).sum()) / rows
    if not close(loss, reported["eval_loss"], opts.rtol):
        fail(f"transformers' held-out loss {loss!r}, loom's eval_loss {reported['eval_loss']!r}")
    line = f"transformers ok: {arch} from {opts.model}, held-out loss {loss:.6f} (loom {reported['eval_loss']:.6f})"
    if arch == "BertForSequenceClassification":
        accuracy = correct / rows
        if abs(accuracy - reported["eval_accuracy"]) > 0.5 / rows:
            fail(f"transformers' accuracy {accuracy!r}, loom's eval_accuracy {reported['eval_accuracy']!r}")
        line += f", accuracy {accuracy:.4f} (loom {reported['eval_accuracy']:.4f})"
    print(line)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kjv_data")
    k.add_argument("--kjv_text", required=True)
    k.add_argument("--out", required=True)
    r = sub.add_parser("resumed")
    r.add_argument("--straight", required=True)
    r.add_argument("--resumed", required=True)
    r.add_argument("--from_step", type=int, required=True)
    s = sub.add_parser("same")
    s.add_argument("--keys", nargs="+", required=True)
    s.add_argument("dirs", nargs="+")
    w = sub.add_parser("same_weights")
    w.add_argument("--rtol", type=float, default=1e-5)
    w.add_argument("--bitwise", nargs=2, default=None)
    w.add_argument("dirs", nargs="+")
    t = sub.add_parser("transformers")
    t.add_argument("--model", required=True)
    t.add_argument("--data", required=True)
    t.add_argument("--results", required=True)
    t.add_argument("--block_size", type=int, default=128)
    t.add_argument("--max_seq_length", type=int, default=128)
    t.add_argument("--rtol", type=float, default=1e-5)
    q = sub.add_parser("kjv_sft_data")
    q.add_argument("--kjv_text", required=True)
    q.add_argument("--out", required=True)
    e = sub.add_parser("peft")
    e.add_argument("--output", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--results", required=True)
    e.add_argument("--rtol", type=float, default=1e-5)
    g = sub.add_parser("generate")
    g.add_argument("--model", required=True)
    g.add_argument("--data", required=True)
    g.add_argument("--results", required=True)
    g.add_argument("--generations", default=None)
    c = sub.add_parser("complete")
    c.add_argument("--model", required=True)
    c.add_argument("--prompt", required=True)
    c.add_argument("--max_new_tokens", type=int, required=True)
    c.add_argument("--log", required=True)
    pr = sub.add_parser("predictions")
    pr.add_argument("--model", required=True)
    pr.add_argument("--prompts", required=True)
    pr.add_argument("--predictions", required=True)
    pr.add_argument("--max_new_tokens", type=int, required=True)
    y = sub.add_parser("classify")
    y.add_argument("--model", required=True)
    y.add_argument("--data", required=True)
    y.add_argument("--sentence", required=True)
    y.add_argument("--max_seq_length", type=int, required=True)
    y.add_argument("--log", required=True)
    ff = sub.add_parser("family_folders")
    ff.add_argument("--data", required=True)
    ff.add_argument("--out", required=True)
    fc = sub.add_parser("families")
    fc.add_argument("--folders", required=True)
    fc.add_argument("--runs", required=True)
    fc.add_argument("--data", required=True)
    fc.add_argument("--prompt", required=True)
    fc.add_argument("--prompts", required=True)
    fc.add_argument("--max_new_tokens", type=int, required=True)
    d = sub.add_parser("kjv_dpo_data")
    d.add_argument("--kjv_text", required=True)
    d.add_argument("--out", required=True)
    sl = sub.add_parser("same_logs")
    sl.add_argument("--keys", nargs="+", required=True)
    sl.add_argument("--rtol", type=float, default=1e-5)
    sl.add_argument("dirs", nargs="+")
    rm = sub.add_parser("reward_model")
    rm.add_argument("--model", required=True)
    rm.add_argument("--data", required=True)
    rm.add_argument("--results", required=True)
    rm.add_argument("--batch", type=int, required=True)
    rm.add_argument("--max_length", type=int, required=True)
    b = sub.add_parser("set_label")
    b.add_argument("--data", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--split", required=True)
    b.add_argument("--example", type=int, required=True)
    b.add_argument("--value", type=int, required=True)
    opts = p.parse_args()
    {"set_label": set_label, "kjv_data": kjv_data, "resumed": resumed, "same": same, "same_weights": same_weights,
     "transformers": transformers_check,
     "kjv_sft_data": kjv_sft_data, "peft": peft_check, "generate": generate_check,
     "complete": complete_check, "predictions": predictions_check, "classify": classify_check, "family_folders": family_folders, "families": families_check,
     "kjv_dpo_data": kjv_dpo_data, "same_logs": same_logs,
     "reward_model": reward_model_check}[opts.command](opts)


if __name__ == "__main__":
    main()
