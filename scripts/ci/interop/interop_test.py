"""Interoperability test: Agent Lightning 0.3.0's own Python client and runner against a store server.

Run by scripts/ci/interop.sh, which starts the server. By hand:

    python scripts/ci/interop/interop_test.py --url http://127.0.0.1:4747 --server agl

`--server agl` (the default) expects agl's behaviour where it deliberately deviates from Agent
Lightning v0.3.0 (§12 of the wire-protocol reference: Q1, Q2, Q6, Q7, Q8, Q15, Q16 and the
transition checks); `--server python` expects what agentlightning's own `agl store` does, so the
program itself can be validated against the reference implementation. Each deviation is marked
`DEVIATION` below, with the Python server's behaviour in a comment.

What it covers:

* every store method of `agentlightning.store.client_server.LightningStoreClient`, with its
  results checked (types, statuses, ids, counts, ordering, pagination echo);
* the OpenTelemetry SDK's OTLP/HTTP exporter (protobuf, gzip) in the LLM proxy's pattern
  (shared sequence id in the resource, span-level override, field mapping, duplicates, spans
  without ids);
* raw HTTP details (success and validation codes, 400 messages, GET query forms, unknown keys);
* concurrency through one client (no double dequeue, distinct sequence ids), edge JSON values
  (big integers, NaN/Infinity), the timeout watchdog with a retry;
* a `LitAgentRunner` with agentlightning's `OtelTracer` running a `LitAgent` that emits an
  operation, a message and an object span and returns a float reward: the spans must arrive over
  OTLP (`POST /v1/traces`, server-issued sequence ids) and the reward span over `POST /spans`;
* with `--state-out FILE` / `--verify-state FILE`: that a durable server restarted on the same
  database still has every rollout, span, resource and counter.

It assumes a fresh, empty store. Every step runs under a timeout, and a watchdog kills the
process if the whole run hangs. Exit status: 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import os
import re
import sys
import time
import traceback
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, TypeVar

import aiohttp
import opentelemetry.trace as otel_trace
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from agentlightning import LitAgent, LitAgentRunner, OtelTracer
from agentlightning.emitter import emit_message, emit_object, find_final_reward, get_reward_value, operation
from agentlightning.store.client_server import LightningStoreClient
from agentlightning.types import (
    LLM,
    Attempt,
    AttemptedRollout,
    EnqueueRolloutRequest,
    NamedResources,
    PaginatedResult,
    PromptTemplate,
    ProxyLLM,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    Span,
    Worker,
)

T = TypeVar("T")

STEP_TIMEOUT = 45.0
ROLLOUT_ID = re.compile(r"^ro-[0-9a-f]{12}$")
ATTEMPT_ID = re.compile(r"^at-[0-9a-f]{8}$")
RESOURCES_ID = re.compile(r"^rs-[0-9a-f]{12}$")
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


class CheckFailed(AssertionError):
    """A check failed; the current section stops."""


class Checks:
    """Counts checks, prints failures, and lets a section go on or stop."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed: List[str] = []
        self.section = ""

    def ok(self, cond: bool, what: str, detail: Any = None) -> None:
        """Record a check; raise CheckFailed (stopping the section) when it fails."""
        if cond:
            self.passed += 1
            return
        msg = f"[{self.section}] {what}" + (f": {detail!r}" if detail is not None else "")
        self.failed.append(msg)
        print(f"  FAIL {msg}", flush=True)
        raise CheckFailed(msg)

    def soft(self, cond: bool, what: str, detail: Any = None) -> bool:
        """Record a check; on failure, note it and carry on."""
        try:
            self.ok(cond, what, detail)
            return True
        except CheckFailed:
            return False

    def eq(self, got: Any, want: Any, what: str) -> None:
        self.ok(got == want, what, {"got": got, "want": want} if got != want else None)


C = Checks()


async def step(coro: Awaitable[T], what: str, timeout: float = STEP_TIMEOUT) -> T:
    """Await one operation under a timeout, so a hang fails instead of blocking."""
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        C.ok(False, f"{what} did not finish within {timeout:.0f} s")
        raise  # unreachable


def ids(items: Sequence[Any], attr: str = "rollout_id") -> List[str]:
    return [getattr(i, attr) for i in items]


def page_ok(page: PaginatedResult[Any], *, total: int, limit: int, offset: int, n: int, what: str) -> None:
    """A page echoes limit/offset, counts all matches in total and holds n items."""
    C.ok(isinstance(page, PaginatedResult), f"{what}: a PaginatedResult", type(page))
    C.eq((page.total, page.limit, page.offset, len(page.items)), (total, limit, offset, n), f"{what}: (total, limit, offset, len)")


class CountingClient(LightningStoreClient):
    """The real client, counting the JSON span writes so OTLP delivery can be told apart."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.json_spans: List[str] = []  # rollout ids of spans sent as JSON (POST /spans)
        self.otel_span_calls = 0

    async def add_span(self, span: Span) -> Optional[Span]:
        self.json_spans.append(span.rollout_id)
        return await super().add_span(span)

    async def add_otel_span(self, *args: Any, **kwargs: Any) -> Optional[Span]:
        self.otel_span_calls += 1
        return await super().add_otel_span(*args, **kwargs)


class Ctx:
    """Shared state of one run."""

    def __init__(self, url: str, server: str, slow: bool) -> None:
        self.url = url.rstrip("/")
        self.api = self.url + "/v1/agl"
        self.ours = server == "agl"
        self.slow = slow
        self.client = CountingClient(self.url)
        # No retries: negative cases fail fast (a 500 would otherwise cost ~8 s of retries).
        self.strict = LightningStoreClient(self.url, retry_delays=(), health_retry_delays=())
        self.http: Optional[aiohttp.ClientSession] = None
        self.r: Dict[str, Rollout] = {}
        self.a: Dict[str, Attempt] = {}
        self.res: Dict[str, ResourcesUpdate] = {}
        self.span_ids: Dict[str, str] = {}
        self.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"

    async def raw(self, method: str, path: str, payload: Any = None) -> tuple[int, Any]:
        """One raw HTTP call (no retries): (status, parsed JSON body or text)."""
        assert self.http is not None
        async with self.http.request(method, self.api + path, json=payload) as resp:
            text = await resp.text()
            try:
                body = json.loads(text) if text else None
            except ValueError:
                body = text
            return resp.status, body


def make_span(
    ctx: Ctx,
    rollout_id: str,
    attempt_id: str,
    sequence_id: int,
    span_id: str,
    name: str,
    parent_id: Optional[str],
    attributes: Dict[str, Any],
    **extra: Any,
) -> Span:
    sc = {"trace_id": ctx.trace_id, "span_id": span_id, "is_remote": False, "trace_state": {}}
    body: Dict[str, Any] = {
        "rollout_id": rollout_id,
        "attempt_id": attempt_id,
        "sequence_id": sequence_id,
        "trace_id": ctx.trace_id,
        "span_id": span_id,
        "parent_id": parent_id,
        "name": name,
        "status": {"status_code": "OK", "description": None},
        "attributes": attributes,
        "events": [{"name": "evt", "attributes": {"k": 1}, "timestamp": 1735000000.5}],
        "links": [],
        "start_time": 1735000000.0 + sequence_id,
        "end_time": 1735000000.25 + sequence_id,
        "context": sc,
        "parent": None,
        "resource": {"attributes": {"service.name": "interop"}, "schema_url": ""},
    }
    body.update(extra)
    return Span.model_validate(body)


def expect_http_error(exc: BaseException, status: int, what: str) -> None:
    C.ok(isinstance(exc, aiohttp.ClientResponseError), f"{what}: raises ClientResponseError", repr(exc))
    C.eq(getattr(exc, "status", None), status, f"{what}: HTTP status")


async def raises(coro: Awaitable[Any], what: str) -> BaseException:
    try:
        got = await step(coro, what)
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the exception is the result under test
        return exc
    C.ok(False, f"{what}: expected an error", got)
    raise AssertionError  # unreachable


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


async def s_health(ctx: Ctx) -> None:
    status, body = await ctx.raw("GET", "/health")
    C.eq((status, body), (200, {"status": "ok"}), "GET /health")
    stats = await step(ctx.client.statistics(), "statistics")
    C.ok(isinstance(stats, dict), "statistics is an object", stats)
    for key in ("total_rollouts", "total_attempts", "total_spans", "total_resources", "total_workers"):
        C.eq(stats.get(key), 0, f"fresh store: statistics[{key}]")
    C.ok(isinstance(stats.get("uptime"), (int, float)), "statistics.uptime is a number", stats.get("uptime"))
    C.ok("name" in stats, "statistics has a name", stats)


async def s_resources(ctx: Ctx) -> None:
    cl = ctx.client
    C.eq(await step(cl.get_latest_resources(), "get_latest_resources (empty)"), None, "no resources yet → None")
    C.eq((await step(cl.query_resources(), "query_resources (empty)")).total, 0, "no resources yet → total 0")

    first: NamedResources = {
        "main_llm": LLM(endpoint="http://llm.invalid/v1", model="m-1", sampling_parameters={"temperature": 0.7}),
        "proxy": ProxyLLM(endpoint="http://proxy.invalid/v1", model="m-2", api_key="k"),
        "prompt": PromptTemplate(template="Q: {q}", engine="f-string"),
    }
    t0 = time.time()
    ru = await step(cl.add_resources(first), "add_resources")
    C.ok(isinstance(ru, ResourcesUpdate), "add_resources → ResourcesUpdate", type(ru))
    C.ok(bool(RESOURCES_ID.match(ru.resources_id)), "server-chosen id is rs-<12 hex>", ru.resources_id)
    C.eq(ru.version, 1, "add_resources: version")
    C.eq(ru.create_time, ru.update_time, "add_resources: create_time == update_time")
    C.ok(abs(ru.create_time - t0) < 60, "create_time is epoch seconds", ru.create_time)
    C.ok(isinstance(ru.resources["main_llm"], LLM) and not isinstance(ru.resources["main_llm"], ProxyLLM), "llm round trip", ru.resources["main_llm"])
    C.ok(isinstance(ru.resources["proxy"], ProxyLLM), "proxy_llm round trip", ru.resources["proxy"])
    C.ok(isinstance(ru.resources["prompt"], PromptTemplate), "prompt_template round trip", ru.resources["prompt"])
    C.eq(ru.resources["main_llm"].sampling_parameters, {"temperature": 0.7}, "sampling_parameters kept")
    C.eq(ru.resources["proxy"].api_key, "k", "api_key kept")
    ctx.res["first"] = ru

    second: NamedResources = {"main_llm": LLM(endpoint="http://llm.invalid/v1", model="m-3")}
    up1 = await step(cl.update_resources("v-interop", second), "update_resources (create)")
    C.eq((up1.resources_id, up1.version), ("v-interop", 1), "update_resources upserts a new id with version 1")
    await asyncio.sleep(0.01)
    second["prompt"] = PromptTemplate(template="A: {a}", engine="jinja")
    up2 = await step(cl.update_resources("v-interop", second), "update_resources (replace)")
    C.eq(up2.version, 2, "update_resources bumps the version")
    C.eq(up2.create_time, up1.create_time, "update keeps create_time")
    C.ok(up2.update_time > up1.update_time, "update moves update_time", (up1.update_time, up2.update_time))
    C.eq(sorted(up2.resources), ["main_llm", "prompt"], "update replaces the resources map")
    ctx.res["second"] = up2

    got = await step(cl.get_resources_by_id(ru.resources_id), "get_resources_by_id")
    C.ok(got is not None and got.resources_id == ru.resources_id and got.version == 1, "get_resources_by_id", got)
    C.eq(await step(ctx.strict.get_resources_by_id("rs-000000000000"), "get_resources_by_id (missing)"), None, "missing resources → None")
    latest = await step(cl.get_latest_resources(), "get_latest_resources")
    C.ok(latest is not None and latest.resources_id == "v-interop" and latest.version == 2, "latest = last written", latest)

    allr = await step(cl.query_resources(), "query_resources")
    page_ok(allr, total=2, limit=-1, offset=0, n=2, what="query_resources()")
    C.eq(ids(allr.items, "resources_id"), [ru.resources_id, "v-interop"], "query_resources: insertion order")
    byid = await step(cl.query_resources(resources_id="v-interop"), "query_resources(resources_id)")
    C.eq(ids(byid.items, "resources_id"), ["v-interop"], "resources_id filter")
    cont = await step(cl.query_resources(resources_id_contains="interop"), "query_resources(contains)")
    C.eq(ids(cont.items, "resources_id"), ["v-interop"], "resources_id_contains filter")
    srt = await step(cl.query_resources(sort_by="version", sort_order="desc"), "query_resources(sort)")
    C.eq(ids(srt.items, "resources_id"), ["v-interop", ru.resources_id], "sort_by version desc")
    pg = await step(cl.query_resources(limit=1, offset=1), "query_resources(page)")
    page_ok(pg, total=2, limit=1, offset=1, n=1, what="query_resources(limit=1, offset=1)")
    C.eq(pg.items[0].resources_id, "v-interop", "second page item")


async def s_enqueue_dequeue(ctx: Ctx) -> None:
    cl = ctx.client
    t0 = time.time()
    r1 = await step(cl.enqueue_rollout(input={"q": "one"}, mode="train", metadata={"k": "v"}), "enqueue_rollout")
    C.ok(type(r1) is Rollout, "enqueue_rollout → Rollout (no attempt)", type(r1))
    C.ok(bool(ROLLOUT_ID.match(r1.rollout_id)), "rollout id is ro-<12 hex>", r1.rollout_id)
    C.eq((r1.status, r1.mode, r1.input, r1.metadata, r1.end_time), ("queuing", "train", {"q": "one"}, {"k": "v"}, None), "enqueued rollout fields")
    C.eq(r1.resources_id, "v-interop", "resources_id null resolves to the latest resources")
    C.eq(r1.config, RolloutConfig(), "default config")
    C.ok(abs(r1.start_time - t0) < 60, "start_time set at enqueue", r1.start_time)

    many = await step(
        cl.enqueue_many_rollouts(
            [
                EnqueueRolloutRequest(
                    input="two", mode="val", config=RolloutConfig(max_attempts=3, retry_condition=["failed"])
                ),
                EnqueueRolloutRequest(input=3, resources_id=ctx.res["first"].resources_id),
            ]
        ),
        "enqueue_many_rollouts",
    )
    C.eq(len(many), 2, "enqueue_many_rollouts returns one rollout per request")
    r2, r3 = many
    C.eq((r2.input, r2.mode, r2.config.max_attempts, r2.config.retry_condition), ("two", "val", 3, ["failed"]), "r2 in request order")
    C.eq((r3.input, r3.mode, r3.resources_id, r3.metadata), (3, None, ctx.res["first"].resources_id, {}), "r3: explicit resources_id, metadata null → {}")
    C.ok(all(type(r) is Rollout and r.status == "queuing" for r in many), "all queuing, no attempt", many)
    C.eq(await step(cl.enqueue_many_rollouts([]), "enqueue_many_rollouts([])"), [], "empty batch → []")

    d1 = await step(cl.dequeue_rollout(worker_id="w-a"), "dequeue_rollout")
    C.ok(isinstance(d1, AttemptedRollout), "dequeue_rollout → AttemptedRollout", d1)
    assert d1 is not None
    C.eq(d1.rollout_id, r1.rollout_id, "FIFO: first enqueued first")
    C.eq((d1.status, d1.attempt.status, d1.attempt.sequence_id, d1.attempt.worker_id), ("preparing", "preparing", 1, "w-a"), "dequeued rollout/attempt")
    C.ok(bool(ATTEMPT_ID.match(d1.attempt.attempt_id)), "attempt id is at-<8 hex>", d1.attempt.attempt_id)
    C.eq(d1.start_time, r1.start_time, "start_time is the enqueue time, unchanged by dequeue")

    dm = await step(cl.dequeue_many_rollouts(limit=5, worker_id="w-b"), "dequeue_many_rollouts")
    C.eq(ids(dm), [r2.rollout_id, r3.rollout_id], "dequeue_many: FIFO, only what is queued")
    C.ok(all(isinstance(x, AttemptedRollout) and x.attempt.sequence_id == 1 for x in dm), "dequeue_many attempts", dm)
    C.eq(await step(cl.dequeue_rollout(worker_id="w-a"), "dequeue_rollout (empty)"), None, "empty queue → None")
    C.eq(await step(cl.dequeue_many_rollouts(limit=3), "dequeue_many_rollouts (empty)"), [], "empty queue → []")

    r4 = await step(cl.start_rollout(input="direct", mode="test", worker_id="w-c", metadata={"m": 1}), "start_rollout")
    C.ok(isinstance(r4, AttemptedRollout), "start_rollout → AttemptedRollout", r4)
    C.eq((r4.status, r4.attempt.status, r4.attempt.sequence_id, r4.attempt.worker_id, r4.metadata), ("preparing", "preparing", 1, "w-c", {"m": 1}), "start_rollout fields")
    C.eq(await step(cl.dequeue_rollout(), "dequeue after start_rollout"), None, "start_rollout bypasses the queue")

    r5 = await step(cl.enqueue_rollout(input=None, config=RolloutConfig(timeout_seconds=600.0)), "enqueue_rollout (null input)")
    C.eq((r5.input, r5.config.timeout_seconds), (None, 600.0), "null input and config kept")

    ctx.r.update(r1=d1, r2=dm[0], r3=dm[1], r4=r4, r5=r5)
    ctx.a.update(a1=d1.attempt, a2=dm[0].attempt, a3=dm[1].attempt, a4=r4.attempt)


async def s_query_rollouts(ctx: Ctx) -> None:
    cl, r = ctx.client, ctx.r
    order = [r[k].rollout_id for k in ("r1", "r2", "r3", "r4", "r5")]
    allr = await step(cl.query_rollouts(), "query_rollouts")
    page_ok(allr, total=5, limit=-1, offset=0, n=5, what="query_rollouts()")
    C.eq(ids(allr.items), order, "insertion order by default")
    kinds = [type(x).__name__ for x in allr.items]
    # Q23: an item is an AttemptedRollout iff the `attempt` key is present; r5 has no attempt.
    C.eq(kinds, ["AttemptedRollout"] * 4 + ["Rollout"], "attempt key present only when an attempt exists")
    C.eq(allr.items[0].attempt.attempt_id, ctx.a["a1"].attempt_id, "items carry their latest attempt")

    q = await step(cl.query_rollouts(status_in=["queuing"]), "query_rollouts(status_in)")
    C.eq(ids(q.items), [r["r5"].rollout_id], "status_in filter")
    q = await step(cl.query_rollouts(rollout_id_in=[order[4], order[0]]), "query_rollouts(rollout_id_in)")
    C.eq(ids(q.items), [order[0], order[4]], "rollout_id_in filter keeps store order")
    q = await step(cl.query_rollouts(rollout_id_contains=order[2][3:11]), "query_rollouts(contains)")
    C.eq(ids(q.items), [order[2]], "rollout_id_contains filter")
    q = await step(cl.query_rollouts(status_in=["queuing"], rollout_id_in=[order[0]], filter_logic="or"), "query_rollouts(or)")
    C.eq(ids(q.items), [order[0], order[4]], "filter_logic or")
    q = await step(cl.query_rollouts(status_in=["queuing"], rollout_id_in=[order[0]]), "query_rollouts(and)")
    C.eq(q.total, 0, "filter_logic and")
    q = await step(cl.query_rollouts(status_in=[]), "query_rollouts(status_in=[])")
    C.eq(q.total, 0, "status_in [] matches nothing")
    q = await step(cl.query_rollouts(sort_by="start_time", sort_order="desc"), "query_rollouts(sort desc)")
    # agl stamps one enqueue batch with one start_time (r2, r3); Python stamps each rollout. Ties
    # keep insertion order in both directions (a stable sort).
    C.eq(ids(q.items), ids(sorted(allr.items, key=lambda x: x.start_time, reverse=True)), "sort_by start_time desc")
    C.eq(ids(q.items)[0], order[4], "the newest rollout first")
    # Q13: a null mode sorts as "" (first when ascending); ties keep insertion order.
    q = await step(cl.query_rollouts(sort_by="mode"), "query_rollouts(sort mode)")
    C.eq(ids(q.items), [order[2], order[4], order[3], order[0], order[1]], "sort_by mode asc, null first")
    q = await step(cl.query_rollouts(limit=2, offset=1), "query_rollouts(page)")
    page_ok(q, total=5, limit=2, offset=1, n=2, what="query_rollouts(limit=2, offset=1)")
    C.eq(ids(q.items), order[1:3], "page window")
    q = await step(cl.query_rollouts(limit=2, offset=10), "query_rollouts(page past end)")
    page_ok(q, total=5, limit=2, offset=10, n=0, what="query_rollouts(offset past the end)")

    exc = await raises(ctx.strict.query_rollouts(limit=0), "query_rollouts(limit=0)")
    expect_http_error(exc, 400, "limit 0")
    exc = await raises(ctx.strict.query_rollouts(sort_by="no_such_field"), "query_rollouts(sort_by bad)")
    expect_http_error(exc, 400, "unknown sort_by")

    g1 = await step(cl.get_rollout_by_id(order[0]), "get_rollout_by_id")
    C.ok(isinstance(g1, AttemptedRollout) and g1.attempt.attempt_id == ctx.a["a1"].attempt_id, "get_rollout_by_id → AttemptedRollout", g1)
    g5 = await step(cl.get_rollout_by_id(order[4]), "get_rollout_by_id (no attempt)")
    C.ok(type(g5) is Rollout and g5.rollout_id == order[4], "get_rollout_by_id → Rollout", g5)
    if ctx.ours:
        # DEVIATION Q1: agl answers 200 null for a missing rollout. (agentlightning's server answers
        # 500 ResponseValidationError; the client retries ~8 s and then also returns None.)
        C.eq(await step(cl.get_rollout_by_id("ro-000000000000"), "get_rollout_by_id (missing)"), None, "missing rollout → None")
        C.eq(await ctx.raw("GET", "/rollouts/ro-000000000000"), (200, None), "Q1: GET /rollouts/{missing} → 200 null")
    else:
        C.eq(await step(ctx.strict.get_rollout_by_id("ro-000000000000"), "get_rollout_by_id (missing)"), None, "missing rollout → None")
        status, _ = await ctx.raw("GET", "/rollouts/ro-000000000000")
        C.eq(status, 500, "Python server: GET /rollouts/{missing} → 500")


async def s_attempts(ctx: Ctx) -> None:
    cl, r = ctx.client, ctx.r
    rid2 = r["r2"].rollout_id
    ar = await step(cl.start_attempt(rid2, worker_id="w-b"), "start_attempt")
    C.ok(isinstance(ar, AttemptedRollout), "start_attempt → AttemptedRollout", ar)
    C.eq((ar.rollout_id, ar.status, ar.attempt.sequence_id, ar.attempt.status, ar.attempt.worker_id), (rid2, "preparing", 2, "preparing", "w-b"), "start_attempt: attempt #2")
    ctx.a["a2b"] = ar.attempt
    ar3 = await step(cl.start_attempt(r["r3"].rollout_id), "start_attempt (no worker)")
    C.eq((ar3.attempt.sequence_id, ar3.attempt.worker_id), (2, None), "start_attempt without worker_id")
    ctx.a["a3b"] = ar3.attempt

    qa = await step(cl.query_attempts(rid2), "query_attempts")
    page_ok(qa, total=2, limit=-1, offset=0, n=2, what="query_attempts")
    C.eq([a.sequence_id for a in qa.items], [1, 2], "attempts by sequence_id")
    C.ok(all(isinstance(a, Attempt) for a in qa.items), "items are Attempts", qa.items)
    qa = await step(cl.query_attempts(rid2, sort_order="desc"), "query_attempts(desc)")
    C.eq([a.sequence_id for a in qa.items], [2, 1], "sort desc")
    qa = await step(cl.query_attempts(rid2, limit=1, offset=1), "query_attempts(page)")
    page_ok(qa, total=2, limit=1, offset=1, n=1, what="query_attempts(limit=1, offset=1)")
    C.eq(qa.items[0].attempt_id, ar.attempt.attempt_id, "page item")
    qa = await step(cl.query_attempts("ro-000000000000"), "query_attempts(missing)")
    C.eq(qa.total, 0, "unknown rollout → empty page")

    la = await step(cl.get_latest_attempt(rid2), "get_latest_attempt")
    C.ok(la is not None and la.attempt_id == ar.attempt.attempt_id, "latest attempt = highest sequence_id", la)
    C.eq(await step(cl.get_latest_attempt(r["r5"].rollout_id), "get_latest_attempt (none)"), None, "rollout without attempts → None")
    C.eq(await step(ctx.strict.get_latest_attempt("ro-000000000000"), "get_latest_attempt (missing)"), None, "missing rollout → None")


async def s_spans(ctx: Ctx) -> None:
    cl = ctx.client
    rid, aid = ctx.r["r1"].rollout_id, ctx.a["a1"].attempt_id
    s1 = await step(cl.get_next_span_sequence_id(rid, aid), "get_next_span_sequence_id")
    s2 = await step(cl.get_next_span_sequence_id(rid, aid), "get_next_span_sequence_id (2)")
    C.eq((s1, s2), (1, 2), "sequence ids per rollout start at 1")
    C.eq(await step(cl.get_many_span_sequence_ids([(rid, aid), (rid, aid)]), "get_many_span_sequence_ids"), [3, 4], "get_many_span_sequence_ids")

    root_id, c1_id, c2_id = "00f067aa0ba902b7", "00f067aa0ba902b8", "00f067aa0ba902b9"
    root = make_span(
        ctx, rid, aid, s1, root_id, "interop.root", None,
        {"str": "x", "int": 7, "float": 1.5, "bool": True, "list": [1, 2, 3], "strs": ["a", "b"]},
        interop_extra={"nested": [1, "two"]},
    )
    t0 = time.time()
    got = await step(cl.add_span(root), "add_span")
    C.ok(isinstance(got, Span), "add_span → Span", got)
    assert got is not None
    C.eq(got.model_dump(mode="json"), root.model_dump(mode="json"), "add_span echoes the span (extras included, Q18)")
    C.eq((got.model_extra or {}).get("interop_extra"), {"nested": [1, "two"]}, "unknown top-level key echoed")
    C.eq(await step(cl.add_span(root), "add_span (duplicate)"), None, "duplicate span → None (201 null, Q11)")

    ro = await step(cl.get_rollout_by_id(rid), "get_rollout_by_id after span")
    C.ok(ro is not None and ro.status == "running", "first span promotes preparing → running", ro)
    att = await step(cl.get_latest_attempt(rid), "get_latest_attempt after span")
    C.ok(att is not None and att.status == "running", "span moves the attempt to running", att)
    assert att is not None
    C.ok(att.last_heartbeat_time is not None and att.last_heartbeat_time >= t0 - 60, "span records an attempt heartbeat", att.last_heartbeat_time)

    c1 = make_span(ctx, rid, aid, 9, c1_id, "interop.child", root_id, {"i": 1})
    c2 = make_span(ctx, rid, aid, 9, c2_id, "interop.child", root_id, {"i": 2})
    added = await step(cl.add_many_spans([c1, c2]), "add_many_spans")
    C.eq([s.span_id for s in added], [c1_id, c2_id], "add_many_spans returns the stored spans")
    # A client-supplied id raises the counter: next = max(4, 9) + 1.
    C.eq(await step(cl.get_next_span_sequence_id(rid, aid), "get_next_span_sequence_id (after 9)"), 10, "counter raised by supplied ids")

    # add_otel_span: a real OpenTelemetry SDK span, converted by the client and sent as JSON.
    sdk_tracer = TracerProvider().get_tracer("interop")
    otel_span = sdk_tracer.start_span("interop.otel", attributes={"via": "add_otel_span"})
    otel_span.end()
    stored = await step(cl.add_otel_span(rid, aid, otel_span), "add_otel_span")  # type: ignore[arg-type]
    C.ok(isinstance(stored, Span) and stored.sequence_id == 11 and stored.name == "interop.otel", "add_otel_span stores with the next id", stored)
    ctx.span_ids.update(root=root_id, c1=c1_id, c2=c2_id, otel=stored.span_id if stored else "")

    allsp = await step(cl.query_spans(rid), "query_spans")
    page_ok(allsp, total=4, limit=-1, offset=0, n=4, what="query_spans(rid)")
    C.eq([s.sequence_id for s in allsp.items], [1, 9, 9, 11], "sorted by sequence_id")
    if ctx.ours:
        # Q12: agl breaks sequence_id ties by insertion order. (Python's in-memory store walks a
        # nested dict as a stack, so its order of equal ids is unspecified.)
        C.eq([s.span_id for s in allsp.items][1:3], [c1_id, c2_id], "ties in insertion order (Q12)")
    latest = await step(cl.query_spans(rid, "latest"), "query_spans(latest)")
    C.eq(sorted(s.span_id for s in latest.items), sorted(s.span_id for s in allsp.items), "attempt_id latest")
    byatt = await step(cl.query_spans(rid, aid), "query_spans(attempt)")
    C.eq(byatt.total, 4, "attempt_id filter")
    q = await step(cl.query_spans(rid, name="interop.child"), "query_spans(name)")
    C.eq(sorted(s.span_id for s in q.items), [c1_id, c2_id], "name filter")
    q = await step(cl.query_spans(rid, name_contains="otel"), "query_spans(name_contains)")
    C.eq([s.name for s in q.items], ["interop.otel"], "name_contains filter")
    q = await step(cl.query_spans(rid, span_id=root_id), "query_spans(span_id)")
    C.eq([s.span_id for s in q.items], [root_id], "span_id filter")
    q = await step(cl.query_spans(rid, parent_id=root_id), "query_spans(parent_id)")
    C.eq(q.total, 2, "parent_id filter")
    q = await step(cl.query_spans(rid, trace_id=ctx.trace_id, span_id_contains="b8"), "query_spans(and)")
    C.eq([s.span_id for s in q.items], [c1_id], "trace_id and span_id_contains")
    q = await step(cl.query_spans(rid, name="interop.root", parent_id=root_id, filter_logic="or"), "query_spans(or)")
    C.eq(q.total, 3, "filter_logic or")
    q = await step(cl.query_spans(rid, trace_id_contains="4bf92f", parent_id_contains="902b7"), "query_spans(contains)")
    C.eq(q.total, 2, "trace_id_contains and parent_id_contains")
    q = await step(cl.query_spans(rid, filter_logic="or"), "query_spans(or, no condition)")
    if ctx.ours:
        # DEVIATION Q15: with no optional condition, everything matches whatever filter_logic says.
        # (agentlightning's server returns no spans for filter_logic "or" without a condition.)
        C.eq(q.total, 4, "Q15: or without conditions matches everything")
    else:
        C.eq(q.total, 0, "Python server: or without conditions matches nothing")
    q = await step(cl.query_spans(rid, limit=2, offset=1), "query_spans(page)")
    page_ok(q, total=4, limit=2, offset=1, n=2, what="query_spans(limit=2, offset=1)")
    C.eq([s.sequence_id for s in q.items], [9, 9], "span page window")
    q = await step(cl.query_spans(rid, sort_by="name", sort_order="desc"), "query_spans(sort name desc)")
    C.eq([s.name for s in q.items], ["interop.root", "interop.otel", "interop.child", "interop.child"], "sort_by name desc")
    q = await step(cl.query_spans(rid, sort_by="start_time", sort_order="desc"), "query_spans(sort start_time)")
    C.eq(q.items[0].name, "interop.otel", "sort_by start_time desc (the SDK span is the newest)")
    q = await step(cl.query_spans(ctx.r["r2"].rollout_id, "latest"), "query_spans(no spans)")
    C.eq(q.total, 0, "a rollout without spans → empty page")
    q = await step(cl.query_spans(ctx.r["r5"].rollout_id, "latest"), "query_spans(no attempt)")
    C.eq(q.total, 0, "latest with no attempts → empty page")

    # Q10: sequence ids are issued for unknown rollouts too, without creating anything.
    C.eq(await step(cl.get_next_span_sequence_id("ro-unknown00000", "at-unknown0"), "next id for unknown"), 1, "unknown rollout gets 1")

    orphan = make_span(ctx, "ro-000000000000", "at-00000000", 1, "00000000000000aa", "orphan", None, {})
    exc = await raises(ctx.strict.add_span(orphan), "add_span (missing rollout)")
    if ctx.ours:
        # DEVIATION Q2: 404 for a missing rollout. (agentlightning: 500 ValueError, retried ~8 s.)
        expect_http_error(exc, 404, "Q2: add_span on a missing rollout")
    else:
        expect_http_error(exc, 500, "Python server: add_span on a missing rollout")

    bad = root.model_dump(mode="json")
    del bad["parent_id"]
    status, _ = await ctx.raw("POST", "/spans", bad)
    C.eq(status, 422, "a span without parent_id → 422 (Q18)")


async def s_updates(ctx: Ctx) -> None:
    cl, strict, r, a = ctx.client, ctx.strict, ctx.r, ctx.a
    rid1, aid1 = r["r1"].rollout_id, a["a1"].attempt_id
    t0 = time.time()
    up = await step(cl.update_attempt(rid1, aid1, status="succeeded"), "update_attempt(succeeded)")
    C.ok(isinstance(up, Attempt), "update_attempt → Attempt", up)
    C.eq((up.attempt_id, up.status), (aid1, "succeeded"), "attempt succeeded")
    C.ok(up.end_time is not None and up.end_time >= t0 - 60, "succeeded sets end_time", up.end_time)
    ro = await step(cl.get_rollout_by_id(rid1), "rollout after success")
    C.ok(ro is not None and ro.status == "succeeded" and ro.end_time is not None, "success propagates to the rollout", ro)
    w = await step(cl.get_worker_by_id("w-a"), "get_worker_by_id(w-a)")
    C.ok(isinstance(w, Worker), "get_worker_by_id → Worker", w)
    assert w is not None
    C.eq((w.status, w.current_rollout_id, w.current_attempt_id), ("idle", None, None), "worker idle after success")
    C.ok(w.last_idle_time is not None and w.last_dequeue_time is not None, "idle and dequeue times set", w)

    # update_rollout: present fields only, null clears.
    rid5 = r["r5"].rollout_id
    new_cfg = RolloutConfig(timeout_seconds=30.0, unresponsive_seconds=10.0, max_attempts=2, retry_condition=["timeout"])
    ur = await step(
        cl.update_rollout(rid5, input={"new": 1}, mode="val", config=new_cfg, metadata=None),
        "update_rollout(fields)",
    )
    C.ok(type(ur) is Rollout, "update_rollout → Rollout", type(ur))
    C.eq((ur.input, ur.mode, ur.config, ur.metadata, ur.status), ({"new": 1}, "val", new_cfg, None, "queuing"), "updated fields, metadata null clears")
    ur = await step(cl.update_rollout(rid5, resources_id=None), "update_rollout(resources_id=None)")
    C.eq((ur.resources_id, ur.mode), (None, "val"), "resources_id cleared, absent fields kept")
    status, body = await ctx.raw("POST", f"/rollouts/{rid5}", {})
    C.ok(status == 200 and isinstance(body, dict) and "attempt" not in body, "POST /rollouts/{id} answers a Rollout without attempt key", body)
    exc = await raises(strict.update_rollout(rid5, status=None), "update_rollout(status=None)")  # type: ignore[arg-type]
    expect_http_error(exc, 400, "update_rollout status null")

    exc = await raises(strict.update_attempt(rid5, "latest", status="running"), "update_attempt(no attempts)")
    # DEVIATION Q2 (agentlightning: 500 ValueError).
    expect_http_error(exc, 404 if ctx.ours else 500, "update_attempt latest on a rollout without attempts")
    if ctx.ours:
        # agl checks explicit transitions (409 invalid_transition); agentlightning accepts anything.
        exc = await raises(strict.update_rollout(rid5, status="running"), "update_rollout(queuing → running)")
        expect_http_error(exc, 409, "running needs an attempt")
    # Cancel it so its queue entry goes stale (the queue must be empty for what follows).
    ur = await step(cl.update_rollout(rid5, status="cancelled"), "update_rollout(r5 cancelled)")
    C.ok(ur.status == "cancelled" and ur.end_time is not None, "cancel sets end_time", ur)

    # update_attempt with attempt_id "latest" and retries: r2 has max_attempts 3, retry on failed.
    rid2 = r["r2"].rollout_id
    up = await step(cl.update_attempt(rid2, "latest", status="failed"), "update_attempt(latest, failed)")
    C.eq((up.attempt_id, up.sequence_id, up.status), (a["a2b"].attempt_id, 2, "failed"), "latest attempt failed")
    C.ok(up.end_time is not None, "failed sets end_time", up)
    ro = await step(cl.get_rollout_by_id(rid2), "rollout after a retryable failure")
    C.ok(ro is not None and ro.status == "requeuing", "failed with retries left → requeuing", ro)
    again = await step(cl.dequeue_rollout(worker_id="w-b"), "dequeue (requeued)")
    C.ok(again is not None and again.rollout_id == rid2 and again.attempt.sequence_id == 3, "requeued rollout dequeued with attempt #3", again)
    assert again is not None
    a["a2c"] = again.attempt
    up = await step(cl.update_attempt(rid2, again.attempt.attempt_id, status="failed"), "update_attempt(failed, last)")
    ro = await step(cl.get_rollout_by_id(rid2), "rollout after the last failure")
    C.ok(ro is not None and ro.status == "failed" and ro.end_time is not None, "no attempts left → failed", ro)
    wb = await step(cl.get_worker_by_id("w-b"), "get_worker_by_id(w-b)")
    C.ok(wb is not None and wb.status == "idle", "worker idle after failure", wb)

    # Metadata and worker_id updates; an older attempt never propagates.
    rid3 = r["r3"].rollout_id
    up = await step(cl.update_attempt(rid3, a["a3"].attempt_id, metadata={"note": "old"}, worker_id="w-d"), "update_attempt(old, metadata)")
    C.eq((up.metadata, up.worker_id, up.status), ({"note": "old"}, "w-d", "preparing"), "metadata and worker_id written")
    wd = await step(cl.get_worker_by_id("w-d"), "get_worker_by_id(w-d)")
    C.ok(wd is not None and wd.status == "busy" and wd.current_attempt_id == a["a3"].attempt_id, "worker_id update syncs the worker", wd)
    hb = time.time() - 5
    up = await step(cl.update_attempt(rid3, "latest", status="running", last_heartbeat_time=hb), "update_attempt(latest, running)")
    C.eq((up.attempt_id, up.status, up.last_heartbeat_time), (a["a3b"].attempt_id, "running", hb), "latest → running with heartbeat")
    ro = await step(cl.get_rollout_by_id(rid3), "rollout after running")
    C.ok(ro is not None and ro.status == "running", "running propagates", ro)
    up = await step(cl.update_attempt(rid3, a["a3"].attempt_id, status="failed"), "update_attempt(old, failed)")
    ro = await step(cl.get_rollout_by_id(rid3), "rollout after an old attempt failed")
    C.ok(ro is not None and ro.status == "running", "an older attempt never propagates", ro)

    exc = await raises(strict.update_attempt(rid3, "latest", metadata=None), "update_attempt(metadata=None)")
    expect_http_error(exc, 400, "Q17: update_attempt metadata null")

    # DEVIATION Q8 (agl): timeout is final and sets end_time. (agentlightning leaves end_time null.)
    up = await step(cl.update_attempt(rid3, "latest", status="timeout"), "update_attempt(timeout)")
    C.eq(up.status, "timeout", "attempt timeout")
    if ctx.ours:
        C.ok(up.end_time is not None, "Q8: timeout sets end_time", up)
    else:
        C.eq(up.end_time, None, "Python server: timeout keeps end_time null")
    ro = await step(cl.get_rollout_by_id(rid3), "rollout after timeout")
    C.ok(ro is not None and ro.status == "failed", "timeout without retry → failed", ro)

    rid4 = r["r4"].rollout_id
    ur = await step(cl.update_rollout(rid4, status="cancelled"), "update_rollout(cancelled)")
    C.ok(ur.status == "cancelled" and ur.end_time is not None, "cancel sets end_time", ur)
    up = await step(cl.update_attempt(rid4, "latest", metadata={"late": True}), "update_attempt on a cancelled rollout")
    ro = await step(cl.get_rollout_by_id(rid4), "rollout after a metadata update")
    if ctx.ours:
        # DEVIATION Q6: a metadata-only update never touches the rollout; cancelled stays cancelled.
        # (agentlightning re-derives the status on every update: cancelled → preparing.)
        C.ok(ro is not None and ro.status == "cancelled", "Q6: cancelled is not revived", ro)
    else:
        C.ok(ro is not None and ro.status == "preparing", "Python server: cancelled → preparing", ro)

    # Q7: leaving a terminal status (re-enqueue) clears end_time in agl.
    ur = await step(cl.update_rollout(rid1, status="queuing"), "update_rollout(succeeded → queuing)")
    C.eq(ur.status, "queuing", "re-enqueued")
    if ctx.ours:
        # DEVIATION Q7. (agentlightning keeps the old end_time.)
        C.eq(ur.end_time, None, "Q7: end_time cleared when leaving a terminal status")
    else:
        C.ok(ur.end_time is not None, "Python server: end_time kept", ur)
    ur = await step(cl.update_rollout(rid1, status="cancelled"), "update_rollout(queuing → cancelled)")
    C.eq(ur.status, "cancelled", "cancelled while queued")
    C.eq(await step(cl.dequeue_rollout(worker_id="w-a"), "dequeue (stale entry)"), None, "a stale queue entry is skipped")

    # start_attempt revives a finished rollout (compat Q7) and clears end_time (deviation Q7).
    ar = await step(cl.start_attempt(rid2, worker_id="w-b"), "start_attempt on a failed rollout")
    C.eq((ar.status, ar.attempt.sequence_id), ("preparing", 4), "start_attempt revives, ignoring max_attempts")
    if ctx.ours:
        C.eq(ar.end_time, None, "Q7: revival clears end_time")
    await step(cl.update_attempt(rid2, "latest", status="succeeded"), "update_attempt(revived, succeeded)")

    if ctx.ours:
        # agl checks explicit transitions (409 invalid_transition); agentlightning accepts anything.
        exc = await raises(strict.update_attempt(rid1, aid1, status="running"), "update_attempt(succeeded → running)")
        expect_http_error(exc, 409, "succeeded attempt cannot run again")

    # DEVIATION Q2: 404 for missing entities (agentlightning: 500 ValueError, retried ~8 s).
    missing = 404 if ctx.ours else 500
    exc = await raises(strict.update_rollout("ro-000000000000", status="cancelled"), "update_rollout(missing)")
    expect_http_error(exc, missing, "update_rollout on a missing rollout")
    exc = await raises(strict.update_attempt(rid1, "at-00000000", status="failed"), "update_attempt(missing attempt)")
    expect_http_error(exc, missing, "update_attempt on a missing attempt")
    exc = await raises(strict.start_attempt("ro-000000000000"), "start_attempt(missing)")
    expect_http_error(exc, missing, "start_attempt on a missing rollout")
    if ctx.ours:
        status, body = await ctx.raw("POST", "/rollouts/ro-000000000000", {"status": "cancelled"})
        C.ok(status == 404 and isinstance(body, dict) and "not found" in str(body.get("detail", "")).lower(), "404 body has a detail", body)


async def s_wait(ctx: Ctx) -> None:
    cl, r = ctx.client, ctx.r
    r6 = await step(cl.enqueue_rollout(input="pending"), "enqueue_rollout(r6)")
    r["r6"] = r6
    want = [r["r5"].rollout_id, r["r2"].rollout_id, r["r1"].rollout_id, r["r3"].rollout_id]
    mixed = [r["r5"].rollout_id, r6.rollout_id, "ro-000000000000", r["r2"].rollout_id, r["r1"].rollout_id, r["r3"].rollout_id]
    done = await step(cl.wait_for_rollouts(rollout_ids=mixed, timeout=0), "wait_for_rollouts(timeout=0)")
    C.eq(ids(done), want, "terminal subset in request order, unknown ids omitted")
    C.eq([x.status for x in done], ["cancelled", "succeeded", "cancelled", "failed"], "terminal statuses")
    C.ok(all(type(x) is Rollout for x in done), "wait returns Rollouts", done)
    done = await step(cl.wait_for_rollouts(rollout_ids=want, timeout=None), "wait_for_rollouts(timeout=None, all done)")
    C.eq(ids(done), want, "timeout None returns at once when everything is terminal")
    done = await step(cl.wait_for_rollouts(rollout_ids=[r6.rollout_id], timeout=0.05), "wait_for_rollouts(0.05)")
    C.eq(done, [], "a queuing rollout is not returned")
    try:
        await cl.wait_for_rollouts(rollout_ids=want, timeout=1.0)
        C.ok(False, "client refuses timeout > 0.1")
    except ValueError:
        C.ok(True, "client refuses timeout > 0.1")
    status, body = await ctx.raw("POST", "/waits/rollouts", {"rollout_ids": want, "timeout": 0})
    C.ok(status == 200 and isinstance(body, list) and all("attempt" not in x for x in body), "wait items have no attempt key", body)
    if ctx.ours and ctx.slow:
        # DEVIATION Q16: timeout null is capped server-side (25 s by default) and answers the
        # terminal subset. (agentlightning blocks until every rollout is terminal.)
        t0 = time.monotonic()
        status, body = await asyncio.wait_for(
            ctx.raw("POST", "/waits/rollouts", {"rollout_ids": [r6.rollout_id], "timeout": None}), 40
        )
        C.ok(status == 200 and body == [] and time.monotonic() - t0 < 35, "Q16: wait with timeout null is capped", (status, body))
    # Cancel r6 so its queue entry goes stale and the runner finds an empty queue.
    ur = await step(cl.update_rollout(r6.rollout_id, status="cancelled"), "update_rollout(r6 cancelled)")
    C.eq(ur.status, "cancelled", "r6 cancelled")
    done = await step(cl.wait_for_rollouts(rollout_ids=[r6.rollout_id], timeout=0), "wait_for_rollouts(r6)")
    C.eq(ids(done), [r6.rollout_id], "a cancelled rollout is terminal")


async def s_workers(ctx: Ctx) -> None:
    cl = ctx.client
    t0 = time.time()
    w = await step(cl.update_worker("w-hb", {"cpu": 1.5, "host": "interop"}), "update_worker(stats)")
    C.ok(isinstance(w, Worker), "update_worker → Worker", w)
    C.eq((w.worker_id, w.status, w.heartbeat_stats), ("w-hb", "unknown", {"cpu": 1.5, "host": "interop"}), "new worker: unknown, stats stored")
    C.ok(w.last_heartbeat_time is not None and w.last_heartbeat_time >= t0 - 60, "heartbeat time set", w)
    await asyncio.sleep(0.01)
    w2 = await step(cl.update_worker("w-hb"), "update_worker(no body)")
    C.eq(w2.heartbeat_stats, {"cpu": 1.5, "host": "interop"}, "no body keeps the stats")
    C.ok(w2.last_heartbeat_time is not None and w.last_heartbeat_time is not None and w2.last_heartbeat_time > w.last_heartbeat_time, "heartbeat refreshed", w2)
    w3 = await step(cl.update_worker("w-a", {"x": 1}), "update_worker(existing)")
    C.eq((w3.status, w3.heartbeat_stats), ("idle", {"x": 1}), "a heartbeat never changes status")
    C.eq(await step(cl.get_worker_by_id("w-none"), "get_worker_by_id(missing)"), None, "missing worker → None")

    expected = {"w-a", "w-b", "w-c", "w-d", "w-hb"}
    allw = await step(cl.query_workers(), "query_workers")
    C.ok(isinstance(allw, PaginatedResult) and allw.limit == -1 and allw.offset == 0, "query_workers page (no limit sent → -1/0)", allw)
    C.eq(set(ids(allw.items, "worker_id")), expected, "every worker is listed")
    C.eq(allw.total, len(expected), "query_workers total")
    q = await step(cl.query_workers(status_in=["busy"]), "query_workers(status_in)")
    # w-c still holds r4's attempt (the rollout was cancelled, the attempt never finished); w-d was
    # released when the attempt it was bound to failed.
    C.eq(sorted(ids(q.items, "worker_id")), ["w-c"], "status_in busy")
    q = await step(cl.query_workers(status_in=["idle"]), "query_workers(idle)")
    C.eq(sorted(ids(q.items, "worker_id")), ["w-a", "w-b", "w-d"], "status_in idle")
    q = await step(cl.query_workers(worker_id_contains="hb"), "query_workers(contains)")
    C.eq(ids(q.items, "worker_id"), ["w-hb"], "worker_id_contains")
    q = await step(cl.query_workers(status_in=["unknown"], worker_id_contains="w-a", filter_logic="or"), "query_workers(or)")
    C.eq(sorted(ids(q.items, "worker_id")), ["w-a", "w-hb"], "filter_logic or")
    q = await step(cl.query_workers(sort_by="worker_id", sort_order="desc"), "query_workers(sort)")
    C.eq(ids(q.items, "worker_id"), sorted(expected, reverse=True), "sort_by worker_id desc")


async def s_statistics(ctx: Ctx) -> None:
    stats = await step(ctx.client.statistics(), "statistics")
    # r1..r6 rollouts; attempts: r1 1, r2 4, r3 2, r4 1; spans: 4; resources: 2; workers: 5.
    C.eq(
        {k: stats.get(k) for k in ("total_rollouts", "total_attempts", "total_spans", "total_resources", "total_workers")},
        {"total_rollouts": 6, "total_attempts": 8, "total_spans": 4, "total_resources": 2, "total_workers": 5},
        "statistics counts",
    )


async def s_otlp(ctx: Ctx) -> None:
    """The OpenTelemetry SDK's own OTLP/HTTP exporter (protobuf, gzip) straight at /v1/traces, in
    the LLM proxy's pattern: ids and one shared sequence id in the resource, several spans per
    request, a span-level sequence id overriding the resource's."""
    cl = ctx.client
    ar = await step(cl.start_rollout(input="otlp", worker_id="w-otlp"), "start_rollout(otlp)")
    rid, aid = ar.rollout_id, ar.attempt.attempt_id
    resource = Resource.create(
        {"agentlightning.rollout_id": rid, "agentlightning.attempt_id": aid, "agentlightning.span_sequence_id": "7", "service.name": "interop-otlp"}
    )
    tracer = TracerProvider(resource=resource).get_tracer("interop.otlp")
    base = time.time_ns()
    parent = tracer.start_span("proxy.request", start_time=base)
    child = tracer.start_span(
        "proxy.child",
        context=otel_trace.set_span_in_context(parent),
        attributes={"s": "x", "i": 3, "f": 2.5, "b": False, "ls": ["a", "b"], "li": [1, 2], "lf": [0.5, 1.5]},
        links=[otel_trace.Link(parent.get_span_context(), {"lk": 1})],
        start_time=base + 1_000_000,
    )
    child.add_event("evt", {"k": "v"}, timestamp=base + 2_000_000)
    child.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, "boom"))
    child.end(end_time=base + 3_000_000)
    parent.end(end_time=base + 4_000_000)
    override = tracer.start_span("proxy.override", attributes={"agentlightning.span_sequence_id": 12})
    override.end()
    exporter = OTLPSpanExporter(endpoint=ctx.url + "/v1/traces", compression=Compression.Gzip, timeout=20)
    try:
        result = await step(asyncio.to_thread(exporter.export, [parent, child, override]), "OTLP export (3 spans)")
        C.eq(result, SpanExportResult.SUCCESS, "OTLP export accepted")
        again = await step(asyncio.to_thread(exporter.export, [parent]), "OTLP export (duplicate)")
        C.eq(again, SpanExportResult.SUCCESS, "a duplicate span is accepted (and dropped, Q11)")
        lost = TracerProvider(resource=Resource.create({"service.name": "no-ids"})).get_tracer("x").start_span("no.ids")
        lost.end()
        skipped = await step(asyncio.to_thread(exporter.export, [lost]), "OTLP export (no ids)")
        C.eq(skipped, SpanExportResult.SUCCESS, "a span without rollout/attempt ids is skipped, not an error")
    finally:
        exporter.shutdown()

    page = await step(cl.query_spans(rid, "latest"), "query_spans(otlp)")
    by_name = {sp.name: sp for sp in page.items}
    C.eq(sorted(by_name), ["proxy.child", "proxy.override", "proxy.request"], "the three spans, once each")
    C.eq(page.total, 3, "duplicate dropped")
    C.eq([sp.sequence_id for sp in page.items], [7, 7, 12], "resource sequence id shared; span attribute overrides it")
    C.eq(await step(cl.get_next_span_sequence_id(rid, aid), "next id after OTLP"), 13, "supplied ids raise the counter")
    p, c = by_name["proxy.request"], by_name["proxy.child"]
    pctx, cctx = parent.get_span_context(), child.get_span_context()
    C.eq((p.trace_id, p.span_id, p.parent_id), (f"{pctx.trace_id:032x}", f"{pctx.span_id:016x}", None), "root ids as hex, no parent")
    C.eq((c.trace_id, c.span_id, c.parent_id), (f"{cctx.trace_id:032x}", f"{cctx.span_id:016x}", f"{pctx.span_id:016x}"), "child ids and parent_id")
    C.eq(c.attributes, {"s": "x", "i": 3, "f": 2.5, "b": False, "ls": ["a", "b"], "li": [1, 2], "lf": [0.5, 1.5]}, "attributes round trip")
    C.ok(type(c.attributes["i"]) is int and type(c.attributes["f"]) is float and all(type(v) is int for v in c.attributes["li"]), "int stays int, double stays float", c.attributes)
    C.eq((c.status.status_code, c.status.description), ("ERROR", "boom"), "status code and message")
    def near(x: Optional[float], want_ns: int) -> bool:
        return x is not None and abs(x - want_ns / 1e9) < 1e-6

    C.ok(near(c.start_time, base + 1_000_000) and near(c.end_time, base + 3_000_000), "times: unix nanoseconds / 1e9", (c.start_time, c.end_time, base))
    C.eq([(e.name, e.attributes) for e in c.events], [("evt", {"k": "v"})], "events")
    C.ok(near(c.events[0].timestamp, base + 2_000_000), "event timestamp in seconds", c.events[0].timestamp)
    C.eq(len(c.links), 1, "one link")
    C.eq((c.links[0].context.trace_id, c.links[0].context.span_id, c.links[0].attributes), (f"{pctx.trace_id:032x}", f"{pctx.span_id:016x}", {"lk": 1}), "link context and attributes")
    C.ok(c.context is not None and c.context.span_id == c.span_id and c.context.is_remote is False, "context", c.context)
    C.eq(c.parent, None, "parent is null on OTLP spans")
    C.eq(c.resource.attributes.get("agentlightning.span_sequence_id"), "7", "resource attributes kept")
    C.eq(c.resource.attributes.get("service.name"), "interop-otlp", "resource service.name")
    ro = await step(cl.get_rollout_by_id(rid), "rollout after OTLP")
    C.ok(ro is not None and ro.status == "running", "OTLP spans promote the rollout to running", ro)
    await step(cl.update_attempt(rid, aid, status="succeeded"), "update_attempt(otlp, succeeded)")


async def s_wire(ctx: Ctx) -> None:
    """Raw HTTP details the Python client does not look at but other clients (and v0.3.0's own
    REST tests) do: success codes, validation codes and messages, defaults of empty bodies."""
    st, body = await ctx.raw("POST", "/queues/rollouts/enqueue", {"rollouts": []})
    C.eq((st, body), (201, []), "enqueue [] → 201 []")
    st, _ = await ctx.raw("POST", "/queues/rollouts/enqueue", {})
    C.eq(st, 422, "enqueue without rollouts → 422")
    st, body = await ctx.raw("POST", "/queues/rollouts/dequeue")
    C.eq((st, body), (200, []), "dequeue without a body, empty queue → 200 []")
    st, body = await ctx.raw("POST", "/queues/rollouts/dequeue", {"limit": 0})
    C.eq((st, body), (200, []), "dequeue limit 0 → []")
    wire_resources = {
        "main_llm": {"resource_type": "llm", "endpoint": "http://llm.invalid/v1", "model": "m-4"},
        "p": {"resource_type": "prompt_template", "template": "t", "engine": "jinja"},
    }
    st, body = await ctx.raw("POST", "/resources/rs-wire", wire_resources)
    C.ok(st == 200 and isinstance(body, dict) and body.get("version") == 1, "POST /resources/{id} (upsert) → 200", (st, body))
    st, _ = await ctx.raw("POST", "/resources", {"p": {"resource_type": "nope", "template": "t"}})
    C.eq(st, 422, "unknown resource_type → 422")
    st, body = await ctx.raw("GET", "/resources/latest")
    C.ok(st == 200 and isinstance(body, dict) and body.get("resources_id") == "rs-wire", "GET /resources/latest", (st, body))
    st, body = await ctx.raw("POST", "/rollouts/search", {"limit": -2})
    C.eq(st, 400, "limit -2 → 400")
    C.ok("Limit must be greater than 0 or -1 for no limit" in str(body), "limit message", body)
    st, body = await ctx.raw("POST", "/rollouts/search", {"offset": -1})
    C.ok(st == 400 and "Offset must be greater than or equal to 0" in str(body), "offset -1 → 400 with message", (st, body))
    st, body = await ctx.raw("POST", "/rollouts/search", {"sort_by": "attempt"})
    C.ok(st == 400 and "Invalid sort_by: attempt, allowed fields are:" in str(body), "sort_by attempt → 400 with message", (st, body))
    st, _ = await ctx.raw("POST", "/rollouts/search", {"sort_order": "up"})
    C.eq(st, 422, "bad sort_order → 422")
    st, _ = await ctx.raw("POST", "/rollouts/search", {"status_in": ["nope"]})
    C.eq(st, 422, "bad status → 422")
    # Unknown keys in request bodies. DEVIATION (agl, documented in crates/agl-server/src/wire.rs):
    # 422 naming the key, so a misspelt filter is an error rather than "match everything".
    # (v0.3.0's Pydantic request models ignore unknown keys; the 0.3.0 client never sends any.)
    rid1, aid1 = ctx.r["r1"].rollout_id, ctx.a["a1"].attempt_id
    for path, payload in [
        ("/rollouts/search", {"bogus": 1, "limit": 1}),
        (f"/rollouts/{rid1}/attempts/search", {"bogus": 1, "limit": 1}),
        ("/spans/search", {"rollout_id": rid1, "bogus": 1, "limit": 1}),
        ("/workers/search", {"bogus": 1, "limit": 1}),
        ("/queues/rollouts/dequeue", {"limit": 0, "bogus": 1}),
        ("/spans/next", {"rollout_id": "ro-unknown00001", "attempt_id": "at-x", "bogus": 1}),
        ("/waits/rollouts", {"rollout_ids": [], "timeout": 0, "bogus": 1}),
        ("/queues/rollouts/enqueue", {"rollouts": [], "bogus": 1}),
        (f"/rollouts/{rid1}/attempts/{aid1}", {"bogus": 1}),
        ("/workers/w-a", {"bogus": 1}),
    ]:
        st, body = await ctx.raw("POST", path, payload)
        if ctx.ours:
            C.soft(st == 422 and "bogus" in str(body), f"POST {path}: unknown key → 422 naming it", (st, body))
        else:
            C.soft(200 <= st < 300, f"Python server: POST {path}: unknown keys ignored", (st, body))
    rid = ctx.r["r1"].rollout_id
    st, body = await ctx.raw("GET", f"/rollouts?rollout_id_in={rid}&status_in=cancelled&status_in=succeeded&limit=5")
    C.ok(st == 200 and isinstance(body, dict) and [x["rollout_id"] for x in body["items"]] == [rid] and body["limit"] == 5, "GET /rollouts with repeated query params", (st, body))
    st, body = await ctx.raw("GET", f"/rollouts/{rid}/attempts")
    C.ok(st == 200 and isinstance(body, dict) and body.get("total") == 1, "GET /rollouts/{id}/attempts", (st, body))
    st, body = await ctx.raw("GET", f"/spans?rollout_id={rid}&name_contains=child")
    C.ok(st == 200 and isinstance(body, dict) and body.get("total") == 2, "GET /spans with query params", (st, body))
    st, _ = await ctx.raw("GET", "/spans")
    C.eq(st, 422, "GET /spans without rollout_id → 422")
    st, _ = await ctx.raw("POST", "/spans/next", {"rollout_id": rid})
    C.eq(st, 422, "spans/next without attempt_id → 422")
    st, body = await ctx.raw("GET", "/workers?status_in=idle&worker_id_contains=w-a")
    C.ok(st == 200 and isinstance(body, dict) and [w["worker_id"] for w in body["items"]] == ["w-a"], "GET /workers", (st, body))
    st, body = await ctx.raw("POST", "/workers/w-wire", {"heartbeat_stats": None})
    C.eq(st, 400, "heartbeat_stats null → 400")
    st, body = await ctx.raw("GET", "/workers/w-wire")
    C.eq((st, body), (200, None), "a refused heartbeat creates no worker")
    st, _ = await ctx.raw("POST", "/rollouts", {"input": 1, "config": {"max_attempts": 0}})
    C.eq(st, 422, "max_attempts 0 → 422")
    st, _ = await ctx.raw("POST", "/rollouts", {"mode": "train"})
    C.eq(st, 422, "start_rollout without input → 422")
    st, body = await ctx.raw("POST", f"/rollouts/{ctx.r['r5'].rollout_id}", {"input": None, "metadata": {"x": 1}})
    C.ok(st == 200 and isinstance(body, dict) and body.get("input") is None and body.get("metadata") == {"x": 1}, "update_rollout input null sets null", (st, body))
    assert ctx.http is not None
    async with ctx.http.get(ctx.url + "/v1/agl/no/such/route") as resp:
        C.eq(resp.status, 404, "unknown /v1 path → 404")
    async with ctx.http.post(ctx.url + "/v1/logs", data=b"") as resp:
        C.eq(resp.status, 501, "POST /v1/logs → 501")
    async with ctx.http.post(ctx.url + "/v1/traces", data=b"\xff\xff\xff", headers={"Content-Type": "application/x-protobuf"}) as resp:
        C.eq(resp.status, 400, "unparseable OTLP protobuf → 400")
    async with ctx.http.post(ctx.url + "/v1/traces", data=b"", headers={"Content-Type": "application/x-protobuf"}) as resp:
        C.eq(resp.status, 200, "empty OTLP body → 200")
    async with ctx.http.post(ctx.url + "/v1/traces", data=b"<x/>", headers={"Content-Type": "text/xml"}) as resp:
        # DEVIATION (agl, crates/agl-server/src/otlp.rs): 415; v0.3.0 answers 400.
        C.eq(resp.status, 415 if ctx.ours else 400, "OTLP with an unsupported content type")


async def s_concurrency(ctx: Ctx) -> None:
    """Many requests in flight at once through one client: no rollout dequeued twice, no
    sequence id issued twice, concurrent updates all applied."""
    cl = ctx.client
    rs = await step(cl.enqueue_many_rollouts([EnqueueRolloutRequest(input={"n": i}) for i in range(60)]), "enqueue 60")
    want = set(ids(rs))
    C.eq(len(want), 60, "60 distinct rollout ids")

    async def worker(n: int) -> List[AttemptedRollout]:
        got: List[AttemptedRollout] = []
        while True:
            batch = await cl.dequeue_many_rollouts(limit=1 + n % 3, worker_id=f"w-conc-{n}")
            if not batch:
                return got
            got.extend(batch)

    batches = await step(asyncio.gather(*(worker(n) for n in range(8))), "8 concurrent dequeuers")
    got = [x.rollout_id for b in batches for x in b]
    C.eq(len(got), 60, "every rollout dequeued exactly once (count)")
    C.eq(set(got), want, "every rollout dequeued exactly once (ids)")
    first = rs[0].rollout_id
    first_attempt = next(x.attempt.attempt_id for b in batches for x in b if x.rollout_id == first)
    seqs = await step(
        asyncio.gather(*(cl.get_next_span_sequence_id(first, first_attempt) for _ in range(50))),
        "50 concurrent get_next_span_sequence_id",
    )
    C.eq(sorted(seqs), list(range(1, 51)), "concurrent sequence ids are distinct and contiguous")
    spans = [
        make_span(ctx, first, first_attempt, seq, f"{seq:016x}", "conc", None, {"seq": seq})
        for seq in seqs
    ]
    stored = await step(asyncio.gather(*(cl.add_span(sp) for sp in spans)), "50 concurrent add_span")
    C.ok(all(isinstance(sp, Span) for sp in stored), "every concurrent span stored", [type(x).__name__ for x in stored])
    page = await step(cl.query_spans(first), "query_spans(concurrent)")
    C.eq([sp.sequence_id for sp in page.items], list(range(1, 51)), "stored spans in sequence order")
    ups = await step(
        asyncio.gather(*(cl.update_attempt(x.rollout_id, x.attempt.attempt_id, status="succeeded") for b in batches for x in b)),
        "60 concurrent update_attempt",
    )
    C.ok(all(u.status == "succeeded" for u in ups), "all attempts succeeded", [u.status for u in ups])
    done = await step(cl.wait_for_rollouts(rollout_ids=ids(rs), timeout=0), "wait_for_rollouts(concurrent)")
    C.eq(len(done), 60, "all 60 rollouts terminal")
    C.ok(all(x.status == "succeeded" for x in done), "all 60 succeeded", [x.status for x in done])
    workers = await step(cl.query_workers(worker_id_contains="w-conc-"), "query_workers(concurrent)")
    C.ok(all(w.status == "idle" for w in workers.items), "every concurrent worker idle at the end", [(w.worker_id, w.status) for w in workers.items])


async def s_edge_values(ctx: Ctx) -> None:
    """JSON values the Python client sends as they are: big integers, non-ASCII text, and NaN /
    Infinity (Python's json.dumps writes them as bare tokens, e.g. from pandas-derived tasks)."""
    cl = ctx.client
    big = {"big": 2**70, "neg": -(2**63), "u64": 2**64 - 1, "u": "héllo ✓ 🚀", "f": 1.0, "tiny": 5e-324, "nested": [[], {}, None]}
    # DEVIATION: agl keeps integers exactly within the 64-bit range (-2**63 .. 2**64-1) and stores
    # larger ones as the nearest float. (agentlightning keeps Python ints of any size.)
    expected = dict(big, big=float(2**70)) if ctx.ours else big
    big_type = float if ctx.ours else int
    ar = await step(cl.start_rollout(input=big, worker_id="w-edge"), "start_rollout(edge values)")
    C.soft(ar.input == expected and type(ar.input["big"]) is big_type and type(ar.input["neg"]) is int and type(ar.input["u64"]) is int and type(ar.input["f"]) is float, "values echoed exactly (64-bit ints stay ints)", ar.input)
    got = await step(cl.get_rollout_by_id(ar.rollout_id), "get_rollout_by_id(edge values)")
    C.soft(got is not None and got.input == expected and type(got.input["u64"]) is int, "values stored exactly", got.input if got else None)
    await step(cl.update_attempt(ar.rollout_id, "latest", status="succeeded"), "update_attempt(edge)")
    try:
        nan = await step(
            ctx.strict.enqueue_rollout(input={"score": float("nan"), "cap": float("inf")}, metadata={"w": float("-inf")}),
            "enqueue_rollout(NaN / Infinity)",
        )
        # v0.3.0 parses the tokens and answers them as null.
        C.soft(nan.input == {"score": None, "cap": None} and nan.metadata == {"w": None}, "NaN / Infinity stored as null", (nan.input, nan.metadata))
        await step(cl.update_rollout(nan.rollout_id, status="cancelled"), "cancel the NaN rollout")
    except aiohttp.ClientResponseError as exc:
        C.soft(False, "NaN / Infinity accepted (as v0.3.0 does)", f"HTTP {exc.status}")


async def wait_status(cl: LightningStoreClient, rid: str, status: str, within: float) -> Optional[Rollout]:
    """Polls get_rollout_by_id (which also runs the server's lazy watchdog scan) until `status`."""
    deadline = time.monotonic() + within
    ro = None
    while time.monotonic() < deadline:
        ro = await step(cl.get_rollout_by_id(rid), "get_rollout_by_id(poll)")
        if ro is not None and ro.status == status:
            return ro
        await asyncio.sleep(0.25)
    return ro


async def s_watchdog(ctx: Ctx) -> None:
    """timeout_seconds end to end: attempt 1 times out → requeuing → attempt 2 times out → failed.
    agl sweeps every 0.5 s; v0.3.0 scans lazily, at most every 10 s, so this is slow there."""
    cl = ctx.client
    within = 6.0 if ctx.ours else 25.0
    cfg = RolloutConfig(timeout_seconds=1.0, max_attempts=2, retry_condition=["timeout"])
    ro = await step(cl.enqueue_rollout(input="watchdog", config=cfg), "enqueue_rollout(timeout 1 s)")
    first = await step(cl.dequeue_rollout(worker_id="w-dog"), "dequeue(watchdog)")
    C.ok(first is not None and first.rollout_id == ro.rollout_id, "dequeued the watchdog rollout", first)
    assert first is not None
    got = await wait_status(cl, ro.rollout_id, "requeuing", within)
    C.ok(got is not None and got.status == "requeuing", "attempt 1 timed out → requeuing", got)
    att = await step(cl.query_attempts(ro.rollout_id), "query_attempts(watchdog)")
    a1 = att.items[0]
    C.eq(a1.status, "timeout", "attempt 1 status timeout")
    if ctx.ours:
        # DEVIATION Q8: timeout is final and sets end_time. (agentlightning leaves it null.)
        C.ok(a1.end_time is not None, "Q8: a timed-out attempt has an end_time", a1)
    else:
        C.eq(a1.end_time, None, "Python server: a timed-out attempt keeps end_time null")
    w = await step(cl.get_worker_by_id("w-dog"), "get_worker_by_id(w-dog)")
    C.ok(w is not None and w.status == "unknown" and w.current_rollout_id is None, "worker unknown after a timeout", w)
    second = await step(cl.dequeue_rollout(worker_id="w-dog"), "dequeue(watchdog retry)")
    C.ok(second is not None and second.rollout_id == ro.rollout_id and second.attempt.sequence_id == 2, "retry dequeued as attempt 2", second)
    got = await wait_status(cl, ro.rollout_id, "failed", within)
    C.ok(got is not None and got.status == "failed" and got.end_time is not None, "attempt 2 timed out → failed with end_time", got)


class InteropAgent(LitAgent[Dict[str, Any]]):
    """Emits an operation span with a message and an object inside, and returns a float reward."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[str] = []

    async def rollout_async(self, task: Dict[str, Any], resources: Any, rollout: Any) -> float:
        assert "main_llm" in resources, resources
        self.seen.append(rollout.rollout_id)
        with operation(name="interop.solve", step=1) as op:
            op.set_input(question=task["q"])
            emit_message(f"thinking about {task['q']}")
            emit_object({"answer": 42, "q": task["q"]})
            op.set_output({"answer": 42})
        return float(task["reward"])


async def s_runner(ctx: Ctx) -> None:
    cl = ctx.client
    C.eq(await step(cl.dequeue_rollout(), "dequeue (stale entries only)"), None, "stale queue entries are skipped")
    rs = await step(
        cl.enqueue_many_rollouts(
            [
                EnqueueRolloutRequest(input={"q": "alpha", "reward": 0.75}, mode="train"),
                EnqueueRolloutRequest(input={"q": "beta", "reward": 0.25}, mode="val"),
            ]
        ),
        "enqueue for the runner",
    )
    rids = ids(rs)
    C.eq([x.status for x in rs], ["queuing", "queuing"], "runner rollouts queued")
    agent = InteropAgent()
    tracer = OtelTracer()
    runner: LitAgentRunner[Dict[str, Any]] = LitAgentRunner(
        tracer, max_rollouts=2, poll_interval=0.2, heartbeat_interval=0.5, heartbeat_launch_mode="asyncio"
    )
    runner.init(agent)
    runner.init_worker(0, cl)
    json_before = len(cl.json_spans)
    try:
        await step(runner.iter(), "LitAgentRunner.iter (2 rollouts)", timeout=90)
        direct = await step(runner.step({"q": "gamma", "reward": 1.0}, mode="test"), "LitAgentRunner.step", timeout=60)
    finally:
        runner.teardown_worker(0)
        runner.teardown()
    C.eq(agent.seen[:2], rids, "the runner dequeued the enqueued rollouts in order")
    C.ok(isinstance(direct, AttemptedRollout), "step returns the finished rollout", direct)
    all_rids = rids + [direct.rollout_id]
    rewards = {rids[0]: 0.75, rids[1]: 0.25, direct.rollout_id: 1.0}
    questions = {rids[0]: "alpha", rids[1]: "beta", direct.rollout_id: "gamma"}

    done = await step(cl.wait_for_rollouts(rollout_ids=all_rids, timeout=0), "wait_for_rollouts(runner)")
    C.eq([(x.rollout_id, x.status) for x in done], [(x, "succeeded") for x in all_rids], "runner rollouts succeeded")
    # Only the reward spans went over JSON (POST /spans); everything else came over OTLP.
    C.eq(sorted(cl.json_spans[json_before:]), sorted(all_rids), "one JSON span (the reward) per rollout")
    C.eq(cl.otel_span_calls, 1, "the runner never used add_otel_span (only the manual call)")

    for rid in all_rids:
        att = await step(cl.get_latest_attempt(rid), "get_latest_attempt(runner)")
        C.ok(att is not None and att.status == "succeeded" and att.worker_id == "Worker-0", "attempt succeeded on Worker-0", att)
        assert att is not None
        C.ok(att.last_heartbeat_time is not None and att.end_time is not None, "attempt heartbeat and end_time set", att)
        spans = (await step(cl.query_spans(rid, "latest"), "query_spans(runner)")).items
        names = [s.name for s in spans]
        C.eq(sorted(names), sorted(["agentlightning.operation", "agentlightning.message", "agentlightning.object", "agentlightning.annotation"]), f"{rid}: span names")
        seqs = [s.sequence_id for s in spans]
        C.eq(seqs, list(range(1, len(spans) + 1)), f"{rid}: server-issued sequence ids 1..n in order")
        otlp = [s for s in spans if s.name != "agentlightning.annotation"]
        for s in otlp:
            C.ok(s.attempt_id == att.attempt_id, "OTLP span bound to the attempt", s.attempt_id)
            res = s.resource.attributes
            C.ok(res.get("agentlightning.rollout_id") == rid and res.get("agentlightning.attempt_id") == att.attempt_id, "ids came in the OTLP resource", res)
            C.ok(not s.model_extra, "OTLP spans carry no extra keys", s.model_extra)
            C.ok(bool(HEX32.match(s.trace_id)) and bool(HEX16.match(s.span_id)), "hex ids", (s.trace_id, s.span_id))
            C.ok(isinstance(s.start_time, float) and isinstance(s.end_time, float) and s.start_time > 1e9 and s.start_time < 1e11, "OTLP times converted to seconds", (s.start_time, s.end_time))
        op = next(s for s in spans if s.name == "agentlightning.operation")
        msg = next(s for s in spans if s.name == "agentlightning.message")
        obj = next(s for s in spans if s.name == "agentlightning.object")
        C.eq((msg.parent_id, obj.parent_id), (op.span_id, op.span_id), "message and object nest under the operation")
        C.eq(op.attributes.get("agentlightning.operation.name"), "interop.solve", "operation name attribute")
        C.eq(op.attributes.get("agentlightning.operation.input.question"), questions[rid], "operation input attribute")
        q = questions[rid]
        C.eq(msg.attributes.get("agentlightning.message.body"), f"thinking about {q}", "message body")
        C.eq(obj.attributes.get("agentlightning.object.json"), json.dumps({"answer": 42, "q": q}), "object json")
        C.eq(op.attributes.get("agentlightning.operation.output.answer"), 42, "operation output attribute")
        C.eq(obj.status.status_code, "OK", "object span status OK")
        reward = spans[-1]
        C.eq(reward.name, "agentlightning.annotation", "the reward span is last (highest sequence id)")
        C.eq(reward.attributes.get("agentlightning.reward.0.value"), rewards[rid], "agentlightning.reward.0.value")
        C.eq(reward.attributes.get("agentlightning.reward.0.name"), "primary", "agentlightning.reward.0.name")
        C.eq(get_reward_value(reward), rewards[rid], "get_reward_value")
        C.eq(find_final_reward(spans), rewards[rid], "find_final_reward over the stored spans")

    if ctx.ours:
        # agl's Prometheus metrics count requests by route: the runner's spans hit /v1/traces.
        # (agentlightning serves metrics only with `--tracker prometheus`, at /v1/prometheus/.)
        assert ctx.http is not None
        async with ctx.http.get(ctx.url + "/metrics") as resp:
            text = await resp.text()
        hits = [
            ln for ln in text.splitlines()
            if ln.startswith("agl_http_total{") and 'path="/v1/traces"' in ln and 'status="200"' in ln
        ]
        C.ok(resp.status == 200 and bool(hits) and float(hits[0].rsplit(" ", 1)[1]) >= 9, "metrics: ≥ 9 OTLP requests answered 200", hits or text[:400])

    w = await step(cl.get_worker_by_id("Worker-0"), "get_worker_by_id(Worker-0)")
    C.ok(w is not None and w.status == "idle" and w.current_rollout_id is None, "runner worker idle at the end", w)
    assert w is not None
    C.ok(isinstance(w.heartbeat_stats, dict) and "cpu_cores" in w.heartbeat_stats, "runner heartbeat stats stored", w.heartbeat_stats)


SECTIONS: List[tuple[str, Callable[[Ctx], Awaitable[None]]]] = [
    ("health", s_health),
    ("resources", s_resources),
    ("enqueue/dequeue", s_enqueue_dequeue),
    ("query_rollouts", s_query_rollouts),
    ("attempts", s_attempts),
    ("spans", s_spans),
    ("updates", s_updates),
    ("wait_for_rollouts", s_wait),
    ("workers", s_workers),
    ("statistics", s_statistics),
    ("otlp exporter", s_otlp),
    ("wire", s_wire),
    ("concurrency", s_concurrency),
    ("edge values", s_edge_values),
    ("watchdog", s_watchdog),
    ("runner", s_runner),
]


TOTALS = ("total_rollouts", "total_attempts", "total_spans", "total_resources", "total_workers")


async def snapshot(cl: LightningStoreClient) -> Dict[str, Any]:
    """What must survive a restart of a durable server: counts, statuses, spans, resources."""
    stats = await step(cl.statistics(), "statistics")
    rollouts = (await step(cl.query_rollouts(), "query_rollouts")).items
    spans = {}
    for ro in rollouts:
        page = await step(cl.query_spans(ro.rollout_id), "query_spans")
        spans[ro.rollout_id] = [[s.sequence_id, s.span_id, s.name] for s in page.items]
    latest = await step(cl.get_latest_resources(), "get_latest_resources")
    return {
        "statistics": {k: stats.get(k) for k in TOTALS},
        "rollouts": {ro.rollout_id: [ro.status, ro.end_time is not None] for ro in rollouts},
        "spans": spans,
        "latest_resources": [latest.resources_id, latest.version] if latest else None,
    }


async def verify_state(ctx: Ctx, path: str) -> None:
    """After a restart on the same database, everything recorded by --state-out is still there."""
    with open(path, encoding="utf-8") as f:
        want = json.load(f)
    got = await snapshot(ctx.client)
    for key in ("statistics", "rollouts", "spans", "latest_resources"):
        C.soft(got[key] == want[key], f"after restart: {key} unchanged", {"got": got[key], "want": want[key]} if got[key] != want[key] else None)
    # The store still works after the restart: the span counter continues past the stored ids.
    rid = next(iter(want["spans"]))
    top = max((s[0] for s in want["spans"][rid]), default=0)
    nxt = await step(ctx.client.get_next_span_sequence_id(rid, "at-any"), "get_next_span_sequence_id after restart")
    C.ok(nxt > top, "sequence counter survives the restart", {"next": nxt, "max stored": top})


async def main_async(args: argparse.Namespace) -> int:
    ctx = Ctx(args.url, args.server, args.slow)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        ctx.http = http
        sections = SECTIONS
        if args.verify_state:
            sections = [("restart", lambda c: verify_state(c, args.verify_state))]
        for name, fn in sections:
            C.section = name
            before = len(C.failed)
            t0 = time.monotonic()
            try:
                await fn(ctx)
            except CheckFailed:
                pass
            except Exception as exc:  # noqa: BLE001 - report and go on with the next section
                C.failed.append(f"[{name}] unexpected {type(exc).__name__}: {exc}")
                print(f"  FAIL [{name}] unexpected exception:", flush=True)
                traceback.print_exc()
            verdict = "ok" if len(C.failed) == before else "FAILED"
            print(f"{name:<20} {verdict:<7} ({time.monotonic() - t0:.1f} s)", flush=True)
        if args.state_out:
            with open(args.state_out, "w", encoding="utf-8") as f:
                json.dump(await snapshot(ctx.client), f, indent=1, sort_keys=True)
    await ctx.client.close()
    await ctx.strict.close()
    print(f"\n{C.passed} checks passed, {len(C.failed)} failed against {args.server} server at {args.url}")
    for f in C.failed:
        print(f"  - {f}")
    return 0 if not C.failed else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("AGL_STORE_URL", "http://127.0.0.1:4747"))
    parser.add_argument("--server", choices=["agl", "python"], default="agl", help="whose deviations to expect")
    parser.add_argument("--slow", action="store_true", help="also run the 25 s wait-cap check (Q16)")
    parser.add_argument("--deadline", type=float, default=300.0, help="kill the run after this many seconds")
    parser.add_argument("--state-out", metavar="FILE", help="after the run, write what must survive a restart")
    parser.add_argument("--verify-state", metavar="FILE", help="only check a restarted server against FILE")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
