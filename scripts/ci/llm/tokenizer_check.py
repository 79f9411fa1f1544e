#!/usr/bin/env python3
"""Cross-check fixture for agl-llm's tokenizer and chat template, made by an independent
implementation: Hugging Face `transformers` (its own GGUF-to-tokenizer conversion and its own
Jinja chat-template rendering).

For every question of Spider dev (`data/spider/dev.json`) it writes one JSON line with
  (a) `q_ids`: the token ids of the bare question, add_special_tokens=False;
  (b) `sys_prompt`, `sys_ids`: the chat prompt of [system (a fixed SQL-assistant prompt with a short
      schema line, stored as `system`), user (the question)] rendered with add_generation_prompt=True,
      and its token ids (tokenized as `apply_chat_template(tokenize=True)` does: no added specials);
  (c) `nosys_prompt`, `nosys_ids`: the same without the system message, so that the template's
      default system line appears.
After them come a few `probe` lines (hand-written strings: digits after runs of spaces, special
tokens, emoji, CJK) with `ids` as transformers' GGUF conversion gives them and `ref_ids` as the
tokenizer with Hugging Face's published SmolLM2 `tokenizer.json` pre-tokenizer gives them
(Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)], which is
what llama.cpp's `smollm` pre-tokenizer does too). For `tokenizer.ggml.pre = "smollm"`, transformers
(5.23) has no entry and falls back to GPT-2's ByteLevel-only split, so the two can differ when a
digit follows a run of two or more spaces; Spider dev has no such question.

The Rust test `crates/agl-llm/tests/tokenizer.rs` reads the fixture and requires agl's tokenizer
and template to reproduce every Spider line exactly, and `ref_ids` on every probe line.

Why not `AutoTokenizer.from_pretrained(dir, gguf_file=...)`: in transformers 5.x that path imports
torch (its GGUF reader module imports it at top level), although the tokenizer does not need it.
So by default this script reads the GGUF metadata with llama.cpp's `gguf` package, mapped to the
keys transformers' own reader produces, and hands it to transformers' `convert_gguf_tokenizer`,
which is exactly what `AutoTokenizer` does after reading. Pass `--autotokenizer` to go through
`AutoTokenizer` instead (needs torch in the venv); the output is the same.

The same script makes the fixture for Qwen2.5-Coder-1.5B-Instruct
(`crates/agl-llm/tests/fixtures/qwen25_coder_spider_dev_tokens.jsonl`, checked by an ignored test
that needs the 1.1 GB model) with `--reference qwen2`: the probes' `ref_ids` then follow Qwen2's
published pre-tokenizer (its Split regex, then ByteLevel without GPT-2's regex).

Venv (pinned versions in requirements.txt beside this file):

    python3 -m venv /var/tmp/agl-llm-venv
    /var/tmp/agl-llm-venv/bin/pip install -r scripts/ci/llm/requirements.txt
    /var/tmp/agl-llm-venv/bin/python scripts/ci/llm/tokenizer_check.py \\
        --gguf ~/.cache/agl/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out crates/agl-llm/tests/fixtures/smollm2_spider_dev_tokens.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# The fixed system prompt of (b). `{db_id}` and `{tables}` are filled per question from
# data/spider/tables.json; the Rust test reads the filled text from the fixture.
SYSTEM_PROMPT = (
    "You are a SQL assistant. Answer with one SQLite query and nothing else.\n"
    "Schema: database {db_id}; tables: {tables}."
)

PROBES = [
    "How many singers are older than 20?",
    "Total  2024 sales",
    "a   123 b\t\t45\n\n6",
    "<|im_start|>user\nhi<|im_end|>\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 \u201cquoted\u201d",
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6570\u636e\u5e93\u91cc\u6709\u591a\u5c11\u4e2a\u8868\uff1f",
    "emoji \U0001F600\U0001F44D\U0001F3FD and flags \U0001F1EB\U0001F1F7",
    "  leading and trailing spaces  ",
    "SELECT count(*) FROM singer WHERE age > 30 AND name != 'O''Brien';",
    "don't you'll I'M we've",
    "\u0662\u0663 \u00bd \u2163 numbers in other scripts",
]


def read_gguf_tokenizer_dict(path: str):
    """(architecture, tokenizer_dict, tokenizer_config) as transformers' `get_gguf_tokenizer` gives
    them, read with the `gguf` package instead of transformers' torch-importing reader."""
    import gguf  # llama.cpp's reader
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    reader = gguf.GGUFReader(path)
    metadata = {name: field.contents() for name, field in reader.fields.items()}
    architecture = metadata["general.architecture"]
    grouped = {
        group: {
            renamed: metadata[f"tokenizer.{key}"]
            for key, renamed in renames.items()
            if f"tokenizer.{key}" in metadata
        }
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        tokenizer_config.setdefault("add_bos_token", True)
    for name, key in (
        ("bos_token", "bos_token_id"),
        ("eos_token", "eos_token_id"),
        ("unk_token", "unknown_token_id"),
        ("pad_token", "padding_token_id"),
    ):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokenizer_dict["tokens"][token_id] if token_id is not None else None
    return architecture, tokenizer_dict, tokenizer_config


def load_tokenizer(gguf_path: str, via_autotokenizer: bool):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if via_autotokenizer:
        p = Path(gguf_path)
        return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, tokenizer_config = read_gguf_tokenizer_dict(gguf_path)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    kwargs = {k: v for k, v in tokenizer_config.items() if v is not None}
    kwargs.update(extra)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


# Qwen2's published `tokenizer.json` pre-tokenizer split pattern (Qwen/Qwen2.5-Coder-1.5B-Instruct).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def reference_backend(tok, family: str):
    """A copy of the backend tokenizer with the model's published `tokenizer.json` pre-tokenizer:
    SmolLM2's (Digits + ByteLevel with GPT-2's regex) or Qwen2's (its Split regex + ByteLevel)."""
    import copy

    from tokenizers import Regex, pre_tokenizers

    backend = copy.deepcopy(tok.backend_tokenizer)
    if family == "qwen2":
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    return backend


def chat_ids(tok, messages):
    """(rendered prompt, token ids) the way `apply_chat_template` renders and tokenizes."""
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    ids = list(ids)
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    plain = tok(text, add_special_tokens=False)["input_ids"]
    if plain != ids:
        raise SystemExit("apply_chat_template(tokenize=True) differs from tokenizing its text")
    return text, ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", required=True, help="the model's GGUF file")
    ap.add_argument(
        "--reference",
        choices=["smollm2", "qwen2"],
        default="smollm2",
        help="whose published tokenizer.json pre-tokenizer the probes' ref_ids follow",
    )
    ap.add_argument("--out", required=True, help="JSONL fixture to write")
    ap.add_argument("--spider", default=str(ROOT / "data/spider/dev.json"))
    ap.add_argument("--tables", default=str(ROOT / "data/spider/tables.json"))
    ap.add_argument("--autotokenizer", action="store_true", help="load via AutoTokenizer (needs torch)")
    args = ap.parse_args()

    import transformers

    tok = load_tokenizer(args.gguf, args.autotokenizer)
    ref = reference_backend(tok, args.reference)
    questions = json.load(open(args.spider, encoding="utf-8"))
    tables = {
        db["db_id"]: ", ".join(db["table_names_original"])
        for db in json.load(open(args.tables, encoding="utf-8"))
    }

    lines = []
    differ_from_ref = 0
    for i, item in enumerate(questions):
        question, db_id = item["question"], item["db_id"]
        q_ids = tok(question, add_special_tokens=False)["input_ids"]
        if ref.encode(question, add_special_tokens=False).ids != q_ids:
            differ_from_ref += 1
        system = SYSTEM_PROMPT.format(db_id=db_id, tables=tables.get(db_id, ""))
        sys_prompt, sys_ids = chat_ids(
            tok, [{"role": "system", "content": system}, {"role": "user", "content": question}]
        )
        nosys_prompt, nosys_ids = chat_ids(tok, [{"role": "user", "content": question}])
        lines.append(
            {
                "i": i,
                "db_id": db_id,
                "question": question,
                "q_ids": q_ids,
                "system": system,
                "sys_prompt": sys_prompt,
                "sys_ids": sys_ids,
                "nosys_prompt": nosys_prompt,
                "nosys_ids": nosys_ids,
            }
        )
    probe_diffs = 0
    for j, text in enumerate(PROBES):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        ref_ids = ref.encode(text, add_special_tokens=False).ids
        probe_diffs += ids != ref_ids
        lines.append({"probe": j, "text": text, "ids": ids, "ref_ids": ref_ids})

    header = {
        "header": True,
        "generator": "scripts/ci/llm/tokenizer_check.py",
        "transformers": transformers.__version__,
        "gguf": os.path.basename(args.gguf),
        "questions": len(questions),
        "probes": len(PROBES),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for obj in [header, *lines]:
            f.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(
        f"wrote {args.out}: {len(questions)} questions "
        f"({differ_from_ref} where transformers' GGUF conversion differs from tokenizer.json semantics), "
        f"{len(PROBES)} probes ({probe_diffs} differ)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
