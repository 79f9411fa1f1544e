"""A Spider SQL agent for Agent Lightning 0.3, trained by agl without importing anything agl.

The agent is an ordinary ``@agentlightning.rollout`` function using the official ``openai``
client: it sends the write prompt of agl's built-in ``LlmSqlAgent`` (``spider_sql.py`` mirrors
``crates/agl-spider/src/prompts.rs``) to the ``main_llm`` resource, reads the SQL out of the
reply as agl does, runs it with Python's ``sqlite3`` against ``task["db_path"]`` (an in-memory
copy, rolled back, 2 s limit) and returns 1.0 when its result matches the gold query's by
Spider's execution match, else 0.0. Tasks are the lines ``agl spider tasks`` writes:
``{"id", "db_id", "question", "schema", "gold", "db_path"}``.

Two ways to run it:

1. **Agent Lightning's runner against a remote store** (``agl store``, or the store of
   ``agl train --algorithm grpo``)::

       python spider_agent.py --store-url http://127.0.0.1:4747 [--n-runners 2] [--max-rollouts N]

   This is ``Trainer(store=LightningStoreClient(url), n_runners=N).fit(agent)`` with
   ``AGL_CURRENT_ROLE=runner`` and ``AGL_MANAGED_STORE=0`` (see ``main``). What agentlightning
   0.3.0 does with them (``execution/client_server.py``, ``trainer/trainer.py``,
   ``runner/agent.py``): ``ClientServerExecutionStrategy`` reads the role and the managed-store
   flag from those variables; in the ``runner`` role it starts no server and no algorithm, and
   with ``managed_store`` off it hands the trainer's own store (our ``LightningStoreClient``) to
   the runners instead of building a client for ``AGL_SERVER_HOST:AGL_SERVER_PORT``. One
   runner runs in this process; more are forked (one process each). Each ``LitAgentRunner``
   loops ``dequeue_rollout`` → agent → reward span → finish, sleeping ``poll_interval`` when
   the queue is empty. **It does not stop when the algorithm is done**: nothing tells a
   runner-only process that training ended (the stop event is local to the process), so it
   polls until ``--max-rollouts`` rollouts were run per runner, or until it gets SIGINT
   (Ctrl-C), which the strategy turns into a cooperative stop of every runner (exit 0). Out of
   the box SIGTERM kills the main process at once (with several runners the forked ones may
   keep running), and a shell's background job ignores SIGINT (Python then installs no
   handler); ``main`` therefore makes both signals raise ``KeyboardInterrupt``, so
   ``kill PID`` and ``kill -INT PID`` both stop every runner cleanly.

2. **One task under an exec runner** (``agl runner --exec``, ``agl train --runner exec:…``)::

       python spider_agent.py --exec < task.json

   Reads one task from stdin, calls ``$OPENAI_BASE_URL`` (or ``$OPENAI_API_BASE``) with
   ``$OPENAI_MODEL`` and ``$OPENAI_API_KEY``, takes ``temperature``/``max_tokens`` from the
   ``main_llm`` resource in ``$AGL_RESOURCES`` when there is one, and prints
   ``{"reward": x}`` as its last stdout line (diagnostics go to stderr).

With ``--prompt-template`` (runner mode) the agent is ``spider_prompt_agent``: the same, but its
user message is rendered from the rollout's ``PromptTemplate`` resource (fields ``question`` and
``schema``), so ``agl train --algorithm apo`` can optimise it; each rollout's stderr line also
names the ``resources_id`` and the ``template`` it read.

Agent Lightning's own APO publishes each candidate as ``{"prompt_template": …}`` alone, with no
LLM resource; for it, ``--prompt-template --llm-endpoint URL --llm-model NAME`` makes the agent
``spider_env_prompt_agent``, which takes its LLM from those flags instead of the resources: a
``ProxyLLM`` on ``URL`` (an agl gateway's ``…/v1``), so each call still goes to the attempt's
route (``URL`` without ``/v1`` + ``/rollout/<rid>/attempt/<aid>/v1``) and is recorded and
governed on that attempt; greedy, at most ``--max-tokens`` tokens (default 512, as
``LlmSqlAgent``). ``scripts/bench/apo_side_by_side.sh`` runs it under both optimisers.

With ``--tool`` (or ``SPIDER_AGENT_TOOL=1``, for the runner mode) the agent offers the model a
``run_sql`` tool (``{"query": string}``) and forces it with ``tool_choice``, so its SQL goes
through agl's gateway as a tool call, where a policy file that marks ``run_sql.query`` as SQL
(``sql_arguments``) has the kernel check it before the agent sees it. It runs the query of the
call it gets; an answer without the call (the gateway replaced a blocked call with a refusal, or
answered 403 with ``on_block: error``) earns 0 and is logged with the refusal.

Tracing: the runner uses agentlightning's ``OtelTracer`` (the gateway already records every
model call with its token ids; the runner adds the reward span). Set
``LITELLM_LOCAL_MODEL_COST_MAP=True`` offline (agentlightning imports litellm, which otherwise
fetches a price list at import).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any, Dict, Optional

import openai

import spider_sql

SQL_TIMEOUT = 2.0  # seconds per statement, as `agl train --sql-timeout`
DEFAULT_MAX_TOKENS = 512  # LlmSqlAgent's default when the resource sets none
DEFAULT_TEMPERATURE = 0.0  # LlmSqlAgent's default when the resource sets none
LLM_TIMEOUT = 600.0  # seconds per model call


def sampling(params: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The request's sampling arguments from a resource's ``sampling_parameters``."""
    params = params or {}
    out: Dict[str, Any] = {
        "temperature": float(params.get("temperature", DEFAULT_TEMPERATURE)),
        "max_tokens": int(params.get("max_tokens", DEFAULT_MAX_TOKENS)),
    }
    for name in ("top_p", "seed"):
        if params.get(name) is not None:
            out[name] = params[name]
    return out


RUN_SQL_TOOL: Dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "run_sql",
        "description": "Run one read-only SQLite query against the question's database.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "one SQLite statement"}},
            "required": ["query"],
        },
    },
}
TOOL_REMINDER = "Call the run_sql tool with your query."

# --tool / SPIDER_AGENT_TOOL=1: the SQL goes through the gateway as a `run_sql` tool call.
USE_TOOL = "--tool" in sys.argv[1:] or os.environ.get("SPIDER_AGENT_TOOL") == "1"


async def write_sql(
    client: openai.AsyncOpenAI, model: str, task: Dict[str, Any], params: Dict[str, Any], template: Any = None
) -> Dict[str, Any]:
    """The model's SQL for the task: from its reply's ```sql block, or (``USE_TOOL``) from the
    ``query`` of its ``run_sql`` call. ``{"sql": str | None, "refusal": str | None}``. With
    ``template`` (a ``PromptTemplate``), the user message is rendered from it."""
    if template is None:
        messages = spider_sql.write_messages(task["schema"], task["question"])
    else:
        messages = spider_sql.write_messages_with(template, task["schema"], task["question"])
    if not USE_TOOL:
        response = await client.chat.completions.create(model=model, messages=messages, **params)  # type: ignore[arg-type]
        return {"sql": spider_sql.extract_sql(response.choices[0].message.content or ""), "refusal": None}
    messages[-1]["content"] += "\n" + TOOL_REMINDER
    try:
        response = await client.chat.completions.create(
            model=model,
            messages=messages,  # type: ignore[arg-type]
            tools=[RUN_SQL_TOOL],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "run_sql"}},
            **params,
        )
    except openai.PermissionDeniedError as e:  # on_block: error (403 policy_violation)
        return {"sql": None, "refusal": str(e)}
    message = response.choices[0].message
    for call in message.tool_calls or []:
        if call.function.name == "run_sql":
            try:
                query = json.loads(call.function.arguments).get("query")
            except (ValueError, AttributeError):
                query = None
            return {"sql": query if isinstance(query, str) else None, "refusal": None}
    # No call: the gateway replaced a blocked call with a refusal the agent can read.
    return {"sql": None, "refusal": message.content}


async def solve(
    client: openai.AsyncOpenAI,
    model: str,
    task: Dict[str, Any],
    params: Dict[str, Any],
    template: Any = None,
    resources_id: Optional[str] = None,
) -> float:
    """One write turn and its reward: the model's SQL for the task, scored against the gold."""
    answer = await write_sql(client, model, task, params, template)
    sql = answer["sql"]
    reward, error = await asyncio.to_thread(spider_sql.reward, task["db_path"], task["gold"], sql, SQL_TIMEOUT)
    line: Dict[str, Any] = {"id": task.get("id"), "predicted": sql, "reward": reward, "error": error}
    if template is not None:
        line["resources_id"] = resources_id
        line["template"] = template.template
    if answer["refusal"] is not None:
        line["refusal"] = answer["refusal"]
    print(json.dumps(line), file=sys.stderr, flush=True)
    return reward


# ---------------------------------------------------------------------------------------------
# The Agent Lightning agent
# ---------------------------------------------------------------------------------------------

# `--exec` runs one task per process and needs only openai: it skips importing agentlightning
# (seconds per rollout, with litellm).
_EXEC_ONLY = __name__ == "__main__" and "--exec" in sys.argv[1:]
agl = None
if not _EXEC_ONLY:
    try:
        import agentlightning as agl
        from agentlightning.types import ProxyLLM
    except ImportError:
        agl = None  # type: ignore[assignment]


if agl is not None:

    def _client(llm: agl.LLM, rollout: agl.Rollout) -> openai.AsyncOpenAI:
        """A client of the rollout's LLM. `@rollout` already turns a ProxyLLM into the attempt's
        LLM (endpoint `<endpoint>/rollout/<rid>/attempt/<aid>`); a ProxyLLM given as is would
        need `get_base_url` for that route."""
        if isinstance(llm, ProxyLLM):
            base_url = llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)
        else:
            base_url = llm.endpoint
        return openai.AsyncOpenAI(base_url=base_url, api_key=llm.api_key or "dummy", max_retries=0, timeout=LLM_TIMEOUT)

    @agl.rollout
    async def spider_agent(task: Dict[str, Any], llm: agl.LLM, rollout: agl.Rollout) -> float:
        """Writes one SQL query for the task through the rollout's LLM; reward 1.0 on an
        execution match with the gold query, else 0.0."""
        client = _client(llm, rollout)
        try:
            return await solve(client, llm.model, task, sampling(llm.sampling_parameters))
        finally:
            await client.close()


    @agl.rollout
    async def spider_prompt_agent(
        task: Dict[str, Any], llm: agl.LLM, rollout: agl.Rollout, prompt_template: agl.PromptTemplate
    ) -> float:
        """``spider_agent`` with its user message rendered from the rollout's prompt template
        (``--prompt-template``: the candidates of ``agl train --algorithm apo``); Agent
        Lightning's ``@rollout`` hands it the first ``PromptTemplate`` resource."""
        return await _solve_with_template(task, llm, rollout, prompt_template)

    async def _solve_with_template(
        task: Dict[str, Any], llm: agl.LLM, rollout: agl.Rollout, prompt_template: agl.PromptTemplate
    ) -> float:
        client = _client(llm, rollout)
        try:
            return await solve(
                client, llm.model, task, sampling(llm.sampling_parameters), prompt_template, rollout.resources_id
            )
        finally:
            await client.close()


    # --llm-endpoint/--llm-model/--max-tokens (runner mode): the LLM of spider_env_prompt_agent.
    ENV_LLM: Dict[str, Any] = {}

    @agl.rollout
    async def spider_env_prompt_agent(
        task: Dict[str, Any], prompt_template: agl.PromptTemplate, rollout: agl.Rollout
    ) -> float:
        """``spider_prompt_agent`` for algorithms that publish only the prompt template (Agent
        Lightning's APO): the LLM is ``ENV_LLM``'s endpoint and model (a ``ProxyLLM``, so the call
        goes to the attempt's route), greedy, at most ``ENV_LLM["max_tokens"]`` tokens."""
        llm = ProxyLLM(
            endpoint=ENV_LLM["endpoint"],
            model=ENV_LLM["model"],
            sampling_parameters={"temperature": 0.0, "max_tokens": ENV_LLM["max_tokens"]},
        )
        return await _solve_with_template(task, llm, rollout, prompt_template)


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
    """Agent Lightning's runner role against the store at ``args.store_url`` (see the module
    docs for when it stops)."""
    if agl is None:
        print("spider_agent.py: agentlightning is not installed (pip install -r requirements.txt)", file=sys.stderr)
        return 1
    from agentlightning import LitAgentRunner, OtelTracer, Trainer
    from agentlightning.store.client_server import LightningStoreClient

    os.environ["AGL_CURRENT_ROLE"] = "runner"
    os.environ["AGL_MANAGED_STORE"] = "0"
    _stop_on_signals()
    tracer = OtelTracer()
    trainer = Trainer(
        store=LightningStoreClient(args.store_url),
        n_runners=args.n_runners,
        tracer=tracer,
        runner=LitAgentRunner(tracer, max_rollouts=args.max_rollouts, poll_interval=args.poll_interval),
    )
    if args.llm_endpoint is not None:
        ENV_LLM.update(endpoint=args.llm_endpoint, model=args.llm_model, max_tokens=args.max_tokens)
        agent = spider_env_prompt_agent
    else:
        agent = spider_prompt_agent if args.prompt_template else spider_agent
    trainer.fit(agent)
    return 0


# ---------------------------------------------------------------------------------------------
# --exec: one task from stdin, reward on the last stdout line
# ---------------------------------------------------------------------------------------------


def resource_sampling() -> Dict[str, Any]:
    """``sampling_parameters`` of the ``main_llm`` resource (else of the first LLM resource) in
    ``$AGL_RESOURCES`` (a resources object, or a ``{"resources": {…}}`` update); {} without."""
    try:
        value = json.loads(os.environ.get("AGL_RESOURCES") or "{}")
    except ValueError:
        return {}
    if isinstance(value, dict) and isinstance(value.get("resources"), dict):
        value = value["resources"]
    if not isinstance(value, dict):
        return {}
    llms = [v for v in value.values() if isinstance(v, dict) and v.get("resource_type") in ("llm", "proxy_llm")]
    main = value.get("main_llm") if isinstance(value.get("main_llm"), dict) else (llms[0] if llms else {})
    params = main.get("sampling_parameters") or {}
    return params if isinstance(params, dict) else {}


def run_exec() -> int:
    task = json.loads(sys.stdin.read())
    base_url = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
    model = os.environ.get("OPENAI_MODEL")
    if not base_url or not model:
        print("spider_agent.py --exec: OPENAI_BASE_URL and OPENAI_MODEL must be set", file=sys.stderr)
        return 2

    async def go() -> float:
        client = openai.AsyncOpenAI(
            base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "dummy", max_retries=0, timeout=LLM_TIMEOUT
        )
        try:
            return await solve(client, model, task, sampling(resource_sampling()))
        finally:
            await client.close()

    reward = asyncio.run(go())
    print(json.dumps({"reward": reward}), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--store-url", help="run Agent Lightning's runner against this store")
    mode.add_argument("--exec", action="store_true", help="run one task from stdin; print {\"reward\": x} last")
    parser.add_argument("--n-runners", type=int, default=1, help="runner processes (runner mode)")
    parser.add_argument("--max-rollouts", type=int, default=None, help="stop each runner after N rollouts")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between polls of an empty queue")
    parser.add_argument("--tool", action="store_true", help="send the SQL as a run_sql tool call (see the module docs)")
    parser.add_argument(
        "--prompt-template",
        action="store_true",
        help="render the user message from the rollout's prompt_template resource (agl train --algorithm apo)",
    )
    parser.add_argument(
        "--llm-endpoint",
        help="with --prompt-template: the agent's LLM (an agl gateway's …/v1) when the resources carry none",
    )
    parser.add_argument("--llm-model", help="with --llm-endpoint: the model name to request")
    parser.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="with --llm-endpoint: tokens per answer"
    )
    args = parser.parse_args()
    if args.llm_endpoint is not None and (not args.prompt_template or not args.llm_model or args.store_url is None):
        parser.error("--llm-endpoint needs --store-url, --prompt-template and --llm-model")
    logging.basicConfig(level=os.environ.get("SPIDER_AGENT_LOG", "WARNING"))
    if args.exec:
        return run_exec()
    return run_runner(args)


if __name__ == "__main__":
    sys.exit(main())
