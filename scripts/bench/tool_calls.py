#!/usr/bin/env python3
"""How often a served model calls the right tool with the right arguments.

Usage: tool_calls.py --url http://127.0.0.1:8000 [--model NAME] [--prompts FILE] [--modes auto,required]

Sends each prompt of scripts/bench/tool_prompts.jsonl (24 prompts, four tools: get_weather,
convert_currency, lookup_order, send_email; every prompt offers all four) through the official
`openai` client at temperature 0, once per `tool_choice` mode, and prints a Markdown table:
per mode, the share of answers with any tool call, with the expected tool as the first call, and
with the expected tool and every expected argument value (strings compared case-insensitively
after trimming, numbers numerically), plus the mean seconds per request.

Not a CI test: a measurement (docs/benchmarks.md reports its figures with the command).
"""
import argparse
import json
import pathlib
import sys
import time

from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city's name"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money from one currency to another.",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"},
            "from_currency": {"type": "string", "description": "ISO 4217 code, e.g. USD"},
            "to_currency": {"type": "string", "description": "ISO 4217 code, e.g. EUR"}},
            "required": ["amount", "from_currency", "to_currency"]}}},
    {"type": "function", "function": {
        "name": "lookup_order", "description": "Look up an order by its number.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "integer"}}, "required": ["order_id"]}}},
    {"type": "function", "function": {
        "name": "send_email", "description": "Send an email.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"}},
                       "required": ["to", "subject"]}}},
]


def same(expected, got):
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        try:
            return float(got) == float(expected)
        except (TypeError, ValueError):
            return False
    return isinstance(got, str) and got.strip().lower() == str(expected).strip().lower()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--prompts", default=str(pathlib.Path(__file__).with_name("tool_prompts.jsonl")))
    ap.add_argument("--modes", default="auto,required")
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    client = OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="x", timeout=600)
    model = args.model or client.models.list().data[0].id
    cases = [json.loads(line) for line in open(args.prompts) if line.strip()]
    print(f"model {model}, {len(cases)} prompts, max_tokens {args.max_tokens}", file=sys.stderr)
    rows = []
    for mode in args.modes.split(","):
        called = right_tool = right_args = 0
        seconds = 0.0
        for case in cases:
            t0 = time.monotonic()
            r = client.chat.completions.create(
                model=model, temperature=0, max_tokens=args.max_tokens, tools=TOOLS, tool_choice=mode,
                messages=[{"role": "user", "content": case["prompt"]}])
            seconds += time.monotonic() - t0
            calls = r.choices[0].message.tool_calls or []
            if calls:
                called += 1
                first = calls[0].function
                if first.name == case["tool"]:
                    right_tool += 1
                    try:
                        got = json.loads(first.arguments)
                    except json.JSONDecodeError:
                        got = {}
                    if all(same(v, got.get(k)) for k, v in case["args"].items()):
                        right_args += 1
            print(f"  {mode:8} {case['prompt'][:48]:48} -> "
                  + (f"{calls[0].function.name}({calls[0].function.arguments})" if calls
                     else repr((r.choices[0].message.content or '')[:60])), file=sys.stderr)
        n = len(cases)
        rows.append((mode, called / n, right_tool / n, right_args / n, seconds / n))
    print(f"| tool_choice | any call | right tool | right tool and arguments | s/request |")
    print("|---|---|---|---|---|")
    for mode, a, b, c, s in rows:
        print(f"| {mode} | {a:.3f} | {b:.3f} | {c:.3f} | {s:.2f} |")


if __name__ == "__main__":
    main()
