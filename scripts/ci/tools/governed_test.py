"""A LangChain agent, unchanged, under agl's governed gateway: a denied tool is never run.

Run by scripts/ci/tools.sh against ``agl store --llm MODEL --llm-policy POLICY --llm-audit-log DB``
whose policy denies the tool ``delete_all_rows`` by name (``tool_policy``) with the default
``on_block: refuse``. The script:

1. creates a rollout and its attempt through the store's HTTP API (``POST /v1/agl/rollouts``);
2. binds ONE tool, ``delete_all_rows``, to langchain-openai's ``ChatOpenAI`` at the attempt's
   base URL with ``tool_choice`` naming it, so the real model deterministically proposes the call
   (agl's engine constrains a named tool choice to a call of that tool);
3. runs LangChain's tool-calling agent loop as langchain-core documents it (``invoke``; run each
   ``AIMessage.tool_calls`` entry with ``tool.invoke`` and answer it with a ``ToolMessage``; stop
   at an answer without tool calls; at most ``MAX_TURNS`` turns), plain and then streamed
   (``ChatOpenAI(streaming=True)``);
4. checks: the tool function never ran; the loop ended normally on the first turn with the
   gateway's refusal as the answer (``finish_reason`` ``stop``, no tool calls); the attempt has
   ``tool_policy`` violation spans (blocked) under call spans marked ``agl.gateway.refused``;
5. asks the same kernel about the same call from the agent's own code with
   ``examples/python/agl_governance.py``'s ``check`` (verdict ``block``, recorded on the attempt).

The flight recorder (``agl audit verify`` and the blocked ``tool_call`` entries) is checked by
tools.sh once the server has stopped. Prints PASS/FAIL per check; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List

import httpx
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))
from agl_governance import GovernanceError, check  # noqa: E402

TOOL = "delete_all_rows"
MAX_TURNS = 3
REFUSAL = f"agl governance blocked the call to tool `{TOOL}` (policy `tool_policy`"

executed: List[Dict[str, Any]] = []
failures: List[str] = []


@tool
def delete_all_rows(table: str) -> str:
    """Delete every row of a table."""
    executed.append({"table": table})
    return f"deleted every row of {table}"


def expect(ok: bool, what: str, detail: Any = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'}: {what}" + (f" ({detail})" if detail and not ok else ""), flush=True)
    if not ok:
        failures.append(what)


def agent_loop(llm: Any, messages: List[BaseMessage]) -> List[BaseMessage]:
    """LangChain's tool-calling loop: call the model, run its tool calls, repeat."""
    tools: Dict[str, Callable[..., Any]] = {TOOL: delete_all_rows}
    for _ in range(MAX_TURNS):
        ai = llm.invoke(messages)
        messages.append(ai)
        if not ai.tool_calls:
            break
        for call in ai.tool_calls:
            result = tools[call["name"]].invoke(call["args"])
            messages.append(ToolMessage(content=str(result), tool_call_id=call["id"]))
    return messages


def spans_of(url: str, rid: str, aid: str) -> List[Dict[str, Any]]:
    r = httpx.get(f"{url}/v1/agl/spans", params={"rollout_id": rid, "attempt_id": aid}, timeout=30)
    r.raise_for_status()
    body = r.json()
    return body["items"] if isinstance(body, dict) else body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="agl store --llm address, e.g. http://127.0.0.1:4747")
    parser.add_argument("--model", required=True)
    args = parser.parse_args()
    url = args.url.rstrip("/")

    r = httpx.post(f"{url}/v1/agl/rollouts", json={"input": {"task": "governed tool"}}, timeout=30)
    r.raise_for_status()
    started = r.json()
    rid, aid = started["rollout_id"], started["attempt"]["attempt_id"]
    base_url = f"{url}/rollout/{rid}/attempt/{aid}/v1"
    print(f"rollout {rid}, attempt {aid}, base URL {base_url}", flush=True)

    for streaming in (False, True):
        how = "streamed" if streaming else "plain"
        t0 = time.monotonic()
        chat = ChatOpenAI(
            model=args.model,
            base_url=base_url,
            api_key="dummy",
            temperature=0,
            max_tokens=48,
            streaming=streaming,
        )
        llm = chat.bind_tools([delete_all_rows], tool_choice=TOOL)
        messages = agent_loop(llm, [HumanMessage(content="Empty the table `singer`.")])
        answers = [m for m in messages if isinstance(m, AIMessage)]
        last = answers[-1]
        expect(not executed, f"{how}: the denied tool never ran", executed)
        expect(len(answers) == 1, f"{how}: the loop ended after one model turn", len(answers))
        expect(not last.tool_calls, f"{how}: the agent got no tool call", last.tool_calls)
        content = last.content if isinstance(last.content, str) else str(last.content)
        expect(content.startswith(REFUSAL), f"{how}: the agent read the refusal", content[:200])
        finish = (last.response_metadata or {}).get("finish_reason")
        expect(finish == "stop", f"{how}: finish_reason is stop", finish)
        print(f"{how}: {time.monotonic() - t0:.1f} s; the agent read: {content!r}", flush=True)

    spans = spans_of(url, rid, aid)
    calls = [s for s in spans if s.get("name") == "openai.chat.completion"]
    expect(len(calls) == 2, "two call spans on the attempt", len(calls))
    expect(
        all(s["attributes"].get("agl.gateway.refused") is True for s in calls),
        "the call spans say the agent was sent a refusal",
        [s["attributes"].get("agl.gateway.refused") for s in calls],
    )
    expect(
        all(s["attributes"].get("gen_ai.completion.0.tool_calls.0.name") == TOOL for s in calls),
        "the call spans keep the model's real tool call",
    )
    violations = [s for s in spans if s["attributes"].get("agent_os.violation.policy") == "tool_policy"]
    expect(len(violations) >= 2, "tool_policy violation spans on the attempt", len(violations))
    expect(
        all(s["attributes"].get("agent_os.violation.blocked") is True for s in violations),
        "the violations are blocking",
    )

    # The same call from the agent's own code, through the Python helper.
    decision = check({"kind": {"type": "tool_call", "name": TOOL, "arguments": {"table": "singer"}}}, base_url)
    expect(decision["verdict"] == "block", "agl_governance.check blocks the call", decision)
    expect(decision["recorded"] >= 1, "agl_governance.check recorded it on the attempt", decision)
    try:
        check({"kind": {"type": "nope"}}, base_url)
        expect(False, "agl_governance.check raises on a bad action")
    except GovernanceError as e:
        expect(e.status == 400 and "nope" in e.message, "agl_governance.check raises the server's message", e)

    print(f"{len(failures)} failed" if failures else "all passed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
