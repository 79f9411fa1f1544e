"""Tool calls and structured outputs of `agl llm serve` through unchanged agent frameworks.

Usage: tools_test.py --url http://127.0.0.1:PORT [--model NAME] [--only NAME ...]

Runs each check below against the server, prints `PASS name` or `FAIL name: reason` for each,
and exits 1 when any failed (0 when all passed). Every check uses one tool, `get_weather(city)`,
at temperature 0 with a small `max_tokens`, and forces the call (`tool_choice` required or named)
wherever it needs one: a 135M model rarely calls a tool on its own. The checks look at shapes and
types (a function name, a string argument, a model instance), never at values a small model may
get wrong.

- langchain_bind_tools: langchain-openai's `ChatOpenAI.bind_tools(..., tool_choice=name)` gives
  an AIMessage with a `get_weather` tool call whose args are a dict with a string `city`.
- langchain_structured_function_calling, langchain_structured_json_schema: LangChain's
  `with_structured_output(Person, method=...)` gives a `Person` (a name string, an age int).
- langchain_structured_json_mode: `method="json_mode"` gives a dict.
- agents_sdk_tool_round_trip: the OpenAI Agents SDK (`OpenAIChatCompletionsModel`, tool_choice
  required, reset after the call as the SDK does by default) runs the tool, and the next request
  it sends carries the tool's output as a `tool` message answering the call's id.
- litellm_tool_call: `litellm.completion(model="openai/...", tool_choice="required")` gives a
  `get_weather` tool call.
- openai_required_stream_and_plain_agree: the official client, `tool_choice="required"`, plain
  and streamed (deltas accumulated by index): the same calls, `finish_reason == "tool_calls"`.
- openai_named_tool_choice: a named function gives a call of it and `finish_reason == "stop"`.
- openai_bad_*: malformed requests raise `openai.BadRequestError` (400) whose `param` names the
  field, and a plain chat request right after each is answered.

Environment: LITELLM_LOCAL_MODEL_COST_MAP=True is set here (LiteLLM would otherwise try to fetch
its price list from GitHub at import).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import openai  # noqa: E402
from pydantic import BaseModel  # noqa: E402

TIMEOUT_S = 120
MAX_TOKENS = 96
QUESTION = "What is the weather in Paris?"
TOOL_OUTPUT = "18 C and sunny"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city"}},
            "required": ["city"],
        },
    },
}


class CheckFailed(Exception):
    """A check's expectation did not hold; the message says which and what came back."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def get_weather(city: str) -> str:
    """Get the current weather of a city"""
    return TOOL_OUTPUT


class Person(BaseModel):
    """A person mentioned in the text."""

    name: str
    age: int


class Checks:
    def __init__(self, url: str, model: str) -> None:
        self.base_url = url.rstrip("/") + "/v1"
        self.model = model
        self.client = openai.OpenAI(base_url=self.base_url, api_key="x", max_retries=0, timeout=TIMEOUT_S)

    # -----------------------------------------------------------------------------------------
    # langchain-openai
    # -----------------------------------------------------------------------------------------

    def _chat_openai(self):
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            base_url=self.base_url,
            api_key="x",
            model=self.model,
            temperature=0,
            max_tokens=MAX_TOKENS,
            timeout=TIMEOUT_S,
            max_retries=0,
        )

    def langchain_bind_tools(self) -> str:
        from langchain_core.messages import AIMessage

        llm = self._chat_openai().bind_tools([get_weather], tool_choice="get_weather")
        msg = llm.invoke(QUESTION)
        expect(isinstance(msg, AIMessage), f"not an AIMessage: {msg!r}")
        expect(not msg.invalid_tool_calls, f"invalid tool calls: {msg.invalid_tool_calls!r}")
        expect(len(msg.tool_calls) >= 1, f"no tool call: {msg!r}")
        call = msg.tool_calls[0]
        expect(call["name"] == "get_weather", f"called {call['name']!r}: {msg!r}")
        args = call["args"]
        expect(isinstance(args, dict) and isinstance(args.get("city"), str), f"args {args!r}")
        return f"get_weather({args})"

    def _structured(self, method: str) -> str:
        llm = self._chat_openai().with_structured_output(Person, method=method, include_raw=True)
        out = llm.invoke("Alice is 30 years old. Extract the person.")
        parsed, error = out["parsed"], out["parsing_error"]
        expect(error is None, f"parsing error {error!r}; raw answer {out['raw']!r}")
        expect(isinstance(parsed, Person), f"got {parsed!r}, not a Person; raw answer {out['raw']!r}")
        return repr(parsed)

    def langchain_structured_function_calling(self) -> str:
        return self._structured("function_calling")

    def langchain_structured_json_schema(self) -> str:
        return self._structured("json_schema")

    def langchain_structured_json_mode(self) -> str:
        llm = self._chat_openai().with_structured_output(None, method="json_mode", include_raw=True)
        out = llm.invoke(
            "Alice is 30 years old. Answer in JSON with the keys name and age."
        )
        parsed, error = out["parsed"], out["parsing_error"]
        expect(error is None, f"parsing error {error!r}; raw answer {out['raw']!r}")
        expect(isinstance(parsed, dict), f"got {parsed!r}, not a dict; raw answer {out['raw']!r}")
        return repr(parsed)

    # -----------------------------------------------------------------------------------------
    # The OpenAI Agents SDK
    # -----------------------------------------------------------------------------------------

    def agents_sdk_tool_round_trip(self) -> str:
        """The tool runs and its output goes back to the model.

        The SDK resets `tool_choice` after a tool call (`reset_tool_choice`, True by default), so
        the second request is `auto` and a 135M model usually answers in text. When it calls the
        tool again instead, the run can end with MaxTurnsExceeded: that is accepted when the
        tool's output went back to the server in a `tool` message, because the round trip through
        agl (call parsed, tool run by the SDK, result rendered into the next prompt) is what this
        checks; whether a small model stops calling is the model's quality, not compatibility.
        """
        from agents import (
            Agent,
            MaxTurnsExceeded,
            ModelSettings,
            OpenAIChatCompletionsModel,
            Runner,
            ToolCallOutputItem,
            function_tool,
            set_tracing_disabled,
        )

        set_tracing_disabled(True)
        calls: list[str] = []
        bodies: list[dict[str, Any]] = []

        @function_tool
        def get_weather(city: str) -> str:
            """Get the current weather of a city"""
            calls.append(city)
            return TOOL_OUTPUT

        async def record(request) -> None:
            if request.url.path.endswith("/chat/completions"):
                bodies.append(json.loads(request.content or b"{}"))

        async def run():
            http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [record]})
            client = openai.AsyncOpenAI(
                base_url=self.base_url, api_key="x", max_retries=0, timeout=TIMEOUT_S, http_client=http
            )
            agent = Agent(
                name="weather",
                instructions="You answer questions about the weather with the get_weather tool.",
                tools=[get_weather],
                model=OpenAIChatCompletionsModel(model=self.model, openai_client=client),
                model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=MAX_TOKENS),
            )
            expect(agent.reset_tool_choice is True, "reset_tool_choice is not True by default")
            try:
                return await asyncio.wait_for(Runner.run(agent, QUESTION, max_turns=3), 3 * TIMEOUT_S), None
            except MaxTurnsExceeded as e:
                return None, e
            finally:
                await client.close()

        result, exceeded = asyncio.run(run())
        expect(len(calls) >= 1, f"the tool was never called; requests sent: {bodies!r}")
        expect(len(bodies) >= 2, f"only {len(bodies)} request(s) sent after the tool ran")
        first, second = bodies[0], bodies[1]
        expect(first.get("tool_choice") == "required", f"first request's tool_choice {first.get('tool_choice')!r}")
        expect(second.get("tool_choice") in (None, "auto"), f"tool_choice not reset: {second.get('tool_choice')!r}")
        messages = second.get("messages", [])
        asked = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        answered = [m for m in messages if m.get("role") == "tool"]
        expect(asked, f"the second request has no assistant tool_calls: {messages!r}")
        expect(answered, f"the second request has no tool message: {messages!r}")
        expect(
            answered[0].get("tool_call_id") == asked[0].get("id") and TOOL_OUTPUT in str(answered[0].get("content")),
            f"the tool message does not answer the call: {asked[0]!r} / {answered[0]!r}",
        )
        if exceeded is not None:
            items = exceeded.run_data.new_items if exceeded.run_data else []
        else:
            items = result.new_items
        outputs = [i for i in items if isinstance(i, ToolCallOutputItem)]
        expect(outputs and TOOL_OUTPUT in str(outputs[0].output), f"no ToolCallOutputItem in {items!r}")
        if exceeded is not None:
            return (
                f"tool called {len(calls)}x with {calls}; output sent back; the model kept calling "
                f"until MaxTurnsExceeded (accepted, see the docstring)"
            )
        return f"tool called with {calls}; output sent back; final answer {str(result.final_output)[:60]!r}"

    # -----------------------------------------------------------------------------------------
    # LiteLLM
    # -----------------------------------------------------------------------------------------

    def litellm_tool_call(self) -> str:
        import litellm

        resp = litellm.completion(
            model="openai/" + self.model,
            api_base=self.base_url,
            api_key="x",
            messages=[{"role": "user", "content": QUESTION}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            temperature=0,
            max_tokens=MAX_TOKENS,
            timeout=TIMEOUT_S,
            num_retries=0,
        )
        calls = resp.choices[0].message.tool_calls
        expect(calls, f"no tool_calls: {resp!r}")
        expect(calls[0].function.name == "get_weather", f"called {calls[0].function.name!r}")
        args = json.loads(calls[0].function.arguments)
        expect(isinstance(args, dict), f"arguments {calls[0].function.arguments!r}")
        return f"{calls[0].function.name}({calls[0].function.arguments})"

    # -----------------------------------------------------------------------------------------
    # The official openai client
    # -----------------------------------------------------------------------------------------

    def _weather_request(self, **kwargs) -> dict[str, Any]:
        return dict(
            model=self.model,
            messages=[{"role": "user", "content": QUESTION}],
            tools=[WEATHER_TOOL],
            temperature=0,
            max_tokens=MAX_TOKENS,
            **kwargs,
        )

    def _streamed_calls(self, **kwargs) -> tuple[list[dict[str, Any]], str | None]:
        """Streams the request; accumulates `delta.tool_calls` by index as clients do."""
        by_index: dict[int, dict[str, Any]] = {}
        finish = None
        for chunk in self.client.chat.completions.create(**self._weather_request(stream=True, **kwargs)):
            for choice in chunk.choices:
                for d in choice.delta.tool_calls or []:
                    acc = by_index.setdefault(d.index, {"id": None, "type": None, "name": "", "arguments": ""})
                    acc["id"] = d.id or acc["id"]
                    acc["type"] = d.type or acc["type"]
                    if d.function is not None:
                        acc["name"] += d.function.name or ""
                        acc["arguments"] += d.function.arguments or ""
                finish = choice.finish_reason or finish
        return [by_index[i] for i in sorted(by_index)], finish

    def openai_required_stream_and_plain_agree(self) -> str:
        plain = self.client.chat.completions.create(**self._weather_request(tool_choice="required"))
        choice = plain.choices[0]
        calls = choice.message.tool_calls or []
        expect(calls, f"no tool_calls: {plain.model_dump_json()}")
        expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
        for c in calls:
            expect(c.id.startswith("call_") and c.type == "function", f"call envelope {c!r}")
            expect(c.function.name == "get_weather", f"called {c.function.name!r}")
        streamed, finish = self._streamed_calls(tool_choice="required")
        expect(finish == "tool_calls", f"streamed finish_reason {finish!r}")
        expect(
            [c["name"] for c in streamed] == [c.function.name for c in calls],
            f"streamed names {[c['name'] for c in streamed]} != {[c.function.name for c in calls]}",
        )
        for s, p in zip(streamed, calls):
            expect(s["id"] and s["type"] == "function", f"streamed call envelope {s!r}")
            expect(
                json.loads(s["arguments"]) == json.loads(p.function.arguments),
                f"streamed arguments {s['arguments']!r} != {p.function.arguments!r}",
            )
        return "; ".join(f"{c.function.name}({c.function.arguments})" for c in calls)

    def openai_named_tool_choice(self) -> str:
        named = {"type": "function", "function": {"name": "get_weather"}}
        plain = self.client.chat.completions.create(**self._weather_request(tool_choice=named))
        choice = plain.choices[0]
        calls = choice.message.tool_calls or []
        expect(calls and calls[0].function.name == "get_weather", f"no get_weather call: {plain.model_dump_json()}")
        expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r} (OpenAI's is 'stop')")
        json.loads(calls[0].function.arguments)
        streamed, finish = self._streamed_calls(tool_choice=named)
        expect(finish == "stop", f"streamed finish_reason {finish!r}")
        expect(streamed and streamed[0]["name"] == "get_weather", f"streamed calls {streamed!r}")
        return f"{calls[0].function.name}({calls[0].function.arguments})"

    def _bad_request(self, param: str, **kwargs) -> str:
        try:
            resp = self.client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=8, **kwargs
            )
        except openai.BadRequestError as e:
            expect(e.status_code == 400, f"status {e.status_code}")
            expect(e.param == param, f"param {e.param!r}, not {param!r}: {e.body!r}")
            reason = f"400 param={e.param} code={e.code}: {e.message[:100]}"
        else:
            raise CheckFailed(f"no error; answered {resp.model_dump_json()[:300]}")
        ok = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
        )
        expect(ok.choices and ok.choices[0].message.content, f"the next plain request: {ok.model_dump_json()}")
        return reason

    def openai_bad_response_format_schema(self) -> str:
        return self._bad_request(
            "response_format.json_schema.schema",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}},
        )

    def openai_bad_tool_choice_unknown_function(self) -> str:
        return self._bad_request(
            "tool_choice",
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )

    def openai_bad_tool_parameters(self) -> str:
        bad = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": 3}}}
        return self._bad_request("tools[0].function.parameters", tools=[bad])

    def openai_bad_legacy_functions(self) -> str:
        # Sent as an extra field so the check does not depend on the client still declaring it.
        return self._bad_request("functions", extra_body={"functions": [WEATHER_TOOL["function"]]})


CHECKS: list[str] = [
    "langchain_bind_tools",
    "langchain_structured_function_calling",
    "langchain_structured_json_schema",
    "langchain_structured_json_mode",
    "agents_sdk_tool_round_trip",
    "litellm_tool_call",
    "openai_required_stream_and_plain_agree",
    "openai_named_tool_choice",
    "openai_bad_response_format_schema",
    "openai_bad_tool_choice_unknown_function",
    "openai_bad_tool_parameters",
    "openai_bad_legacy_functions",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server's base URL (without /v1)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--only", nargs="*", choices=CHECKS, help="run only these checks")
    args = ap.parse_args()

    checks = Checks(args.url, args.model)
    failed: list[str] = []
    for name in args.only or CHECKS:
        fn: Callable[[], str] = getattr(checks, name)
        start = time.monotonic()
        try:
            detail = fn()
        except CheckFailed as e:
            print(f"FAIL {name}: {e}", flush=True)
            failed.append(name)
        except Exception as e:  # a framework's own error is a failure of this check, not of the run
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=4, file=sys.stderr)
            failed.append(name)
        else:
            print(f"PASS {name} ({time.monotonic() - start:.1f} s): {detail}", flush=True)
    total = len(args.only or CHECKS)
    if failed:
        print(f"tools_test.py: {len(failed)} of {total} checks failed: {', '.join(failed)}", flush=True)
        sys.exit(1)
    print(f"tools_test.py: all {total} checks passed", flush=True)


if __name__ == "__main__":
    main()
