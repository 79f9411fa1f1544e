"""A LangChain tool-calling Spider agent inside Agent Lightning 0.3's ``@rollout``, trained
through agl's gateway without importing anything agl.

The agent is ``langchain_openai.ChatOpenAI`` bound to one tool, ``run_sql(query)``, which runs a
query on the task's database (``spider_sql.execute``: an in-memory copy, rolled back, 2 s limit)
and returns its rows as text. The model gets agl's write prompt (``spider_sql.write_messages``)
and may call the tool up to ``MAX_TOOL_CALLS`` times; its answer is the SQL of its final reply
(``extract_sql``), else the last query it ran. Reward: 1.0 when that SQL matches the gold query
by execution, else 0.0. The chat model's ``base_url`` is the rollout's attempt route of the
``main_llm`` resource (``@rollout`` resolves the ProxyLLM per attempt), so every model call is
recorded by the gateway with its token ids and becomes a trainable triplet.

As a runner (the same as ``spider_agent.py``; see its docs for how the runner role stops)::

    python langchain_agent.py --store-url URL [--n-runners N] [--max-rollouts N]

As a self-check against ``agl store --llm MODEL`` (the store and gateway on one port)::

    python langchain_agent.py --check --store-url URL --tasks tasks.jsonl --agl PATH/TO/agl

which enqueues the tasks with a ``main_llm`` ProxyLLM (``URL/v1``), runs them with
agentlightning's ``LitAgentRunner``, and requires every rollout to succeed with a reward and
``agl triplets --for-training`` to give one triplet per model call, none refused, the reward on
the last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any, Dict, List, Optional

import agentlightning as agl
from agentlightning.types import ProxyLLM
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spider_sql  # noqa: E402

MAX_TOOL_CALLS = 2
SQL_TIMEOUT = 2.0
MAX_ROWS_SHOWN = 20


def make_run_sql(db_path: str, ran: List[str]):
    @tool
    def run_sql(query: str) -> str:
        """Run one read-only SQLite query on the question's database and return its rows."""
        ran.append(query)
        try:
            columns, rows = spider_sql.execute(db_path, query, SQL_TIMEOUT)
        except spider_sql.SqlError as e:
            return f"Error: {e}"
        shown = "\n".join(repr(tuple(r)) for r in rows[:MAX_ROWS_SHOWN])
        more = f"\n... and {len(rows) - MAX_ROWS_SHOWN} more rows" if len(rows) > MAX_ROWS_SHOWN else ""
        return f"{len(rows)} rows, {columns} columns\n{shown}{more}"

    return run_sql


@agl.rollout
async def langchain_agent(task: Dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
    """Answers the question with ChatOpenAI + run_sql; reward by execution match."""
    base_url = (
        llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id) if isinstance(llm, ProxyLLM) else llm.endpoint
    )
    params = llm.sampling_parameters or {}
    chat = ChatOpenAI(
        model=llm.model,
        base_url=base_url,
        api_key=llm.api_key or "dummy",
        temperature=float(params.get("temperature", 0.0)),
        max_tokens=int(params.get("max_tokens", 512)),
        max_retries=0,
        timeout=600,
    )
    ran: List[str] = []
    run_sql = make_run_sql(task["db_path"], ran)
    model = chat.bind_tools([run_sql])
    prompt = spider_sql.write_messages(task["schema"], task["question"])
    messages: List[BaseMessage] = [
        SystemMessage(prompt[0]["content"] + "\n\nYou may call the run_sql tool to try a query first."),
        HumanMessage(prompt[1]["content"]),
    ]
    reply: AIMessage = await model.ainvoke(messages)
    for _ in range(MAX_TOOL_CALLS):
        if not reply.tool_calls:
            break
        messages.append(reply)
        for call in reply.tool_calls:
            output = await asyncio.to_thread(run_sql.invoke, call["args"])
            messages.append(ToolMessage(content=str(output), tool_call_id=call["id"]))
        reply = await model.ainvoke(messages)
    text = reply.content if isinstance(reply.content, str) else str(reply.content)
    sql = spider_sql.extract_sql(text) or (ran[-1] if ran else None)
    reward, error = await asyncio.to_thread(spider_sql.reward, task["db_path"], task["gold"], sql, SQL_TIMEOUT)
    print(json.dumps({"id": task.get("id"), "tool_calls": len(ran), "predicted": sql, "reward": reward, "error": error}),
          file=sys.stderr, flush=True)
    return reward


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, which agentlightning's execution strategy
    turns into a cooperative stop of every runner. Needed because a shell starts background
    jobs with SIGINT ignored (and Python then installs no handler), and SIGTERM would otherwise
    kill this process at once, leaving forked runners behind."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def run_runner(args: argparse.Namespace) -> int:
    from agentlightning import LitAgentRunner, OtelTracer, Trainer
    from agentlightning.store.client_server import LightningStoreClient

    os.environ["AGL_CURRENT_ROLE"] = "runner"
    os.environ["AGL_MANAGED_STORE"] = "0"
    _stop_on_signals()
    tracer = OtelTracer()
    Trainer(
        store=LightningStoreClient(args.store_url),
        n_runners=args.n_runners,
        tracer=tracer,
        runner=LitAgentRunner(tracer, max_rollouts=args.max_rollouts, poll_interval=1.0),
    ).fit(langchain_agent)
    return 0


async def check(args: argparse.Namespace) -> int:
    from agentlightning import LitAgentRunner, OtelTracer
    from agentlightning.store.client_server import LightningStoreClient

    url = args.store_url.rstrip("/")
    tasks = [json.loads(line) for line in open(args.tasks) if line.strip()]
    client = LightningStoreClient(url)
    resources = await client.add_resources(
        {"main_llm": ProxyLLM(endpoint=url + "/v1", model=args.model, sampling_parameters={"temperature": 0.0, "max_tokens": args.max_tokens})}
    )
    rids = [(await client.enqueue_rollout(input=t, mode="train", resources_id=resources.resources_id)).rollout_id for t in tasks]
    runner: LitAgentRunner[Dict[str, Any]] = LitAgentRunner(OtelTracer(), max_rollouts=len(rids), poll_interval=0.2)
    runner.init(langchain_agent)
    runner.init_worker(0, client)
    try:
        await asyncio.wait_for(runner.iter(), timeout=args.timeout)
    finally:
        runner.teardown_worker(0)
        runner.teardown()
    failures: List[str] = []
    done = {r.rollout_id: r.status for r in await client.wait_for_rollouts(rollout_ids=rids, timeout=0)}
    total_triplets = 0
    for rid in rids:
        if done.get(rid) != "succeeded":
            failures.append(f"{rid}: status {done.get(rid)}")
            continue
        proc = subprocess.run([args.agl, "triplets", "--store-url", url, "--rollout-id", rid, "--for-training"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            failures.append(f"{rid}: agl triplets exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
            continue
        report = json.loads(proc.stdout)
        triplets: List[Dict[str, Any]] = report.get("triplets") or []
        total_triplets += len(triplets)
        reward: Optional[float] = triplets[-1].get("reward") if triplets else None
        ok = (
            len(triplets) >= 1
            and len(triplets) == report.get("llm_calls")
            and report.get("refused_missing_token_ids") == 0
            and reward in (0.0, 1.0)
            and all(t["prompt"]["token_ids"] and t["response"]["token_ids"] for t in triplets)
        )
        print(f"{rid}: {len(triplets)} triplets of {report.get('llm_calls')} calls, reward on the last {reward}")
        if not ok:
            failures.append(f"{rid}: triplets not trainable: {json.dumps(report)[:400]}")
    await client.close()
    print(f"{len(rids)} rollouts, {total_triplets} trainable triplets, {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    return 0 if not failures else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store-url", required=True)
    ap.add_argument("--check", action="store_true", help="enqueue --tasks, run them, check their triplets")
    ap.add_argument("--tasks", help="task lines (agl spider tasks) for --check")
    ap.add_argument("--agl", default="agl", help="the agl binary, for `agl triplets` (--check)")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="model name in the resource (--check)")
    ap.add_argument("--max-tokens", type=int, default=64, help="max_tokens in the resource (--check)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds the runner may take (--check)")
    ap.add_argument("--n-runners", type=int, default=1)
    ap.add_argument("--max-rollouts", type=int, default=None)
    args = ap.parse_args()
    if args.check:
        if not args.tasks:
            ap.error("--check needs --tasks")
        return asyncio.run(check(args))
    return run_runner(args)


if __name__ == "__main__":
    sys.exit(main())
