#!/usr/bin/env python3
"""Tokenize your own text into the token files that loom's datasets memory-map.

One kind of input per run (UTF-8 files; blank lines of a JSONL file are skipped):

  --text FILE...     plain text: each file is one document, or each non-blank line with
                     --one_document_per_line. Empty documents are left out.
  --jsonl FILE...    JSON Lines: each line an object whose string field --text_field ("text")
                     is one document. Empty documents are left out.
  --sft FILE...      instruction data, JSON Lines, every line of one of two forms (all lines
                     of a run the same form; other fields are ignored):
                       {"prompt": "...", "completion": "..."}
                       {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
  --preference FILE... preference pairs in TRL's formats, JSON Lines, every line of one form
                     (all lines of a run the same form; other fields are ignored):
                       {"prompt": "...", "chosen": "...", "rejected": "..."}     explicit prompt
                       {"chosen": "...", "rejected": "..."}                       whole texts (no prompt)
                       {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
                       {"chosen": [messages], "rejected": [messages]}             the prompt: the
                                                   messages the two share from the start
                     messages as --sft's; a chosen or rejected completion ends with the
                     assistant's reply. An optional number "margin" (TRL's RewardTrainer) on
                     every line or on none.
  --classify FILE... sequence classification or regression, JSON Lines {"text": "...", "label": ...}
                     (--text_field, --label_field rename them); the label's form and --label_type
                     (HF's problem_type; default auto) decide the task, the same for every line:
                       single_label_classification: a class name ("sports") or a class id (3)
                       multi_label_classification:  a list of class names (["a", "c"], may be
                                                    empty) or a multi-hot list of num_labels 0/1
                       regression:                  a number (0.7) or a list of num_labels numbers
                     auto: names or integers -> single-label; lists of names -> multi-label;
                     numbers with a fraction among them -> regression; lists of numbers are
                     ambiguous (multi-hot or targets) and need --label_type.

The tokenizer: a byte-level BPE of --vocab_size tokens (fewer when the input has fewer merges to
learn) trained here on the input with `tokenizers` (no download), or --tokenizer, an existing
tokenizer.json (or the folder holding it, whose tokenizer_config.json then names the special
tokens and the chat template). Its end-of-text token is the one --eos_token names, else its
config's eos_token, else its one special token spelled like one (</s>, <|endoftext|>, ...);
without any, or with several such spellings, the run asks for --eos_token. Its pad token is
its config's, else a special token spelled [PAD], <pad> or <|pad|>, else the eos token.

Output, in --out:

  tokenizer.json, tokenizer_config.json (and chat_template.jinja for chat data)
      saved through transformers, so AutoTokenizer.from_pretrained(out) opens them. A BPE
      trained here has the special tokens (ids 0..4) <|endoftext|> (eos, also bos and unk),
      [PAD], [CLS], [SEP], [MASK], and for chat data <|system|>, <|user|>, <|assistant|>
      (5..7) with the default chat template below as its chat_template.
  train.bin, val.bin (--text, --jsonl)
      causal LM: flat token ids, little-endian uint16 (uint32 when the vocabulary does not
      fit), no header, the nanoGPT / llm.c convention; each document's ids followed by the
      eos id. A seeded shuffle (--seed) picks --val_fraction of the documents (at least one)
      for val; each file keeps the input order. A single document is split instead: its
      last --val_fraction of ids are val.
  sft_train.bin / .offsets / .mask, sft_val.* (--sft)
      instruction data with loss masks, one example after another: .bin the ids (dtype as
      above), .offsets uint64, n + 1 values, the first 0 and the last the number of ids
      (example i is ids[offsets[i]:offsets[i+1]]), .mask uint8, one per id: 1 on a token the
      loss counts (the completion, the assistant's replies, their eos), 0 on the rest (labels
      -100). A seeded shuffle picks --val_fraction of the examples for val.
  pref_train_chosen.bin / .offsets / .mask, pref_train_rejected.*, pref_train.margin,
  pref_val_* (--preference)
      one pair per example, the chosen and the rejected side each as SFT's files (the prompt
      then the completion; mask 1 on the completion and its eos, or on the completion's
      assistant replies, 0 on the prompt), example i of one side paired with example i of
      the other; .margin float32, one per pair, when the lines have margins. A seeded
      shuffle picks --val_fraction of the pairs for val.
  classify_train.bin / .offsets / .labels, classify_val.* (--classify)
      one example per line: .bin and .offsets as for SFT, each example [CLS] text [SEP] when
      the tokenizer has both tokens (a BPE trained here does), else its prefix and the text;
      --max_length truncates the text so that an example has at most that many ids. .labels:
      single-label: int64, one class id per example; multi-label and regression: float32,
      num_labels values per example, row after row (0/1 multi-hot rows; the targets).
      Class names become ids in sorted order; ids and rows get the names LABEL_0, LABEL_1, ...
      (HF's default id2label). A seeded shuffle picks --val_fraction of the examples for val.
  meta.json
      dtype, vocab_size, tokenizer_file, the special token ids (eos_token_id, pad_token_id,
      and cls/sep/mask when the tokenizer has them), special_tokens, then "lm": {split:
      {file, tokens, documents}}, "sft": {"format": "prompt_completion" | "chat", split:
      {ids, offsets, mask, examples, tokens, completion_tokens}}, "preference": {"format":
      "prompt_completion" | "chat", "margin": true | false, split: {"chosen": {ids,
      offsets, mask, examples, tokens, completion_tokens}, "rejected": {...}, "pairs",
      "margin": file (with margins)}} or "classification":
      {"problem_type", "label_dtype": "int64" | "float32", "label_names", split: {ids,
      offsets, labels, examples, tokens}}, and "source" (the options). loom's
      read_token_meta reads it (data/token_file.hpp).

--val_fraction lies in [0, 1]. Between the ends each split gets at least one document or
example (so the input needs two). 0 holds out nothing and 1 everything (an evaluation-only
folder), whole documents, a single document too: the other split is then written all the
same, empty (a .bin of 0 bytes, .offsets holding the one 0, meta.json counting 0 examples /
documents and 0 tokens), so the folder keeps its usual files and read_token_meta reads it.

A prompt-completion example is the prompt's ids, the completion's ids and the eos id; the
prompt and the completion are tokenized separately, so the mask's boundary is exact. The
default chat template (a BPE trained here):

  <|user|>\\n{content}\\n<|assistant|>\\n{content}<|endoftext|><|user|>\\n{content}\\n...

a system or user message is its role token, then "\\n" + content + "\\n" (mask 0); an assistant
message is <|assistant|> "\\n" (mask 0), then its content and the eos id (mask 1). A
conversation ends with an assistant message. With --tokenizer, chat data goes through the
tokenizer's own chat_template (transformers' apply_chat_template with
return_assistant_tokens_mask): the template must mark the assistant's text with
{% generation %}...{% endgeneration %}, or the run is refused.

No bos is added unless the tokenizer's post-processor puts one before a text (Llama's <s>):
then every document and example starts with it. Special-token spellings inside the data are
tokenized as text, never as the special ids (except through a tokenizer's chat_template).

--max_length N (--sft, --preference: a pair either side of which is longer) drops every example longer than N ids (counted, reported, and recorded
in meta.json's source as dropped_too_long); nothing is truncated, so no example loses its
completion. With --classify it truncates instead (see above). Bad input ends the run with one line naming FILE:LINE and exit status 1. The same
input and options give the same bytes. The ids are held in memory (about 40 bytes a token)
before they are written. Every file is written to a staging folder beside --out and moved in
only once all are written (meta.json last), so a refused input or a failed write leaves an
existing folder as it was. The BPE trained here refuses a run of more than 20,000 characters
without whitespace (its trainer's time grows faster than the run's length); --tokenizer
encodes such text.

  .venv/bin/python examples/text_data/prepare.py --text book1.txt book2.txt --out data/books
  .venv/bin/python examples/text_data/prepare.py --sft pairs.jsonl --out data/sft --vocab_size 8192
  .venv/bin/python examples/text_data/prepare.py --sft chats.jsonl --tokenizer my-model/ --out data/chat
  .venv/bin/python examples/text_data/prepare.py --preference pairs.jsonl --out data/pref --vocab_size 8192
  .venv/bin/python examples/text_data/prepare.py --classify reviews.jsonl --out data/reviews --max_length 128
  .venv/bin/python examples/text_data/prepare.py --classify scores.jsonl --label_type regression --out data/scores
"""

import argparse
import itertools
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]
EOS, PAD, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = [f"<|{role}|>" for role in ROLES]
# The default template in Jinja, for transformers' apply_chat_template: the same text the
# pieces of chat_examples() make, the assistant's part marked for return_assistant_tokens_mask.
# Their ids agree too, but where a reply starts with whitespace: the BPE then joins it to the
# "\n" before it in the rendered text, while chat_examples() tokenizes the reply alone.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# How end-of-text and padding tokens are spelled, for a tokenizer.json without a config.
EOS_SPELLINGS = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>", "[EOS]")
PAD_SPELLINGS = ("[PAD]", "<pad>", "<|pad|>")


def fail(message):
    sys.exit(f"{Path(sys.argv[0]).name}: {message}")


# --- reading ------------------------------------------------------------------------------

def read_text(path):
    """The UTF-8 text of `path`; an unreadable file or invalid UTF-8 fails naming it."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        fail(f"{path}:{line}: not UTF-8 text (byte {e.start})")


def lines_of(path):
    """(line number, line) of `path`, split at "\\n" only (JSON strings may hold U+2028), without a trailing "\\r"."""
    for number, line in enumerate(read_text(path).split("\n"), 1):
        yield number, line.removesuffix("\r")


def jsonl_records(path):
    """(FILE:LINE, object) for each non-blank line of `path`; a line that is no JSON object fails."""
    for number, line in lines_of(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{where}: not JSON ({e.msg}, column {e.colno})")
        except RecursionError:
            fail(f"{where}: JSON nested too deeply to read")
        if not isinstance(record, dict):
            fail(f"{where}: not a JSON object")
        yield where, record


def string_field(record, key, where):
    if key not in record:
        fail(f"{where}: missing field '{key}'")
    value = record[key]
    if not isinstance(value, str):
        fail(f"{where}: field '{key}' must be a string, got {json.dumps(value)[:40]}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # a JSON escape of half a surrogate pair ("\ud800")
        fail(f"{where}: field '{key}' holds {value[e.start]!r} at character {e.start}, half of a surrogate pair, "
             "which is no character and cannot be written as UTF-8")
    return value


def text_documents(paths, one_per_line):
    if one_per_line:
        return [line for path in paths for _, line in lines_of(path) if line.strip()]
    return [text for text in map(read_text, paths) if text.strip()]


def jsonl_documents(paths, field):
    docs = (string_field(record, field, where) for path in paths for where, record in jsonl_records(path))
    return [text for text in docs if text.strip()]


def prompt_completion(record, where):
    prompt, completion = string_field(record, "prompt", where), string_field(record, "completion", where)
    if not completion.strip():
        fail(f"{where}: empty completion")
    return prompt, completion


def conversation(record, where, ends_with_assistant=True):
    messages = record["messages"]
    if not isinstance(messages, list) or not messages:
        fail(f"{where}: 'messages' must be a non-empty list")
    turns = []
    for k, message in enumerate(messages):
        at = f"{where}: messages[{k}]"
        if not isinstance(message, dict):
            fail(f"{at} is not an object")
        role, content = string_field(message, "role", at), string_field(message, "content", at)
        if role not in ROLES:
            fail(f"{at}: unknown role '{role}' (system, user or assistant)")
        if role == "assistant" and not content.strip():
            fail(f"{at}: empty assistant content")
        turns.append((role, content))
    if ends_with_assistant and turns[-1][0] != "assistant":
        fail(f"{where}: the last message is the {turns[-1][0]}'s; a conversation ends with the assistant's reply")
    return turns


def instructions(paths):
    """("prompt_completion", [(prompt, completion)]) or ("chat", [[(role, content)]])."""
    form, first, examples = None, None, []
    for path in paths:
        for where, record in jsonl_records(path):
            if "messages" in record:
                this, example = "chat", conversation(record, where)
            elif "prompt" in record or "completion" in record:
                this, example = "prompt_completion", prompt_completion(record, where)
            else:
                fail(f"{where}: neither 'prompt' and 'completion' nor 'messages'")
            if form is None:
                form, first = this, where
            elif this != form:
                fail(f"{where}: a {this} example, but {first} is {form}; one run holds one form")
            examples.append(example)
    if not examples:
        fail(f"no examples in {', '.join(map(str, paths))}")
    return form, examples


def messages_field(record, key, where):
    """The list of (role, content) of record[key] (--sft's message rules), possibly ending anywhere."""
    value = record[key]
    if not isinstance(value, list) or not value:
        fail(f"{where}: '{key}' must be a non-empty list of messages")
    return conversation({"messages": value}, f"{where}: {key}", ends_with_assistant=False)


def preference_pair(record, where):
    """("prompt_completion", (prompt, chosen, rejected)) or ("chat", (prompt turns, chosen turns,
    rejected turns)) of one line, TRL's four forms."""
    for key in ("chosen", "rejected"):
        if key not in record:
            fail(f"{where}: missing field '{key}'")
    if isinstance(record["chosen"], str) or isinstance(record["rejected"], str):
        prompt = string_field(record, "prompt", where) if "prompt" in record else ""
        chosen, rejected = string_field(record, "chosen", where), string_field(record, "rejected", where)
        for key, text in (("chosen", chosen), ("rejected", rejected)):
            if not text.strip():
                fail(f"{where}: empty {key} completion")
        return "prompt_completion", (prompt, chosen, rejected)
    chosen, rejected = messages_field(record, "chosen", where), messages_field(record, "rejected", where)
    if "prompt" in record:
        prompt = messages_field(record, "prompt", where)
    else:  # TRL's implicit prompt: the messages both sides share from the start
        shared = 0
        while shared < min(len(chosen), len(rejected)) - 1 and chosen[shared] == rejected[shared]:
            shared += 1
        prompt, chosen, rejected = chosen[:shared], chosen[shared:], rejected[shared:]
        if not prompt:
            fail(f"{where}: 'chosen' and 'rejected' share no first message, so no prompt; give 'prompt'")
    for key, turns in (("chosen", chosen), ("rejected", rejected)):
        if turns[-1][0] != "assistant":
            fail(f"{where}: '{key}' ends with the {turns[-1][0]}'s message; a completion ends with the assistant's reply")
    return "chat", (prompt, chosen, rejected)


def preferences(paths):
    """(form, [pair], margins or None) of --preference's lines (one form, margins on all or none)."""
    form, first, pairs, margins, margin_first = None, None, [], [], None
    for path in paths:
        for where, record in jsonl_records(path):
            this, pair = preference_pair(record, where)
            if form is None:
                form, first = this, where
            elif this != form:
                fail(f"{where}: a {this} pair, but {first} is {form}; one run holds one form")
            has = "margin" in record
            if margin_first is None:
                margin_first = (has, where)
            elif has != margin_first[0]:
                with_, without = (where, margin_first[1]) if has else (margin_first[1], where)
                fail(f"{with_} has a 'margin' and {without} none; give every line a margin or none")
            if has:
                m = record["margin"]
                if not is_number(m) or not math.isfinite(m):
                    fail(f"{where}: field 'margin' must be a finite number, got {json.dumps(m)[:40]}")
                margins.append(float(m))
            pairs.append(pair)
    if not pairs:
        fail(f"no pairs in {', '.join(map(str, paths))}")
    return form, pairs, (margins if margin_first[0] else None)


PROBLEM_TYPES = ("single_label_classification", "multi_label_classification", "regression")


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def label_form(label):
    """The form of one label: name, id, number (with a fraction), names, numbers, empty (a list), or None."""
    if isinstance(label, str):
        return "name"
    if is_number(label):
        return "id" if isinstance(label, int) else "number"
    if isinstance(label, list):
        if not label:
            return "empty"
        if all(isinstance(v, str) for v in label):
            return "names"
        if all(is_number(v) for v in label):
            return "numbers"
    return None


# The forms each problem_type takes.
FORMS = {"single_label_classification": {"name", "id"}, "multi_label_classification": {"names", "empty", "numbers"},
         "regression": {"id", "number", "numbers"}}


def labelled_examples(paths, text_field, label_field, label_type):
    """(problem_type, [(text, label)], where of each): the lines of --classify, their task checked."""
    examples, wheres, first = [], [], {}
    for path in paths:
        for where, record in jsonl_records(path):
            text = string_field(record, text_field, where)
            if label_field not in record:
                fail(f"{where}: missing field '{label_field}'")
            label = record[label_field]
            form = label_form(label)
            if form is None:
                fail(f"{where}: field '{label_field}' must be a class name, a number, or a list of names or of "
                     f"numbers, got {json.dumps(label)[:40]}")
            values = label if isinstance(label, list) else [label]
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                fail(f"{where}: field '{label_field}' holds NaN or infinity")
            first.setdefault(form, where)
            examples.append((text, label))
            wheres.append(where)
    if not examples:
        fail(f"no examples in {', '.join(map(str, paths))}")
    forms = set(first)
    if label_type == "auto":
        listed = forms - {"empty"}
        if listed <= {"names"}:
            label_type = "multi_label_classification"
        elif listed <= {"name"} or listed <= {"id"}:
            label_type = "single_label_classification"
        elif listed <= {"id", "number"}:
            label_type = "regression"
        elif listed <= {"numbers"}:
            fail(f"{first['numbers']}: a list of numbers is a multi-hot row or regression targets; say which with "
                 "--label_type multi_label_classification or regression")
        else:
            a, b = sorted(forms, key=lambda f: first[f])[:2]
            fail(f"{first[b]}: a label of another form ({b}) than the one at {first[a]} ({a}); one run holds one task")
    bad = sorted((first[f], f) for f in forms - FORMS[label_type])
    if bad:
        fail(f"{bad[0][0]}: a label of form '{bad[0][1]}' does not fit --label_type {label_type}")
    if label_type == "single_label_classification" and len(forms) > 1:
        fail(f"{first['id']}: class ids and class names mixed (a name at {first['name']})")
    if label_type == "multi_label_classification" and "numbers" in forms and len(forms) > 1:
        other = min(first[f] for f in forms if f != "numbers")
        fail(f"{other}: multi-hot rows (as at {first['numbers']}) and lists of class names mixed")
    return label_type, examples, wheres


def encode_labels(problem_type, examples, wheres):
    """(label_names, labels): int64 class ids, or float32 rows of num_labels values."""
    labels = [label for _, label in examples]
    if problem_type == "single_label_classification":
        if isinstance(labels[0], str):
            names = sorted(set(labels))
            index = {name: i for i, name in enumerate(names)}
            return names, np.asarray([index[v] for v in labels], dtype="<i8")
        for label, where in zip(labels, wheres):
            if label < 0:
                fail(f"{where}: class id {label} is negative")
        return [f"LABEL_{i}" for i in range(max(labels) + 1)], np.asarray(labels, dtype="<i8")
    if problem_type == "multi_label_classification" and all(label_form(v) in ("names", "empty") for v in labels):
        names = sorted({name for label in labels for name in label})
        if not names:
            fail("no example of --classify has a class; multi-label data needs at least one")
        index = {name: i for i, name in enumerate(names)}
        rows = np.zeros((len(labels), len(names)), dtype="<f4")
        for r, label in enumerate(labels):
            rows[r, [index[name] for name in label]] = 1
        return names, rows
    rows = [label if isinstance(label, list) else [label] for label in labels]
    width = len(rows[0])
    for row, where in zip(rows, wheres):
        if len(row) != width or width == 0:
            fail(f"{where}: {len(row)} label values, but {wheres[0]} has {width}; every row has num_labels values")
        if problem_type == "multi_label_classification" and any(v not in (0, 1) for v in row):
            fail(f"{where}: a multi-hot label holds 0 or 1, got {json.dumps(row)[:40]}")
    out = np.asarray(rows, dtype="<f4")
    finite = np.isfinite(out).all(axis=1)
    if not finite.all():
        fail(f"{wheres[int(np.argmin(finite))]}: a label value overflows float32 (the label file's type)")
    return [f"LABEL_{i}" for i in range(width)], out


# --- the tokenizer ------------------------------------------------------------------------

def train_tokenizer(texts, vocab_size, min_frequency, special_tokens):
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) trained on `texts`; the special tokens take ids 0, 1, ..."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    for i, t in enumerate(special_tokens):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def text_prefix(tok):
    """The ids a tokenizer's post-processor puts before a text (Llama's <s>; none for a byte-level BPE)."""
    plain = tok.encode("x", add_special_tokens=False).ids
    full = tok.encode("x", add_special_tokens=True).ids
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start]
    return []


class Vocab:
    """A transformers tokenizer (saved to --out, renders chat templates) and what the token files need of it."""

    def __init__(self, fast, eos, pad):
        self.fast = fast
        # A copy encodes the data, with special-token spellings in it read as text.
        self.tok = Tokenizer.from_str(fast.backend_tokenizer.to_str())
        self.tok.encode_special_tokens = True
        self.eos, self.pad = eos, pad
        self.prefix = text_prefix(self.tok)
        self.size = self.tok.get_vocab_size()
        self.dtype = "<u2" if self.size <= 2**16 else "<u4"

    def encode(self, texts, batch=4096):
        """The ids of each text (in batches, so that only the ids of all of them stay in memory)."""
        return [e.ids for i in range(0, len(texts), batch)
                for e in self.tok.encode_batch(texts[i:i + batch], add_special_tokens=False)]

    def meta(self):
        """meta.json's leading keys: dtype, vocab_size, tokenizer_file, special token ids and names."""
        ids = {"eos_token_id": self.eos, "pad_token_id": self.pad}
        for name in ("cls", "sep", "mask"):
            if getattr(self.fast, f"{name}_token") is not None:
                ids[f"{name}_token_id"] = getattr(self.fast, f"{name}_token_id")
        added = self.tok.get_added_tokens_decoder()
        return {"dtype": "uint16" if self.dtype == "<u2" else "uint32", "vocab_size": self.size,
                "tokenizer_file": "tokenizer.json", **ids,
                "special_tokens": [added[i].content for i in sorted(added) if added[i].special]}

    def save(self, out):
        self.fast.save_pretrained(str(out))


# The longest run without whitespace the BPE trained here learns from: the trainer's time grows
# faster than the run's length (20,000 characters: 3 s; 200,000: 55 s, on one core).
MAX_TRAINED_WORD = 20_000
LONG_WORD = re.compile(r"\S{%d,}" % (MAX_TRAINED_WORD + 1))


def trained_vocab(texts, vocab_size, min_frequency, chat=False):
    """A BPE trained on `texts` with SPECIAL_TOKENS (and the role tokens and default chat template for chat data)."""
    from transformers import PreTrainedTokenizerFast
    special = SPECIAL_TOKENS + (ROLE_TOKENS if chat else [])
    if not 256 + len(special) <= vocab_size <= 2**32:
        fail(f"--vocab_size must lie in [{256 + len(special)}, 2^32] (byte alphabet + special tokens)")
    for text in texts:
        if (long := LONG_WORD.search(text)) is not None:
            run = re.match(r"\S+", text[long.start():]).group()
            fail(f"a run of {len(run)} characters without whitespace (it starts {run[:32]!r}): the BPE trained here "
                 f"learns from words, and takes minutes over one this long (at most {MAX_TRAINED_WORD}); split it, "
                 "or bring a trained tokenizer with --tokenizer")
    tok = train_tokenizer(texts, vocab_size, min_frequency, special)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=SPECIAL_TOKENS[EOS], bos_token=SPECIAL_TOKENS[EOS],
                                   unk_token=SPECIAL_TOKENS[EOS], pad_token=SPECIAL_TOKENS[PAD],
                                   cls_token=SPECIAL_TOKENS[CLS], sep_token=SPECIAL_TOKENS[SEP],
                                   mask_token=SPECIAL_TOKENS[MASK])
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return Vocab(fast, EOS, PAD)


def existing_vocab(path, eos_token):
    """The tokenizer.json at `path` (a file, or a folder holding it with its tokenizer_config.json)."""
    from transformers import PreTrainedTokenizerFast
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        fail(f"--tokenizer {path}: no such file" + (" (a folder needs a tokenizer.json)" if path.is_dir() else ""))
    try:
        if file.name == "tokenizer.json" and (file.parent / "tokenizer_config.json").is_file():
            fast = PreTrainedTokenizerFast.from_pretrained(str(file.parent))
        else:
            fast = PreTrainedTokenizerFast(tokenizer_file=str(file))
    except Exception as e:  # transformers and tokenizers raise several kinds
        fail(f"--tokenizer {file}: not a tokenizer ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    tok = fast.backend_tokenizer
    special = {t.content: i for i, t in sorted(tok.get_added_tokens_decoder().items()) if t.special}

    def spelled(names, what):
        found = [name for name in special if name in names]
        if len(found) > 1:
            fail(f"--tokenizer {file}: several special tokens could be its {what} ({', '.join(found)}); name it "
                 f"with --{what}_token")
        return found[0] if found else None

    if eos_token is not None:
        if tok.token_to_id(eos_token) is None:
            fail(f"--eos_token {eos_token!r} is not a token of {file}")
    elif fast.eos_token is None:
        eos_token = spelled(EOS_SPELLINGS, "eos")
        if eos_token is None:
            fail(f"--tokenizer {file} names no eos token and none of its special tokens ({', '.join(special) or 'none'}) "
                 f"is spelled like one; name it with --eos_token")
    if eos_token is not None:
        fast.eos_token = eos_token
    if fast.pad_token is None:
        fast.pad_token = spelled(PAD_SPELLINGS, "pad") or fast.eos_token
    return Vocab(fast, fast.eos_token_id, fast.pad_token_id)


# --- writing ------------------------------------------------------------------------------

def whole_split(val_fraction):
    """True for --val_fraction 0 or 1: every document or example goes to one split."""
    return val_fraction in (0, 1)


def held_out(n, val_fraction):
    """How many of n go to val: n * val_fraction for 0 and 1; else round(n * val_fraction),
    at least one and at most n - 1, so that train and val both have one."""
    if whole_split(val_fraction):
        return int(n * val_fraction)
    return min(n - 1, max(1, round(n * val_fraction)))


def too_few(n, val_fraction):
    """The reason n documents or examples cannot be split at val_fraction, or None."""
    if whole_split(val_fraction):
        return None if n >= 1 else f"the {'val' if val_fraction == 1 else 'train'} split needs at least one"
    return None if n >= 2 else "train and val need at least one each"


def split_indices(n, val_fraction, seed):
    """A seeded shuffle of range(n) cut into (train, val), each in input order; val holds
    held_out(n, val_fraction) indices (0 and 1: none, all)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = held_out(n, val_fraction)
    return sorted(order[n_val:]), sorted(order[:n_val])


def write_flat(path, docs, vocab):
    """Each document's ids (after the tokenizer's prefix) and the eos id, one document after another, to `path`."""
    ids = itertools.chain.from_iterable(vocab.prefix + d + [vocab.eos] for d in docs)
    np.fromiter(ids, dtype=vocab.dtype).tofile(path)
    return {"file": path.name, "tokens": sum(len(vocab.prefix) + len(d) + 1 for d in docs), "documents": len(docs)}


def write_ragged(out, files, seqs, dtype):
    """seqs one after another to files["ids"] (dtype) and their uint64 offsets (n + 1 values,
    the first 0) to files["offsets"], in folder `out`; returns the number of ids."""
    offsets = np.zeros(len(seqs) + 1, dtype="<u8")
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    np.fromiter(itertools.chain.from_iterable(seqs), dtype=dtype, count=int(offsets[-1])).tofile(out / files["ids"])
    offsets.tofile(out / files["offsets"])
    return int(offsets[-1])


def lm_files(out, vocab, docs, val_fraction, seed):
    """train.bin and val.bin of the documents; their entries of meta.json's "lm"."""
    encoded = vocab.encode(docs)
    if len(encoded) > 1 or whole_split(val_fraction):
        train, val = split_indices(len(encoded), val_fraction, seed)
        parts = {"train": [encoded[i] for i in train], "val": [encoded[i] for i in val]}
    else:
        ids = encoded[0]
        if len(ids) < 2:
            fail("one document of one token: nothing to split into train and val")
        n_val = min(len(ids) - 1, max(1, round(len(ids) * val_fraction)))
        parts = {"train": [ids[:-n_val]], "val": [ids[-n_val:]]}
    return {split: write_flat(out / f"{split}.bin", seqs, vocab) for split, seqs in parts.items()}


def prompt_completion_examples(vocab, pairs):
    """(ids, mask) of each (prompt, completion): prefix + prompt (mask 0), completion + eos (mask 1)."""
    prompts, completions = vocab.encode([p for p, _ in pairs]), vocab.encode([c for _, c in pairs])
    for p, c in zip(prompts, completions):
        prompt, completion = vocab.prefix + p, c + [vocab.eos]
        yield prompt + completion, [0] * len(prompt) + [1] * len(completion)


def chat_examples(vocab, conversations):
    """(ids, mask) of each conversation in the default template (the module's doc)."""
    pieces = iter(vocab.encode([c if r == "assistant" else f"\n{c}\n" for conv in conversations for r, c in conv]))
    role_id = {role: vocab.tok.token_to_id(token) for role, token in zip(ROLES, ROLE_TOKENS)}
    newline = vocab.encode(["\n"])[0]
    for conv in conversations:
        ids, mask = list(vocab.prefix), [0] * len(vocab.prefix)
        for role, _ in conv:
            piece = next(pieces)
            if role == "assistant":
                head, tail = [role_id[role]] + newline, piece + [vocab.eos]
                ids += head + tail
                mask += [0] * len(head) + [1] * len(tail)
            else:
                ids += [role_id[role]] + piece
                mask += [0] * (1 + len(piece))
        yield ids, mask


def check_chat_template(vocab, tokenizer):
    """Fails unless the tokenizer has a chat_template that marks the assistant's text for return_assistant_tokens_mask."""
    template = vocab.fast.chat_template
    if isinstance(template, dict):
        template = template.get("default")
    if not template:
        fail(f"--tokenizer {tokenizer} has no chat_template; chat data needs one whose assistant text is marked "
             "{% generation %}...{% endgeneration %} (or leave out --tokenizer to train a BPE with the default template)")
    if not GENERATION.search(template):
        fail(f"--tokenizer {tokenizer}: its chat_template has no {{% generation %}} markers, so the assistant's "
             "tokens cannot be told apart; add them around the assistant's text, or leave out --tokenizer")


def template_examples(vocab, conversations, tokenizer):
    """(ids, assistant mask) of each conversation through the tokenizer's own chat_template (check_chat_template)."""
    for k, conv in enumerate(conversations):
        out = vocab.fast.apply_chat_template([{"role": r, "content": c} for r, c in conv], tokenize=True,
                                             return_dict=True, return_assistant_tokens_mask=True)
        ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
        if not any(mask):
            fail(f"--tokenizer {tokenizer}: its chat_template marks no token of conversation {k} as the assistant's")
        yield ids, mask


def classification_files(a, vocab, items, source):
    """classify_<split>.bin / .offsets / .labels of the labelled examples; meta.json's "classification"."""
    problem_type, examples, wheres = items
    names, labels = encode_labels(problem_type, examples, wheres)
    cls, sep = vocab.fast.cls_token_id, vocab.fast.sep_token_id
    wrap = cls is not None and sep is not None
    head, tail = ([cls], [sep]) if wrap else (list(vocab.prefix), [])
    room = None if a.max_length is None else a.max_length - len(head) - len(tail)
    if room is not None and room < 1:
        fail(f"--max_length {a.max_length} leaves no room for text beside {len(head) + len(tail)} special ids")
    seqs = [head + ids[:room] + tail for ids in vocab.encode([text for text, _ in examples])]
    if (reason := too_few(len(seqs), a.val_fraction)) is not None:
        fail(f"{len(seqs)} example(s); {reason}")
    if a.max_length is not None:
        source["max_length"] = a.max_length
    source["label_type"] = a.label_type
    meta = {"problem_type": problem_type, "label_dtype": "int64" if labels.dtype == np.int64 else "float32",
            "label_names": names}
    counts = []
    for split, idx in zip(("train", "val"), split_indices(len(seqs), a.val_fraction, a.seed)):
        files = {"ids": f"classify_{split}.bin", "offsets": f"classify_{split}.offsets",
                 "labels": f"classify_{split}.labels"}
        tokens = write_ragged(a.out, files, [seqs[i] for i in idx], vocab.dtype)
        labels[idx].tofile(a.out / files["labels"])
        meta[split] = {**files, "examples": len(idx), "tokens": tokens}
        counts.append(f"{split} {len(idx)} examples, {tokens} tokens")
    return meta, f"{len(seqs)} {problem_type} examples, {len(names)} labels; classification {', '.join(counts)}"


def sft_split(out, split, examples, dtype, prefix="sft"):
    """<prefix>_<split>.bin / .offsets / .mask of (ids, mask) examples; their entry of meta.json's "sft"."""
    files = {"ids": f"{prefix}_{split}.bin", "offsets": f"{prefix}_{split}.offsets", "mask": f"{prefix}_{split}.mask"}
    tokens = write_ragged(out, files, [ids for ids, _ in examples], dtype)
    mask = np.fromiter(itertools.chain.from_iterable(m for _, m in examples), dtype=np.uint8, count=tokens)
    mask.tofile(out / files["mask"])
    return {**files, "examples": len(examples), "tokens": tokens, "completion_tokens": int(mask.sum(dtype=np.int64))}


def completion_examples(a, vocab, form, prompts_completions):
    """(ids, mask) of each (prompt, completion): --sft's encodings, the mask 1 on the completion
    only (a chat prompt's assistant turns are prompt too)."""
    if form == "prompt_completion":
        return list(prompt_completion_examples(vocab, prompts_completions))
    whole = [p + c for p, c in prompts_completions]
    prompts = [p for p, _ in prompts_completions]
    if a.tokenizer is None:
        full, heads = list(chat_examples(vocab, whole)), list(chat_examples(vocab, prompts))
    else:
        full = list(template_examples(vocab, whole, a.tokenizer))
        heads = [(list(vocab.fast.apply_chat_template([{"role": r, "content": c} for r, c in p], tokenize=True,
                                                      return_dict=True)["input_ids"]), None)
                 for p in prompts]
    out = []
    for (ids, mask), (head, _) in zip(full, heads):
        if ids[:len(head)] != head:
            fail(f"--tokenizer {a.tokenizer}: its chat_template renders a prompt that does not begin its conversation, "
                 "so the completion cannot be told apart")
        mask = [0] * len(head) + list(mask[len(head):])
        out.append((ids, mask))
    return out


def preference_files(a, vocab, items, source):
    """pref_<split>_{chosen,rejected}.* and pref_<split>.margin; meta.json's "preference"."""
    form, pairs, margins = items
    chosen = completion_examples(a, vocab, form, [(p, c) for p, c, _ in pairs])
    rejected = completion_examples(a, vocab, form, [(p, r) for p, _, r in pairs])
    keep = list(range(len(pairs)))
    dropped = ""
    if a.max_length is not None:
        keep = [i for i in keep if len(chosen[i][0]) <= a.max_length and len(rejected[i][0]) <= a.max_length]
        source.update(max_length=a.max_length, dropped_too_long=len(pairs) - len(keep))
        dropped = f", {len(pairs) - len(keep)} dropped (over --max_length {a.max_length})"
    if (reason := too_few(len(keep), a.val_fraction)) is not None:
        fail(f"{len(keep)} pair(s) left; {reason}")
    meta = {"format": form, "margin": margins is not None}
    counts = []
    for split, idx in zip(("train", "val"), split_indices(len(keep), a.val_fraction, a.seed)):
        rows = [keep[i] for i in idx]
        entry = {side: sft_split(a.out, f"{split}_{side}", [examples[i] for i in rows], vocab.dtype, prefix="pref")
                 for side, examples in (("chosen", chosen), ("rejected", rejected))}
        entry["pairs"] = len(rows)
        if margins is not None:
            entry["margin"] = f"pref_{split}.margin"
            np.asarray([margins[i] for i in rows], dtype="<f4").tofile(a.out / entry["margin"])
        meta[split] = entry
        counts.append(f"{split} {len(rows)} pairs")
    return meta, f"{len(pairs)} {form} pairs{dropped}; preference {', '.join(counts)}"


# --- the command --------------------------------------------------------------------------

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Formats and rules: the top of examples/text_data/prepare.py.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", nargs="+", type=Path, metavar="FILE", help="plain text files, one document each")
    src.add_argument("--jsonl", nargs="+", type=Path, metavar="FILE", help="JSON Lines, a document per line")
    src.add_argument("--sft", nargs="+", type=Path, metavar="FILE",
                     help="JSON Lines of {prompt, completion} or {messages}: SFT token files with loss masks")
    src.add_argument("--preference", nargs="+", type=Path, metavar="FILE",
                     help="JSON Lines of TRL's preference pairs (prompt, chosen, rejected): token files of both sides")
    src.add_argument("--classify", nargs="+", type=Path, metavar="FILE",
                     help="JSON Lines of {text, label}: classification or regression token and label files")
    p.add_argument("--out", type=Path, required=True, help="output folder (created)")
    p.add_argument("--one_document_per_line", action="store_true", help="--text: each non-blank line is a document")
    p.add_argument("--text_field", default=None, help="--jsonl, --classify: the field holding the text (default: text)")
    p.add_argument("--label_field", default=None, help="--classify: the field holding the label (default: label)")
    p.add_argument("--label_type", default=None, choices=("auto",) + PROBLEM_TYPES,
                   help="--classify: the task, HF's problem_type (default auto: from the labels' form)")
    p.add_argument("--tokenizer", type=Path, help="an existing tokenizer.json, or its folder, instead of training one")
    p.add_argument("--eos_token", help="--tokenizer: the end-of-text token, when the tokenizer does not say")
    p.add_argument("--vocab_size", type=int, default=None,
                   help="the BPE trained here: at most this many tokens, special tokens included (default 8192)")
    p.add_argument("--min_frequency", type=int, default=2, help="the BPE trained here: a merge must occur this often")
    p.add_argument("--val_fraction", type=float, default=0.05,
                   help="share of the documents or examples held out, in [0, 1] (default 0.05; 1: all of them, "
                        "the train split empty; 0: none, the val split empty)")
    p.add_argument("--max_length", type=int, default=None,
                   help="--sft: drop examples of more ids than this; --classify: truncate examples to this many")
    p.add_argument("--seed", type=int, default=1234, help="the train/val shuffle (default 1234)")
    a = p.parse_args()
    if a.one_document_per_line and not a.text:
        fail("--one_document_per_line goes with --text")
    if a.text_field is not None and not (a.jsonl or a.classify):
        fail("--text_field goes with --jsonl or --classify")
    for flag in ("label_field", "label_type"):
        if getattr(a, flag) is not None and not a.classify:
            fail(f"--{flag} goes with --classify")
    a.label_type = a.label_type or "auto"
    if a.max_length is not None and not (a.sft or a.preference or a.classify):
        fail("--max_length goes with --sft, --preference or --classify")
    if a.max_length is not None and a.max_length < 2:
        fail("--max_length must be at least 2 (a token and the eos; [CLS] and [SEP])")
    if a.tokenizer is not None and a.vocab_size is not None:
        fail("--vocab_size sizes the BPE trained here; --tokenizer brings its own vocabulary")
    if a.eos_token is not None and a.tokenizer is None:
        fail("--eos_token goes with --tokenizer (a BPE trained here ends texts with <|endoftext|>)")
    if not 0 <= a.val_fraction <= 1:  # NaN too
        fail(f"--val_fraction must lie in [0, 1] (1 holds out everything), got {a.val_fraction}")
    return a


def read_input(a, source):
    """(form, items, texts): the input's form ("text", "jsonl", "prompt_completion", "chat"),
    its documents or examples, and the texts a BPE trained here learns from."""
    if a.sft:
        form, items = instructions(a.sft)
        if form == "prompt_completion":
            texts = [t for pair in items for t in pair]
        else:
            texts = [content for conv in items for _, content in conv]
        source.update(format=form, examples=len(items))
        return form, items, texts
    if a.preference:
        form, pairs, margins = preferences(a.preference)
        if form == "prompt_completion":
            texts = [t for pair in pairs for t in pair if t]
        else:
            texts = [content for pair in pairs for turns in pair for _, content in turns]
        source.update(format=f"preference_{form}", pairs=len(pairs))
        return form, (form, pairs, margins), texts
    if a.classify:
        problem_type, examples, wheres = labelled_examples(a.classify, a.text_field or "text",
                                                           a.label_field or "label", a.label_type)
        source.update(format="classification", problem_type=problem_type, examples=len(examples))
        return "classification", (problem_type, examples, wheres), [text for text, _ in examples]
    form = "text" if a.text else "jsonl"
    docs = text_documents(a.text, a.one_document_per_line) if a.text else jsonl_documents(a.jsonl, a.text_field or "text")
    if not docs:
        fail(f"no documents in {', '.join(source['inputs'])}")
    source.update(format=form, documents=len(docs))
    return form, docs, docs


def sft_files(a, vocab, form, items, source):
    """The SFT files of the examples; meta.json's "sft" and the summary line."""
    if form == "prompt_completion":
        examples = list(prompt_completion_examples(vocab, items))
    elif a.tokenizer is None:
        examples = list(chat_examples(vocab, items))
    else:
        examples = list(template_examples(vocab, items, a.tokenizer))
    dropped = ""
    if a.max_length is not None:
        kept = [e for e in examples if len(e[0]) <= a.max_length]
        source.update(max_length=a.max_length, dropped_too_long=len(examples) - len(kept))
        dropped = f", {len(examples) - len(kept)} dropped (over --max_length {a.max_length})"
        examples = kept
    if (reason := too_few(len(examples), a.val_fraction)) is not None:
        fail(f"{len(examples)} example(s) left; {reason}")
    train, val = split_indices(len(examples), a.val_fraction, a.seed)
    sft = {"format": form, **{split: sft_split(a.out, split, [examples[i] for i in idx], vocab.dtype)
                              for split, idx in (("train", train), ("val", val))}}
    counts = ", ".join(f"{s} {sft[s]['examples']} examples, {sft[s]['tokens']} tokens ({sft[s]['completion_tokens']} "
                       "counted)" for s in ("train", "val"))
    return sft, f"{len(items)} {form} examples{dropped}; sft {counts}"


def main():
    a = parse_args()
    start = time.time()
    source = {"inputs": [str(f) for f in a.text or a.jsonl or a.sft or a.preference or a.classify], "seed": a.seed,
              "val_fraction": a.val_fraction}
    form, items, texts = read_input(a, source)
    if a.tokenizer is not None:
        vocab = existing_vocab(a.tokenizer, a.eos_token)
        if form == "chat":
            check_chat_template(vocab, a.tokenizer)
        source["tokenizer"] = str(a.tokenizer)
    else:
        vocab = trained_vocab(texts, a.vocab_size or 8192, a.min_frequency, chat=form == "chat")
        source["min_frequency"] = a.min_frequency

    out = a.out
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: a file is there, not a folder")
    # Everything is written to a staging folder beside --out and moved in only once every file
    # is written: an input refused half-way (too few examples, a bad record) or a failed write
    # leaves a folder that already holds token files as it was.
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    except OSError as e:
        fail(f"--out {out}: cannot write there ({e.strerror or e})")
    try:
        a.out = stage
        vocab.save(stage)
        meta = vocab.meta()
        if a.sft:
            meta["sft"], summary = sft_files(a, vocab, form, items, source)
        elif a.preference:
            meta["preference"], summary = preference_files(a, vocab, items, source)
        elif a.classify:
            meta["classification"], summary = classification_files(a, vocab, items, source)
        else:
            meta["lm"] = lm_files(stage, vocab, texts, a.val_fraction, a.seed)
            lm = meta["lm"]
            summary = f"{len(texts)} documents; lm train {lm['train']['tokens']} tokens, val {lm['val']['tokens']}"
        meta["source"] = source
        (stage / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        out.mkdir(exist_ok=True)
        # meta.json last: a reader never sees a meta.json naming files not yet moved in.
        for f in sorted(stage.iterdir(), key=lambda f: f.name == "meta.json"):
            os.replace(f, out / f.name)
    except OSError as e:
        fail(f"--out {out}: cannot write {e.filename or 'there'} ({e.strerror or e})")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        a.out = out
    print(f"prepare.py: {summary}; vocabulary {vocab.size} ({meta['dtype']}); {time.time() - start:.1f} s -> {out}")

if __name__ == "__main__":
    main()
