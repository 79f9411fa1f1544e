"""A Python agent, unchanged: the official `openai` client inside Agent Lightning 0.3.0's runner,
with its model calls going through `agl store --llm` (the store and the governed LLM gateway on
one port).

Run by scripts/ci/agent.sh, which starts the server. By hand:

    python scripts/ci/agent/agent_test.py --url http://127.0.0.1:4747 --agl target/debug/agl

What it does:

1. The algorithm side, with agentlightning's own `LightningStoreClient`: `add_resources` with a
   `ProxyLLM` named `main_llm` (endpoint `<url>/v1`), then `enqueue_rollout` for a few small
   Spider-style tasks.
2. The agent side: `sql_agent` below is an ordinary `@agentlightning.rollout` function. It gets
   `llm` from the rollout's resources (agentlightning turns the ProxyLLM into
   `<url>/rollout/{rollout_id}/attempt/{attempt_id}/v1`) and calls
   `openai.OpenAI(base_url=llm.endpoint).chat.completions.create(...)`, once with
   `stream=True`; it knows nothing of agl. agentlightning's `LitAgentRunner` (with its
   `OtelTracer`) dequeues the rollouts, runs the agent, writes the reward span and finishes
   the attempts.
3. Checks: every rollout succeeded; each model call is an `openai.chat.completion` span of the
   rollout's attempt, written by the gateway, with non-empty int-array `prompt_token_ids` and
   `response_token_ids` that agree with the usage counts, and with the text the agent got; the
   runner's reward span is there.
4. `agl triplets --store-url URL --rollout-id RID --for-training` (agl's span→triplet adapter):
   one triplet per model call, in order, with the spans' token ids, and the rollout's reward on
   the last one; agentlightning's own `TracerTraceToTriplet` reads the same triplets from the
   same spans.
5. The official client sees OpenAI-shaped errors: a finished attempt is 409, an unknown rollout
   404.

Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

import openai

import agentlightning as agl
from agentlightning import LitAgentRunner, OtelTracer
from agentlightning.adapter import TracerTraceToTriplet
from agentlightning.emitter import find_final_reward
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types import ProxyLLM, Span

CHAT_SPAN = "openai.chat.completion"
REWARD_SPAN = "agentlightning.annotation"
MAX_TOKENS = 48
MODEL = "smollm2-135m-instruct"  # --model

# Small Spider-style tasks: a question and its database schema. `stream` makes the agent ask for
# a streamed answer; `refine` makes it take a second turn (two model calls in one rollout).
TASKS: List[Dict[str, Any]] = [
    {
        "id": "concert_singer-1",
        "question": "How many singers do we have?",
        "schema": "singer(singer_id, name, country, song_name, song_release_year, age, is_male)",
        "stream": False,
        "refine": False,
    },
    {
        "id": "pets_1-1",
        "question": "Find the number of pets whose weight is heavier than 10.",
        "schema": "pets(petid, pettype, pet_age, weight)",
        "stream": True,
        "refine": True,
    },
    {
        "id": "world_1-1",
        "question": "What are the names of all the countries in Asia?",
        "schema": "country(code, name, continent, region, population)",
        "stream": False,
        "refine": False,
    },
]

# What the agent received, per task id (a test-side record; the agent does not need it).
RECEIVED: Dict[str, List[str]] = {}
# How many streamed chunks carried text, per task id (the same kind of record).
STREAMED: Dict[str, int] = {}


# ---------------------------------------------------------------------------------------------
# The agent: plain Agent Lightning + the official openai client, nothing agl-specific.
# ---------------------------------------------------------------------------------------------


@agl.rollout
def sql_agent(task: Dict[str, Any], llm: agl.LLM) -> float:
    """Writes an SQL query for a question; the reward is 1.0 when the answer contains SELECT."""
    client = openai.OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "dummy", max_retries=0)
    messages: List[Dict[str, str]] = [
        {"role": "system", "content": "You translate questions into SQLite queries. Answer with one SQL query."},
        {"role": "user", "content": f"Schema: {task['schema']}\nQuestion: {task['question']}\nSQL:"},
    ]
    answers: List[str] = []
    if task["stream"]:
        stream = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0, stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        STREAMED[task["id"]] = sum(1 for p in pieces if p)
        text = "".join(pieces)
    else:
        response = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
        )
        text = response.choices[0].message.content or ""
    answers.append(text)
    if task["refine"]:
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Write only the SQL query, starting with SELECT."},
        ]
        response = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
        )
        text = response.choices[0].message.content or ""
        answers.append(text)
    RECEIVED[task["id"]] = answers
    return 1.0 if "select" in text.lower() else 0.0


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------


class Checks:
    def __init__(self) -> None:
        self.passed = 0
        self.failed: List[str] = []

    def ok(self, cond: bool, what: str, detail: Any = None) -> bool:
        if cond:
            self.passed += 1
            return True
        msg = what + (f": {detail!r}" if detail is not None else "")
        self.failed.append(msg)
        print(f"  FAIL {msg}", flush=True)
        return False


C = Checks()


def int_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def short(text: str, n: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def check_spans(rid: str, attempt_id: str, task: Dict[str, Any], spans: List[Span]) -> Optional[float]:
    """The gateway's call spans and the runner's reward span of one rollout; returns the reward."""
    calls = sorted((s for s in spans if s.name == CHAT_SPAN), key=lambda s: s.sequence_id)
    want_calls = 2 if task["refine"] else 1
    C.ok(len(calls) == want_calls, f"{rid}: {want_calls} {CHAT_SPAN} span(s)", [s.name for s in spans])
    received = RECEIVED.get(task["id"], [])
    for i, s in enumerate(calls):
        a = s.attributes
        what = f"{rid} call {i + 1}"
        C.ok(s.attempt_id == attempt_id, f"{what}: span of the rollout's attempt", s.attempt_id)
        C.ok(a.get("agl.source") == "gateway", f"{what}: written by the gateway (agl.source)", a.get("agl.source"))
        C.ok(int_list(a.get("prompt_token_ids")), f"{what}: prompt_token_ids is a non-empty int array", a.get("prompt_token_ids"))
        C.ok(int_list(a.get("response_token_ids")), f"{what}: response_token_ids is a non-empty int array", a.get("response_token_ids"))
        C.ok(not a.get("agl.token_ids.missing"), f"{what}: token ids not missing", a.get("agl.token_ids.missing"))
        if int_list(a.get("prompt_token_ids")) and int_list(a.get("response_token_ids")):
            C.ok(
                (len(a["prompt_token_ids"]), len(a["response_token_ids"]))
                == (a.get("gen_ai.usage.prompt_tokens"), a.get("gen_ai.usage.completion_tokens")),
                f"{what}: token id counts equal the usage counts",
                {
                    "ids": (len(a["prompt_token_ids"]), len(a["response_token_ids"])),
                    "usage": (a.get("gen_ai.usage.prompt_tokens"), a.get("gen_ai.usage.completion_tokens")),
                },
            )
            C.ok(len(a["response_token_ids"]) <= MAX_TOKENS, f"{what}: at most max_tokens generated", len(a["response_token_ids"]))
        streamed = task["stream"] and i == 0
        C.ok(bool(a.get("gen_ai.request.stream", False)) == streamed, f"{what}: gen_ai.request.stream = {streamed}", a.get("gen_ai.request.stream"))
        C.ok(a.get("gen_ai.request.model") == MODEL, f"{what}: gen_ai.request.model", a.get("gen_ai.request.model"))
        C.ok(a.get("gen_ai.request.max_tokens") == MAX_TOKENS, f"{what}: gen_ai.request.max_tokens", a.get("gen_ai.request.max_tokens"))
        if i < len(received):
            C.ok(
                a.get("gen_ai.completion.0.content") == received[i],
                f"{what}: the span's completion is the text the agent received",
                {"span": a.get("gen_ai.completion.0.content"), "agent": received[i]},
            )
        C.ok(s.status.status_code != "ERROR", f"{what}: span status not ERROR", s.status)
    rewards = [s for s in spans if s.name == REWARD_SPAN and "agentlightning.reward.0.value" in s.attributes]
    C.ok(len(rewards) == 1, f"{rid}: one reward span from the runner", [s.name for s in spans])
    reward = find_final_reward(spans)
    C.ok(isinstance(reward, float), f"{rid}: find_final_reward gives a float", reward)
    if calls and rewards:
        C.ok(rewards[0].sequence_id > calls[-1].sequence_id, f"{rid}: the reward span comes after the calls", [s.sequence_id for s in spans])
    return reward


def check_triplets(agl_bin: str, url: str, rid: str, spans: List[Span], reward: Optional[float]) -> List[Dict[str, Any]]:
    """`agl triplets --for-training` for one rollout; returns its triplets."""
    cmd = [agl_bin, "triplets", "--store-url", url, "--rollout-id", rid, "--for-training"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if not C.ok(proc.returncode == 0, f"{rid}: `agl triplets` exits 0", {"rc": proc.returncode, "stderr": proc.stderr[-800:]}):
        return []
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        C.ok(False, f"{rid}: `agl triplets` prints JSON", proc.stdout[:400])
        return []
    calls = sorted((s for s in spans if s.name == CHAT_SPAN), key=lambda s: s.sequence_id)
    triplets = out.get("triplets") or []
    C.ok(out.get("llm_calls") == len(calls), f"{rid}: triplets: llm_calls = the call spans", {"llm_calls": out.get("llm_calls"), "spans": len(calls)})
    C.ok(out.get("refused_missing_token_ids") == 0, f"{rid}: triplets: none refused", out.get("refused_missing_token_ids"))
    if not C.ok(len(triplets) == len(calls), f"{rid}: one triplet per call", {"triplets": len(triplets), "calls": len(calls)}):
        return triplets
    for i, (t, s) in enumerate(zip(triplets, calls)):
        prompt = (t.get("prompt") or {}).get("token_ids")
        response = (t.get("response") or {}).get("token_ids")
        C.ok(int_list(prompt) and int_list(response), f"{rid} triplet {i + 1}: non-empty prompt/response token_ids", t)
        C.ok(
            prompt == s.attributes.get("prompt_token_ids") and response == s.attributes.get("response_token_ids"),
            f"{rid} triplet {i + 1}: the span's token ids",
            {"triplet": (prompt, response)},
        )
    last = triplets[-1].get("reward")
    C.ok(last == reward, f"{rid}: the rollout's reward on the last triplet", {"triplet": last, "rollout": reward})
    for i, t in enumerate(triplets[:-1]):
        C.ok(t.get("reward") in (None, 0.0), f"{rid} triplet {i + 1}: no reward before the last call", t.get("reward"))
    return triplets


def check_al_adapter(rid: str, spans: List[Span], ours: List[Dict[str, Any]]) -> None:
    """Agent Lightning's own TracerTraceToTriplet reads the same triplets from the same spans."""
    theirs = [(t.prompt.get("token_ids"), t.response.get("token_ids"), t.reward) for t in TracerTraceToTriplet().adapt(spans)]
    mine = [((t.get("prompt") or {}).get("token_ids"), (t.get("response") or {}).get("token_ids"), t.get("reward")) for t in ours]
    C.ok(theirs == mine, f"{rid}: agentlightning's TracerTraceToTriplet gives the same (prompt ids, response ids, reward)", {"agentlightning": theirs, "agl": mine})


def check_errors(url: str, rid: str, attempt_id: str) -> None:
    """The official client gets OpenAI-shaped errors from the gateway (no model time spent)."""
    base = ProxyLLM(endpoint=url + "/v1", model=MODEL).get_base_url(rid, attempt_id)
    client = openai.OpenAI(base_url=base, api_key="dummy", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    try:
        client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4)
        C.ok(False, "a call on a finished attempt fails", "it succeeded")
    except openai.APIStatusError as exc:
        C.ok(exc.status_code == 409, "finished attempt: HTTP 409", exc.status_code)
        C.ok((exc.body or {}).get("code") == "attempt_finished", "finished attempt: code attempt_finished", exc.body)
    bad = ProxyLLM(endpoint=url + "/v1", model=MODEL).get_base_url("ro-000000000000", "at-00000000")
    try:
        openai.OpenAI(base_url=bad, api_key="dummy", max_retries=0).chat.completions.create(
            model=MODEL, messages=msgs, max_tokens=4
        )
        C.ok(False, "a call for an unknown rollout fails", "it succeeded")
    except openai.APIStatusError as exc:
        C.ok(exc.status_code == 404, "unknown rollout: HTTP 404", exc.status_code)
        C.ok((exc.body or {}).get("code") == "rollout_not_found", "unknown rollout: code rollout_not_found", exc.body)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    global MODEL
    MODEL = args.model
    url = args.url.rstrip("/")
    client = LightningStoreClient(url)
    t0 = time.monotonic()

    # The algorithm side: resources with a ProxyLLM, then the tasks.
    resources = await client.add_resources({"main_llm": ProxyLLM(endpoint=url + "/v1", model=MODEL)})
    rollouts = [
        await client.enqueue_rollout(input=task, mode="train", resources_id=resources.resources_id) for task in TASKS
    ]
    rids = [r.rollout_id for r in rollouts]
    by_rid = dict(zip(rids, TASKS))
    print(f"enqueued {len(rids)} rollouts with resources {resources.resources_id}: {', '.join(rids)}", flush=True)

    # The agent side: agentlightning's runner, unchanged.
    runner: LitAgentRunner[Dict[str, Any]] = LitAgentRunner(OtelTracer(), max_rollouts=len(rids), poll_interval=0.2)
    runner.init(sql_agent)
    runner.init_worker(0, client)
    t_run = time.monotonic()
    try:
        await asyncio.wait_for(runner.iter(), timeout=args.runner_timeout)
    finally:
        runner.teardown_worker(0)
        runner.teardown()
    run_s = time.monotonic() - t_run

    # The runner has finished them all; the client only allows a non-blocking wait (timeout 0).
    done = await client.wait_for_rollouts(rollout_ids=rids, timeout=0)
    status = {r.rollout_id: r.status for r in done}
    C.ok(status == {rid: "succeeded" for rid in rids}, "every rollout succeeded", status)

    total_calls = total_triplets = 0
    rows = []
    for rid in rids:
        task = by_rid[rid]
        attempt = await client.get_latest_attempt(rid)
        if not C.ok(attempt is not None, f"{rid}: has an attempt"):
            continue
        assert attempt is not None
        spans = list((await client.query_spans(rid, "latest")).items)
        reward = check_spans(rid, attempt.attempt_id, task, spans)
        calls = [s for s in spans if s.name == CHAT_SPAN]
        total_calls += len(calls)
        triplets = check_triplets(args.agl, url, rid, spans, reward)
        total_triplets += len(triplets)
        check_al_adapter(rid, spans, triplets)
        for s in sorted(calls, key=lambda s: s.sequence_id):
            a = s.attributes
            kind = f"stream ({STREAMED.get(task['id'])} text chunks)" if a.get("gen_ai.request.stream") else "plain"
            rows.append(
                f"  {rid} {kind} "
                f"prompt {len(a.get('prompt_token_ids') or [])} tok, response {len(a.get('response_token_ids') or [])} tok, "
                f"{a.get('agl.latency_s', 0.0):.2f} s, verdict {a.get('agl.gateway.verdict')}: {short(str(a.get('gen_ai.completion.0.content')))!r}"
            )
        rows.append(f"  {rid} reward {reward}")
    check_errors(url, rids[0], (await client.get_latest_attempt(rids[0])).attempt_id)  # type: ignore[union-attr]
    await client.close()

    print("\n".join(rows))
    print(
        f"\n{len(rids)} rollouts, {total_calls} model calls, {total_triplets} triplets; runner {run_s:.1f} s, "
        f"total {time.monotonic() - t0:.1f} s"
    )
    print(f"{C.passed} passed, {len(C.failed)} failed")
    for f in C.failed:
        print(f"  - {f}")
    return 0 if not C.failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("AGL_STORE_URL", "http://127.0.0.1:4747"))
    parser.add_argument("--agl", default="agl", help="the agl binary (for `agl triplets`)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--runner-timeout", type=float, default=150.0, help="seconds the runner may take")
    parser.add_argument("--deadline", type=float, default=240.0, help="kill the run after this many seconds")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    try:
        return asyncio.run(main_async(args))
    except Exception:  # noqa: BLE001 - report and fail
        traceback.print_exc()
        print(f"{C.passed} passed, {len(C.failed) + 1} failed")
        return 1


if __name__ == "__main__":
    sys.exit(main())
