#!/usr/bin/env python3
"""examples/text_data/prepare.py on small inputs made here, its files read back with numpy and
transformers (ctest example.prepare_text):

  - prompt-completion and chat JSON Lines with a BPE trained here: offsets run from 0 to the
    number of ids, one uint8 mask per id, the mask 0 exactly on the prompt (its ids decode to
    the prompt text with the saved tokenizer), one eos per example (per assistant reply in a
    chat) and masked 1, completion_tokens the mask's sum, every input example in train or
    val once, --val_fraction of them in val; the chat ids and masks equal transformers'
    apply_chat_template(return_assistant_tokens_mask=True) with the saved chat_template, and
    a second run through --tokenizer of that folder writes the same files;
  - special-token spellings inside the data stay text; --max_length drops (and counts) the
    long examples; the same input twice gives the same bytes;
  - an existing tokenizer.json whose post-processor adds <s> and which has two end-of-text
    tokens: refused until --eos_token names one, then every example starts with <s>;
  - plain text files, --one_document_per_line and JSONL text: train.bin/val.bin hold every
    document once, each followed by eos (tests/data/test_text_data.cpp opens such folders
    with loom's reader);
  - bad input: one line naming FILE:LINE, exit status 1;
  - --val_fraction 1 (and 0): every example or document in val (train), the other split's
    files written empty and counted 0 in meta.json; a single document or example is enough;
    a value outside [0, 1] is refused with one line;
  - with --kjv_text: kjv.py --instructions (make llama-sft-data) on 400 instructions, then
    prepare.py --sft on them.

  prepare_check.py --work DIR [--kjv_text EXE]

Prints "prepare ok" or exits non-zero with the reason.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
TOOLS = Path(__file__).resolve().parents[2] / "examples" / "text_data"
PREPARE = TOOLS / "prepare.py"


# The Python that runs the tools: the tests' warm one when this runs under it (tests/warm_python.py).
PYTHON = os.environ.get("LOOM_WARM_PYTHON_CLIENT", sys.executable)

def fail(message):
    sys.exit(f"prepare_check: {message}")


def expect(ok, message):
    if not ok:
        fail(message)


def run(args, tool=PREPARE):
    done = subprocess.run([PYTHON, str(tool), *map(str, args)], capture_output=True, text=True)
    return done.returncode, done.stdout + done.stderr


def prepare(*args):
    rc, out = run(args)
    expect(rc == 0, f"prepare.py {' '.join(map(str, args))} exited with {rc}:\n{out}")
    return out


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


def words(rng, n):
    vocab = ["the", "light", "water", "and", "of", "bread", "city", "é", "naïve", "中文", "🙂", "  ", "\n", "over",
             "said", "unto", "them", "42", "x+y", "{", "}", "\"quoted\""]
    return " ".join(rng.choice(vocab) for _ in range(n))


class Folder:
    """A folder prepare.py wrote: meta.json, the saved tokenizer, the token files."""

    def __init__(self, path):
        from transformers import AutoTokenizer
        self.path = Path(path)
        self.meta = json.loads((self.path / "meta.json").read_text())
        self.dtype = {"uint16": "<u2", "uint32": "<u4"}[self.meta["dtype"]]
        self.tok = AutoTokenizer.from_pretrained(str(self.path))
        self.eos = self.meta["eos_token_id"]
        expect(self.tok.eos_token_id == self.eos, f"{path}: tokenizer eos {self.tok.eos_token_id}, meta {self.eos}")
        expect(0 <= self.meta["pad_token_id"] < self.meta["vocab_size"], f"{path}: pad_token_id")

    def decode(self, ids):
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def ids(self, name):
        ids = np.fromfile(self.path / name, dtype=self.dtype)
        expect(ids.size == 0 or int(ids.max()) < self.meta["vocab_size"], f"{name}: an id beyond the vocabulary")
        return ids

    def sft(self, split):
        """[(ids, mask)] of an SFT split, after checking the three files against each other and meta.json."""
        return self.ragged(self.meta["sft"][split], split)

    def ragged(self, entry, split):
        """[(ids, mask)] of the ids / offsets / mask files `entry` names (an SFT split, a preference side)."""
        ids = self.ids(entry["ids"])
        offsets = np.fromfile(self.path / entry["offsets"], dtype="<u8")
        mask = np.fromfile(self.path / entry["mask"], dtype=np.uint8)
        where = f"{self.path}/{split}"
        expect(len(offsets) == entry["examples"] + 1, f"{where}: {len(offsets)} offsets for {entry['examples']} examples")
        expect(offsets[0] == 0 and offsets[-1] == len(ids) == entry["tokens"],
               f"{where}: offsets from {offsets[0]} to {offsets[-1]}, {len(ids)} ids, meta {entry['tokens']}")
        expect(bool(np.all(np.diff(offsets.astype(np.int64)) > 0)), f"{where}: an empty or backwards example")
        expect(len(mask) == len(ids), f"{where}: {len(mask)} mask bytes for {len(ids)} ids")
        expect(set(np.unique(mask).tolist()) <= {0, 1}, f"{where}: mask values {np.unique(mask)}")
        expect(int(mask.sum()) == entry["completion_tokens"],
               f"{where}: mask sum {int(mask.sum())}, completion_tokens {entry['completion_tokens']}")
        return [(ids[b:e].tolist(), mask[b:e].tolist()) for b, e in zip(offsets[:-1], offsets[1:])]

    def lm(self, split):
        """The documents of a flat file, cut at each eos; the file must end with one."""
        entry = self.meta["lm"][split]
        ids = self.ids(entry["file"])
        expect(len(ids) == entry["tokens"] and (len(ids) == 0 or ids[-1] == self.eos),
               f"{self.path}/{entry['file']}: tokens or last id")
        ends = np.flatnonzero(ids == self.eos)
        expect(len(ends) == entry["documents"], f"{entry['file']}: {len(ends)} eos for {entry['documents']} documents")
        starts = np.concatenate([[0], ends[:-1] + 1])
        return [ids[s:e] for s, e in zip(starts, ends)]


def check_split_sizes(folder, n, val_fraction=0.05):
    n_val = int(n * val_fraction) if val_fraction in (0, 1) else min(n - 1, max(1, round(n * val_fraction)))
    sft = folder.meta["sft"]
    expect((sft["train"]["examples"], sft["val"]["examples"]) == (n - n_val, n_val),
           f"{folder.path}: {sft['train']['examples']} / {sft['val']['examples']} examples, expected {n - n_val} / {n_val}")


def check_prompt_completion(folder, pairs, prefix=(), val_fraction=0.05):
    """Each example: prefix + prompt (mask 0), completion + eos (mask 1); together the input pairs, once each."""
    expect(folder.meta["sft"]["format"] == "prompt_completion", f"{folder.path}: format")
    seen = Counter()
    for split in ("train", "val"):
        for ids, mask in folder.sft(split):
            k = mask.index(1)
            expect(mask == [0] * k + [1] * (len(ids) - k), f"{folder.path}: a mask that is not 0...0 1...1: {mask}")
            expect(ids[:len(prefix)] == list(prefix), f"{folder.path}: example starts {ids[:3]}, not {list(prefix)}")
            expect(ids[-1] == folder.eos and ids.count(folder.eos) == 1,
                   f"{folder.path}: {ids.count(folder.eos)} eos, last id {ids[-1]}")
            seen[(folder.decode(ids[len(prefix):k]), folder.decode(ids[k:-1]))] += 1
    expect(seen == Counter(pairs), f"{folder.path}: decoded pairs differ from the input, e.g. "
                                   f"{next(iter(seen - Counter(pairs)), None)!r} / {next(iter(Counter(pairs) - seen), None)!r}")
    check_split_sizes(folder, len(pairs), val_fraction)


def check_chat(folder, conversations):
    """Each example: the default template's text; the mask 1 exactly on each reply and its eos;
    the same ids and mask as transformers' apply_chat_template with the saved template."""
    expect(folder.meta["sft"]["format"] == "chat", f"{folder.path}: format")
    eos_text = folder.tok.eos_token
    want = Counter(json.dumps(c) for c in conversations)
    seen = Counter()
    for split in ("train", "val"):
        for ids, mask in folder.sft(split):
            runs = masked_runs(ids, mask)
            replies = [folder.decode(r) for r in runs]
            expect(all(r.endswith(eos_text) for r in replies), f"{folder.path}: a masked run without its eos: {replies}")
            expect(ids.count(folder.eos) == len(runs), f"{folder.path}: {ids.count(folder.eos)} eos, {len(runs)} replies")
            text = folder.decode(ids)
            match = [c for c in conversations if json.dumps(c) in want and text == "".join(
                f"<|{m['role']}|>\n{m['content']}" + (eos_text if m["role"] == "assistant" else "\n") for m in c)]
            expect(match, f"{folder.path}: no input conversation renders as {text!r}")
            conv = match[0]
            expect([r[:-len(eos_text)] for r in replies] == [m["content"] for m in conv if m["role"] == "assistant"],
                   f"{folder.path}: masked text {replies} is not the assistant's")
            hf = folder.tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
            expect(list(hf["input_ids"]) == ids and list(hf["assistant_masks"]) == mask,
                   f"{folder.path}: apply_chat_template gives other ids or mask for {conv}")
            seen[json.dumps(conv)] += 1
    expect(seen == want, f"{folder.path}: the examples are not the input conversations, once each")
    check_split_sizes(folder, len(conversations))


def preference_sides(folder, split):
    """[(chosen (ids, mask), rejected (ids, mask), margin or None)] of a preference split."""
    entry = folder.meta["preference"][split]
    chosen = folder.ragged(entry["chosen"], f"{split} chosen")
    rejected = folder.ragged(entry["rejected"], f"{split} rejected")
    margins = [None] * len(chosen)
    if folder.meta["preference"]["margin"]:
        margins = np.fromfile(folder.path / entry["margin"], dtype="<f4").tolist()
    expect(len(chosen) == len(rejected) == len(margins) == entry["pairs"],
           f"{folder.path}/{split}: {len(chosen)} chosen, {len(rejected)} rejected, {len(margins)} margins, "
           f"{entry['pairs']} pairs")
    return list(zip(chosen, rejected, margins))


def masked_runs(ids, mask):
    """The runs of ids under mask 1."""
    runs, current = [], []
    for i, m in zip(ids, mask):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def check_preference(work):
    """--preference: TRL's four forms. Each side of a pair is its prompt (mask 0) then its
    completion and eos (mask 1; in chat, the completion's reply only, not the prompt's
    assistant turns), the two sides of a line stay paired, with their margin; bad lines are
    refused with FILE:LINE."""
    rng = random.Random(11)
    explicit = [{"prompt": words(rng, 6), "chosen": words(rng, 4) + ".", "rejected": words(rng, 3) + "!",
                 "margin": round(rng.random(), 3)} for _ in range(30)]
    write_jsonl(work / "pref.jsonl", explicit)
    prepare("--preference", work / "pref.jsonl", "--out", work / "pref", "--vocab_size", 300)
    folder = Folder(work / "pref")
    expect(folder.meta["preference"]["format"] == "prompt_completion" and folder.meta["preference"]["margin"],
           f"{folder.path}: format or margin in meta.json")
    seen = Counter()
    for split in ("train", "val"):
        for (c_ids, c_mask), (r_ids, r_mask), margin in preference_sides(folder, split):
            kc, kr = c_mask.index(1), r_mask.index(1)
            for ids, mask, k in ((c_ids, c_mask, kc), (r_ids, r_mask, kr)):
                expect(mask == [0] * k + [1] * (len(ids) - k) and ids[-1] == folder.eos,
                       f"{folder.path}: a side is not prompt (0) then completion and eos (1): {mask}")
            expect(c_ids[:kc] == r_ids[:kr], f"{folder.path}: the two sides of a pair have other prompts")
            seen[(folder.decode(c_ids[:kc]), folder.decode(c_ids[kc:-1]), folder.decode(r_ids[kr:-1]),
                  round(margin, 3))] += 1
    want = Counter((r["prompt"], r["chosen"], r["rejected"], r["margin"]) for r in explicit)
    expect(seen == want, f"{folder.path}: the pairs differ from the input, e.g. {next(iter(seen - want), None)!r}")
    expect((folder.meta["preference"]["train"]["pairs"], folder.meta["preference"]["val"]["pairs"]) == (28, 2),
           f"{folder.path}: split sizes")

    # Chat, explicit prompt with an assistant turn in it, and implicit (the shared first messages).
    def say(role):
        return {"role": role, "content": words(rng, 4)}
    chats = [{"prompt": [say("user"), say("assistant"), say("user")], "chosen": [say("assistant")],
              "rejected": [say("assistant")]} for _ in range(12)]
    implicit = []
    for _ in range(12):
        head = [say("system"), say("user")]
        implicit.append({"chosen": head + [say("assistant")], "rejected": head + [say("assistant")]})
    write_jsonl(work / "pref_chat.jsonl", chats)
    prepare("--preference", work / "pref_chat.jsonl", "--out", work / "pref_chat", "--vocab_size", 300)
    # The same pairs through the saved tokenizer's own chat_template (apply_chat_template).
    prepare("--preference", work / "pref_chat.jsonl", "--out", work / "pref_chat_template", "--tokenizer",
            work / "pref_chat")
    write_jsonl(work / "pref_chat_implicit.jsonl", implicit)
    prepare("--preference", work / "pref_chat_implicit.jsonl", "--out", work / "pref_chat_implicit", "--vocab_size", 300)
    for name, records in (("pref_chat", chats), ("pref_chat_template", chats), ("pref_chat_implicit", implicit)):
        folder = Folder(work / name)
        expect(folder.meta["preference"]["format"] == "chat" and not folder.meta["preference"]["margin"],
               f"{folder.path}: format or margin")
        replies = Counter()
        for split in ("train", "val"):
            for (c_ids, c_mask), (r_ids, r_mask), _ in preference_sides(folder, split):
                c_runs, r_runs = masked_runs(c_ids, c_mask), masked_runs(r_ids, r_mask)
                expect(len(c_runs) == 1 and len(r_runs) == 1, f"{folder.path}: the mask covers {len(c_runs)} / "
                                                              f"{len(r_runs)} runs, not the completion's reply alone")
                replies[(folder.decode(c_runs[0]), folder.decode(r_runs[0]))] += 1
        eos_text = folder.tok.eos_token
        want = Counter((r["chosen"][-1]["content"] + eos_text, r["rejected"][-1]["content"] + eos_text)
                       for r in records)
        expect(replies == want, f"{folder.path}: the masked replies are not the completions")

    # Bad lines: one loom-style line naming FILE:LINE, exit status 1.
    bad = {
        "no_rejected": [{"prompt": "a", "chosen": "b"}],
        "mixed_margin": [{"chosen": "a b", "rejected": "c", "margin": 1}, {"chosen": "a b", "rejected": "c"}],
        "bad_margin": [{"chosen": "a b", "rejected": "c", "margin": "high"}],
        "user_last": [{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "user", "content": "x"}],
                       "rejected": [{"role": "assistant", "content": "y"}]}],
        "mixed_forms": [{"chosen": "a", "rejected": "b"},
                        {"chosen": [{"role": "assistant", "content": "a"}],
                         "rejected": [{"role": "assistant", "content": "b"}], "prompt": [{"role": "user", "content": "q"}]}],
        "empty_chosen": [{"prompt": "q", "chosen": " ", "rejected": "b"}],
    }
    messages = {"no_rejected": ":1: missing field 'rejected'", "mixed_margin": ":1 has a 'margin' and",
                "bad_margin": ":1: field 'margin' must be a finite number", "user_last": "'chosen' ends with the user's",
                "mixed_forms": ":2: a chat pair, but", "empty_chosen": ":1: empty chosen completion"}
    for name, records in bad.items():
        write_jsonl(work / f"bad_{name}.jsonl", records)
        rc, out = run(["--preference", work / f"bad_{name}.jsonl", "--out", work / "bad_pref"])
        expect(rc == 1 and messages[name] in out and "Traceback" not in out,
               f"--preference {name}: exit {rc}, output {out!r}")


def same_files(a, b, names):
    for name in names:
        expect((Path(a) / name).read_bytes() == (Path(b) / name).read_bytes(), f"{a}/{name} and {b}/{name} differ")


SFT_FILES = [f"sft_{s}.{x}" for s in ("train", "val") for x in ("bin", "offsets", "mask")]


def instruction_data(work):
    rng = random.Random(7)
    pairs = [(words(rng, rng.randint(0, 12)), words(rng, rng.randint(1, 20)) + " end") for _ in range(130)]
    # Special-token spellings and a bos-like text in the data are tokenized as text.
    pairs += [("Say <|endoftext|> twice: <|endoftext|>\n", "<|endoftext|> [PAD] <s></s>"), ("", "no prompt at all")]
    pc = write_jsonl(work / "pairs.jsonl", [{"prompt": p, "completion": c, "id": i} for i, (p, c) in enumerate(pairs)])
    conversations = []
    for i in range(48):
        conv = [{"role": "system", "content": words(rng, 6)}] if i % 4 == 0 else []
        for _ in range(1 + i % 3):
            conv += [{"role": "user", "content": words(rng, rng.randint(1, 10))},
                     {"role": "assistant", "content": words(rng, rng.randint(1, 14)).strip() or "ok"}]
        conversations.append(conv)
    chat = write_jsonl(work / "chat.jsonl", [{"messages": c} for c in conversations])
    return pairs, pc, conversations, chat


def check_instructions(work):
    pairs, pc, conversations, chat = instruction_data(work)
    prepare("--sft", pc, "--out", work / "pc", "--vocab_size", 400)
    folder = Folder(work / "pc")
    check_prompt_completion(folder, pairs)
    prepare("--sft", pc, "--out", work / "pc_again", "--vocab_size", 400)
    same_files(work / "pc", work / "pc_again", SFT_FILES + ["tokenizer.json", "meta.json"])

    # --max_length drops the examples longer than it, counts them, and truncates nothing.
    lengths = [len(ids) for split in ("train", "val") for ids, _ in folder.sft(split)]
    limit = int(np.median(lengths))
    prepare("--sft", pc, "--out", work / "pc_short", "--vocab_size", 400, "--max_length", limit)
    short = Folder(work / "pc_short")
    dropped = sum(n > limit for n in lengths)
    expect(0 < dropped == short.meta["source"]["dropped_too_long"], f"dropped {short.meta['source']}, expected {dropped}")
    kept = [ids for split in ("train", "val") for ids, _ in short.sft(split)]
    expect(len(kept) == len(pairs) - dropped and max(map(len, kept)) <= limit, "--max_length kept the wrong examples")

    prepare("--sft", chat, "--out", work / "chat", "--vocab_size", 400)
    check_chat(Folder(work / "chat"), conversations)
    # The saved tokenizer's own chat_template (it has {% generation %} markers) gives the same files.
    prepare("--sft", chat, "--out", work / "chat_template", "--tokenizer", work / "chat")
    same_files(work / "chat", work / "chat_template", SFT_FILES)
    return pc, chat


def check_existing_tokenizer(work, pc):
    """A tokenizer.json alone, with <s> put before every text and two end-of-text tokens."""
    from tokenizers import AddedToken, Tokenizer, processors
    tok = Tokenizer.from_file(str(work / "pc" / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<s>", special=True), AddedToken("</s>", special=True)])
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    (work / "llama_like").mkdir(exist_ok=True)
    tok.save(str(work / "llama_like" / "my_tokenizer.json"))
    rc, out = run(["--sft", pc, "--out", work / "ll", "--tokenizer", work / "llama_like" / "my_tokenizer.json"])
    expect(rc == 1 and "several special tokens could be its eos (<|endoftext|>, </s>)" in out
           and "--eos_token" in out, f"an ambiguous eos: rc {rc}, {out!r}")
    prepare("--sft", pc, "--out", work / "ll", "--tokenizer", work / "llama_like" / "my_tokenizer.json",
            "--eos_token", "</s>")
    folder = Folder(work / "ll")
    expect(folder.eos == eos and folder.meta["pad_token_id"] == tok.token_to_id("[PAD]"),
           f"eos {folder.eos} pad {folder.meta['pad_token_id']}, expected {eos} and [PAD]")
    pairs = [(r["prompt"], r["completion"]) for r in map(json.loads, pc.read_text().splitlines())]
    check_prompt_completion(folder, pairs, prefix=[bos])
    # Chat data needs a template with generation markers.
    rc, out = run(["--sft", work / "chat.jsonl", "--out", work / "ll_chat", "--tokenizer", work / "pc"])
    expect(rc == 1 and "has no chat_template" in out, f"chat data without a template: rc {rc}, {out!r}")
    shutil.copytree(work / "chat", work / "plain_template", dirs_exist_ok=True)
    (work / "plain_template" / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}")
    rc, out = run(["--sft", work / "chat.jsonl", "--out", work / "ll_chat", "--tokenizer", work / "plain_template"])
    expect(rc == 1 and "no {% generation %} markers" in out, f"a template without markers: rc {rc}, {out!r}")


def check_lm(work):
    """Plain text files, one document per line, JSONL text: every document once, each followed by eos."""
    rng = random.Random(3)
    texts = [words(rng, rng.randint(5, 40)) + "\n" for _ in range(5)]
    files = []
    for i, t in enumerate(texts):
        files.append(work / f"doc{i}.txt")
        files[-1].write_text(t)
    lines = [words(rng, rng.randint(1, 12)).replace("\n", " ").strip() or "amen" for _ in range(40)]
    (work / "lines.txt").write_text("\n\n".join(lines) + "\n")
    records = [{"body": t, "n": i} for i, t in enumerate(lines)] + [{"body": ""}]
    write_jsonl(work / "docs.jsonl", records)
    for name, args, docs in (("text", ["--text", *files], texts),
                             ("lines", ["--text", work / "lines.txt", "--one_document_per_line"], lines),
                             ("jsonl", ["--jsonl", work / "docs.jsonl", "--text_field", "body"], lines)):
        prepare(*args, "--out", work / name, "--vocab_size", 300, "--val_fraction", 0.2)
        folder = Folder(work / name)
        train, val = folder.lm("train"), folder.lm("val")
        expect(len(val) == round(len(docs) * 0.2), f"{name}: {len(val)} val documents of {len(docs)}")
        got = Counter(folder.decode(d) for d in train + val)
        expect(got == Counter(docs), f"{name}: the documents decoded differ from the input")
    # One document: val is its last ids.
    prepare("--text", files[0], "--out", work / "one", "--vocab_size", 300)
    folder = Folder(work / "one")
    train, val = folder.lm("train"), folder.lm("val")
    expect(len(train) == len(val) == 1 and folder.decode(np.concatenate([train[0], val[0]])) == texts[0],
           "one document: train + val is not the text")


def check_bad_input(work):
    good = {"prompt": "p", "completion": "c"}
    cases = [
        ("missing.jsonl", [good, {"prompt": "p"}], "missing.jsonl:2: missing field 'completion'"),
        ("empty.jsonl", [good, good, {"prompt": "p", "completion": " \n"}], "empty.jsonl:3: empty completion"),
        ("notjson.jsonl", None, "notjson.jsonl:2: not JSON"),
        ("role.jsonl", [{"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "x"}]}],
         "role.jsonl:1: messages[1]: unknown role 'tool'"),
        ("last.jsonl", [{"messages": [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"}]}],
         "last.jsonl:1: the last message is the user's"),
        ("mixed.jsonl", [good, {"messages": [{"role": "assistant", "content": "a"}]}],
         "mixed.jsonl:2: a chat example, but "),
        ("number.jsonl", [good, {"prompt": 3, "completion": "c"}], "number.jsonl:2: field 'prompt' must be a string"),
        ("array.jsonl", [good, [1, 2]], "array.jsonl:2: not a JSON object"),
    ]
    for name, records, message in cases:
        path = work / "bad" / name
        path.parent.mkdir(exist_ok=True)
        if records is None:
            path.write_text(json.dumps(good) + "\n{\"prompt\": \"p\", \n")
        else:
            write_jsonl(path, records)
        rc, out = run(["--sft", path, "--out", work / "bad" / "out"])
        lines = out.strip().splitlines()
        expect(rc == 1 and len(lines) == 1 and lines[0].startswith(f"prepare.py: {path}") and message in lines[0],
               f"{name}: rc {rc}, expected one line with {message!r}, got {out!r}")
    # Text no UTF-8 can hold, JSON nested past Python's reader, and a word too long to train a BPE on.
    raw_cases = [
        ("surrogate.jsonl", json.dumps(good) + "\n" + '{"prompt": "x\\ud800", "completion": "c"}\n',
         "surrogate.jsonl:2: field 'prompt' holds '\\ud800' at character 1, half of a surrogate pair"),
        ("deep.jsonl", json.dumps(good) + "\n" + "[" * 100000 + "]" * 100000 + "\n",
         "deep.jsonl:2: JSON nested too deeply to read"),
        ("long.jsonl", "".join(json.dumps({"prompt": f"p{i}", "completion": "c"}) + "\n" for i in range(4))
         + json.dumps({"prompt": "p", "completion": "ab" * 10001}) + "\n",
         "a run of 20002 characters without whitespace"),
    ]
    for name, text, message in raw_cases:
        path = work / "bad" / name
        path.write_text(text)
        rc, out = run(["--sft", path, "--out", work / "bad" / "out"])
        lines = out.strip().splitlines()
        expect(rc == 1 and len(lines) == 1 and message in lines[0],
               f"{name}: rc {rc}, expected one line with {message!r}, got {out[-400:]!r}")
    write_jsonl(work / "bad" / "text.jsonl", [{"text": "a"}, {"body": "b"}])
    rc, out = run(["--jsonl", work / "bad" / "text.jsonl", "--out", work / "bad" / "out"])
    expect(rc == 1 and f"text.jsonl:2: missing field 'text'" in out, f"JSONL text without the field: {out!r}")


def check_whole_splits(work, pc):
    """--val_fraction 1 holds out everything (0 nothing): the empty split's files are there, empty,
    and meta.json counts 0 of them; the held-out split is the whole input, in input order."""
    pairs = [(r["prompt"], r["completion"]) for r in map(json.loads, pc.read_text().splitlines())]
    prepare("--sft", pc, "--out", work / "all_val", "--vocab_size", 400, "--val_fraction", 1)
    folder = Folder(work / "all_val")
    train = folder.meta["sft"]["train"]
    expect((train["examples"], train["tokens"], train["completion_tokens"]) == (0, 0, 0) and folder.sft("train") == [],
           f"--val_fraction 1: sft train {train}")
    expect([(f / train[k]).stat().st_size for f, k in ((folder.path, "ids"), (folder.path, "offsets"),
                                                        (folder.path, "mask"))] == [0, 8, 0],
           "--val_fraction 1: the empty split's files are not a 0-byte .bin and .mask and one offset")
    check_prompt_completion(folder, pairs, val_fraction=1)
    # One example is enough when it all goes to one split.
    one = write_jsonl(work / "one_val.jsonl", [{"prompt": "p", "completion": "c"}])
    prepare("--sft", one, "--out", work / "one_val", "--vocab_size", 280, "--min_frequency", 1, "--val_fraction", 1)
    expect(Folder(work / "one_val").meta["sft"]["val"]["examples"] == 1, "--val_fraction 1 on one example")

    # Plain text: every document in val.bin, train.bin empty; a single document whole, not cut.
    docs = [f"document {i}: " + words(random.Random(i), 20) + "\n" for i in range(3)]
    files = []
    for i, d in enumerate(docs):
        files.append(work / f"whole{i}.txt")
        files[-1].write_text(d)
    for name, inputs, fraction in (("lm_all_val", files, 1), ("lm_one_val", files[:1], 1), ("lm_no_val", files, 0)):
        prepare("--text", *inputs, "--out", work / name, "--vocab_size", 300, "--val_fraction", fraction)
        folder = Folder(work / name)
        full, empty = ("val", "train") if fraction == 1 else ("train", "val")
        expect(folder.meta["lm"][empty]["tokens"] == folder.meta["lm"][empty]["documents"] == 0
               and (folder.path / folder.meta["lm"][empty]["file"]).stat().st_size == 0 and folder.lm(empty) == [],
               f"{name}: {empty} is not empty: {folder.meta['lm'][empty]}")
        got = [folder.decode(d) for d in folder.lm(full)]
        expect(got == docs[:len(inputs)], f"{name}: {full} holds {got!r}, not every document in input order")

    # Classification: the labels too; an empty .labels file and .offsets holding one 0.
    records = [{"text": words(random.Random(100 + i), 8) or "x", "label": ["b", "a"][i % 2]} for i in range(9)]
    prepare("--classify", write_jsonl(work / "whole.jsonl", records), "--out", work / "cls_all_val",
            "--vocab_size", 300, "--val_fraction", 1)
    folder = Folder(work / "cls_all_val")
    cls = folder.meta["classification"]
    expect((cls["train"]["examples"], cls["train"]["tokens"], cls["val"]["examples"]) == (0, 0, len(records))
           and [(folder.path / cls["train"][k]).stat().st_size for k in ("ids", "offsets", "labels")] == [0, 8, 0],
           f"--classify --val_fraction 1: {cls['train']}, val {cls['val']['examples']} examples")
    labels = np.fromfile(folder.path / cls["val"]["labels"], dtype="<i8").tolist()
    expect([cls["label_names"][k] for k in labels] == [r["label"] for r in records],
           f"--classify --val_fraction 1: val labels {labels} are not the input's, in order")

    # Outside [0, 1]: one line, before anything is read.
    for bad in ("1.5", "-0.1", "nan"):
        rc, out = run(["--sft", pc, "--out", work / "bad_fraction", "--val_fraction", bad])
        lines = out.strip().splitlines()
        expect(rc == 1 and len(lines) == 1 and lines[0].startswith("prepare.py: --val_fraction must lie in [0, 1]"),
               f"--val_fraction {bad}: rc {rc}, {out!r}")
    expect(not (work / "bad_fraction").exists(), "a refused --val_fraction wrote its --out")


def check_nothing_lost(work, pc):
    """A refused input or an unwritable --out leaves an existing token folder as it was."""
    folder = work / "kept"
    prepare("--sft", pc, "--out", folder, "--vocab_size", 300, "--min_frequency", 1)
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    one = write_jsonl(work / "one.jsonl", [{"prompt": "p", "completion": "c"}])
    rc, out = run(["--sft", one, "--out", folder, "--vocab_size", 280, "--min_frequency", 1])
    expect(rc == 1 and "1 example(s) left" in out, f"one example: rc {rc}, {out!r}")
    after = {f.name: f.read_bytes() for f in folder.iterdir()}
    expect(after == before, f"a refused input changed {folder}: {sorted(set(before) ^ set(after))} "
                            f"{[n for n in before if before[n] != after.get(n)]}")
    expect(not [p for p in work.iterdir() if p.name.startswith(".kept.")], "a staging folder was left beside --out")
    afile = work / "afile"
    afile.write_text("x")
    rc, out = run(["--sft", pc, "--out", afile])
    lines = out.strip().splitlines()
    expect(rc == 1 and len(lines) == 1 and "--out " in lines[0] and "a file is there, not a folder" in lines[0],
           f"--out naming a file: rc {rc}, {out!r}")


def check_kjv(work, kjv_text):
    """kjv.py --instructions then prepare.py --sft: make llama-sft-data's pipeline on 400 instructions."""
    jsonl = work / "kjv_sft" / "instructions.jsonl"
    rc, out = run(["--kjv_text", kjv_text, "--instructions", jsonl, "--limit", 400], tool=TOOLS / "kjv.py")
    expect(rc == 0, f"kjv.py --instructions exited with {rc}:\n{out}")
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    expect(len(records) == 400 and records[0] == {"prompt": "Genesis 1:1\n", "completion":
                                                  "In the beginning God created the heaven and the earth."},
           f"kjv instructions: {len(records)}, first {records[0]}")
    expect(any(r["prompt"].startswith("Revelation ") for r in records), "no instruction on Revelation")
    prepare("--sft", jsonl, "--out", work / "kjv_sft", "--vocab_size", 512)
    check_prompt_completion(Folder(work / "kjv_sft"), [(r["prompt"], r["completion"]) for r in records])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--kjv_text", type=Path)
    a = p.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    pc, _ = check_instructions(a.work)
    check_existing_tokenizer(a.work, pc)
    check_lm(a.work)
    check_bad_input(a.work)
    check_whole_splits(a.work, pc)
    check_nothing_lost(a.work, pc)
    check_preference(a.work)
    if a.kjv_text is not None:
        check_kjv(a.work, a.kjv_text)
    print("prepare ok" + ("" if a.kjv_text else " (no --kjv_text: kjv.py --instructions not run)"))


if __name__ == "__main__":
    main()
