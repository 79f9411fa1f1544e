"""OpenAI-compatibility test of `agl llm serve` with the official `openai` Python client.

Usage: openai_test.py --url http://127.0.0.1:PORT [--model NAME] [--spider DIR]

Asks a Spider dev question (concert_singer, "How many singers do we have?") with its schema by
chat at temperature 0 with vLLM's `return_token_ids`, and checks: a non-empty answer, the
prompt's token ids, each choice's token ids, `logprobs.content` aligned with them; that
streaming gives the same text; completions with a token-id prompt; that the same seed gives the
same token ids; that an unknown model raises `openai.NotFoundError`; and that a malformed
request raises `openai.BadRequestError`. Prints a short summary (the SQL the model wrote).
Exits non-zero on the first failure.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parents[3]


def fail(message: str) -> None:
    print(f"openai_test.py: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def extra(obj, name: str):
    """A field the OpenAI types do not declare (vLLM's extensions), or None."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def spider_prompt(spider: Path, db_id: str, question: str) -> tuple[str, str]:
    """The schema of `db_id` as CREATE TABLE lines, and the gold SQL of `question`."""
    tables = json.loads((spider / "tables.json").read_text())
    dev = json.loads((spider / "dev.json").read_text())
    db = next(t for t in tables if t["db_id"] == db_id)
    gold = next(d["query"] for d in dev if d["db_id"] == db_id and d["question"] == question)
    lines = []
    for ti, table in enumerate(db["table_names_original"]):
        cols = [
            f"{name} {typ}"
            for (t, name), typ in zip(db["column_names_original"], db["column_types"])
            if t == ti
        ]
        lines.append(f"CREATE TABLE {table} ({', '.join(cols)});")
    return "\n".join(lines), gold


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="the server's base URL (without /v1)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--spider", default=str(ROOT / "data" / "spider"))
    args = ap.parse_args()

    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0, timeout=120)

    models = [m.id for m in client.models.list()]
    check(args.model in models, f"/v1/models lists {models}, not {args.model}")

    # 1. A Spider question by chat, greedy, with token ids and logprobs.
    question = "How many singers do we have?"
    schema, gold = spider_prompt(Path(args.spider), "concert_singer", question)
    messages = [
        {"role": "system", "content": "You are a SQL expert."},
        {"role": "user", "content": f"Given the tables:\n{schema}\n\nWrite a SQL query that answers: {question}"},
    ]
    chat = client.chat.completions.create(
        model=args.model,
        messages=messages,
        temperature=0,
        max_tokens=48,
        logprobs=True,
        top_logprobs=2,
        extra_body={"return_token_ids": True},
    )
    choice = chat.choices[0]
    answer = choice.message.content or ""
    check(answer.strip() != "", f"empty answer: {chat}")
    check(chat.object == "chat.completion" and chat.id.startswith("chatcmpl-"), f"bad envelope: {chat}")
    prompt_ids = extra(chat, "prompt_token_ids")
    token_ids = extra(choice, "token_ids")
    check(isinstance(prompt_ids, list) and len(prompt_ids) == chat.usage.prompt_tokens, "prompt_token_ids")
    check(isinstance(token_ids, list) and len(token_ids) == chat.usage.completion_tokens, "token_ids")
    content = choice.logprobs.content if choice.logprobs else None
    check(content is not None and len(content) == len(token_ids), "logprobs.content is not aligned with token_ids")
    check(all(lp.logprob <= 0 for lp in content), "a logprob above 0")
    check(all(len(lp.top_logprobs) == 2 for lp in content), "top_logprobs")
    check(abs(content[0].top_logprobs[0].logprob - content[0].logprob) < 1e-4, "greedy token is not the most likely")

    # 2. Streaming gives the same text at temperature 0.
    stream = client.chat.completions.create(
        model=args.model,
        messages=messages,
        temperature=0,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    parts, streamed_ids, usage, finish = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            streamed_ids.extend(extra(c, "token_ids") or [])
            finish = c.finish_reason or finish
    streamed = "".join(parts)
    check(streamed == answer, f"streamed text differs:\n{streamed!r}\n{answer!r}")
    check(streamed_ids == token_ids, "streamed token ids differ")
    check(usage is not None and usage.completion_tokens == len(token_ids), f"usage chunk: {usage}")
    check(finish == choice.finish_reason, f"finish_reason {finish} != {choice.finish_reason}")

    # 3. Completions with a token-id prompt (the chat prompt's ids).
    comp = client.completions.create(
        model=args.model,
        prompt=prompt_ids,
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    cc = comp.choices[0]
    check(comp.object == "text_completion", f"bad envelope: {comp}")
    check(extra(cc, "prompt_token_ids") == prompt_ids, "completion prompt_token_ids")
    comp_ids = extra(cc, "token_ids")
    check(comp_ids == token_ids[: len(comp_ids)], "greedy completion of the same ids differs from the chat's")
    check(len(cc.logprobs.tokens) == len(comp_ids) == comp.usage.completion_tokens, "legacy logprobs")

    # 4. Same seed, same tokens (sampling at temperature 1).
    def sample() -> list[int]:
        r = client.chat.completions.create(
            model=args.model,
            messages=[{"role": "user", "content": "Name a SQL keyword."}],
            temperature=1.0,
            seed=42,
            max_tokens=16,
            extra_body={"return_token_ids": True},
        )
        return extra(r.choices[0], "token_ids")

    first, second = sample(), sample()
    check(first == second and len(first) > 0, f"same seed, different tokens: {first} vs {second}")

    # 5. Errors arrive as the client's exceptions.
    try:
        client.chat.completions.create(model="no-such-model", messages=messages, max_tokens=1)
        fail("an unknown model did not raise")
    except openai.NotFoundError as e:
        check(e.status_code == 404 and (e.code == "model_not_found"), f"unknown model: {e}")
    try:
        client.chat.completions.create(model=args.model, messages=messages, max_tokens=1, temperature=7)
        fail("temperature 7 did not raise")
    except openai.BadRequestError as e:
        check(e.status_code == 400, f"bad temperature: {e}")

    print(f"openai_test.py: Spider question: {question}")
    print(f"openai_test.py: model's SQL:     {answer.strip()!r}")
    print(f"openai_test.py: gold SQL:        {gold!r}")
    print(
        f"openai_test.py: {chat.usage.prompt_tokens} prompt tokens, {chat.usage.completion_tokens} generated "
        f"({choice.finish_reason}); streaming, completions, seeds and errors agree"
    )
    print("openai_test.py: all checks passed")


if __name__ == "__main__":
    main()
