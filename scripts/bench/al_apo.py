"""Agent Lightning 0.3's own APO (``agentlightning[apo]``) against an agl store: the other half of
``scripts/bench/apo_side_by_side.sh``.

Runs ``agentlightning.algorithm.apo.APO`` in Agent Lightning's ``algorithm`` role against a
remote store (``Trainer(store=LightningStoreClient(URL))`` with ``AGL_CURRENT_ROLE=algorithm`` and
``AGL_MANAGED_STORE=0``; no runner here: the runners are ``examples/python/spider_agent.py
--prompt-template --llm-endpoint …`` processes against the same store). Its critic and editor
are ``--optimizer-base-url`` (any OpenAI-compatible ``…/v1``) with ``--model`` for both (Agent
Lightning's ``gradient_model`` and ``apply_edit_model``).

Agent Lightning's APO publishes each candidate as ``{"prompt_template": PromptTemplate}`` under
the resources id ``v0``, ``v1``, … and scores it as the mean final reward of its rollouts (a
missing reward counts 0). After the run this script reads every ``val`` rollout of those
versions back from the store and writes ``--report``: the best template and score as APO keeps
them (``get_best_prompt()``, ``_history_best_score``), each version's template and its ``val``
scores, the wall time in seconds, and the optimiser's token usage as the server reported it.

    python al_apo.py --store-url http://127.0.0.1:4747 --optimizer-base-url http://127.0.0.1:8000/v1 \\
        --model qwen2.5-coder-1.5b-instruct --train train.jsonl --val val.jsonl --val-limit 16 \\
        --seed-template seed.txt --beam-width 2 --branch-factor 2 --beam-rounds 2 \\
        --gradient-batch-size 4 --val-batch-size 8 --best-out best.txt --report al.json

Needs ``agentlightning[apo]==0.3.0`` (poml) and ``LITELLM_LOCAL_MODEL_COST_MAP=True`` offline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[2]


def read_tasks(path: str, limit: int | None) -> List[Dict[str, Any]]:
    tasks = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return tasks[:limit] if limit else tasks


class Usage:
    """Adds up the optimiser's reported token usage (APO does not)."""

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.calls = 0

    def wrap(self, client: Any) -> None:
        create = client.chat.completions.create

        async def counted(*args: Any, **kwargs: Any) -> Any:
            response = await create(*args, **kwargs)
            self.calls += 1
            if response.usage is not None:
                self.prompt += response.usage.prompt_tokens
                self.completion += response.usage.completion_tokens
            return response

        client.chat.completions.create = counted


async def version_scores(store: Any) -> Dict[str, Dict[str, Any]]:
    """Every ``val`` rollout's final reward, grouped by resources id (with the version's
    template), read back from the store."""
    from agentlightning.reward import find_final_reward

    out: Dict[str, Dict[str, Any]] = {}
    for rollout in await store.query_rollouts():
        if rollout.mode != "val" or rollout.resources_id is None:
            continue
        spans = await store.query_spans(rollout.rollout_id, "latest")
        reward = find_final_reward(spans)
        entry = out.setdefault(rollout.resources_id, {"rewards": []})
        entry["rewards"].append(reward)
    for update in await store.query_resources():
        if update.resources_id in out:
            template = update.resources.get("prompt_template")
            out[update.resources_id]["template"] = getattr(template, "template", None)
    for entry in out.values():
        rewards = entry["rewards"]
        entry["rollouts"] = len(rewards)
        entry["mean_reward"] = sum(r or 0.0 for r in rewards) / max(1, len(rewards))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store-url", required=True)
    parser.add_argument("--optimizer-base-url", required=True)
    parser.add_argument("--model", required=True, help="gradient_model and apply_edit_model")
    parser.add_argument("--train", required=True, help="training tasks (JSON lines)")
    parser.add_argument("--val", required=True, help="validation tasks (JSON lines)")
    parser.add_argument("--val-limit", type=int, default=None, help="the first N validation tasks")
    parser.add_argument("--seed-template", required=True, help="file with the initial template")
    parser.add_argument("--beam-width", type=int, default=4)
    parser.add_argument("--branch-factor", type=int, default=4)
    parser.add_argument("--beam-rounds", type=int, default=3)
    parser.add_argument("--gradient-batch-size", type=int, default=4)
    parser.add_argument("--val-batch-size", type=int, default=16)
    parser.add_argument("--diversity-temperature", type=float, default=1.0)
    parser.add_argument("--request-timeout", type=float, default=1800.0, help="seconds per optimiser call")
    parser.add_argument("--seed", type=int, default=0, help="seed of Python's random (APO's draws)")
    parser.add_argument("--best-out", required=True, help="write the best template here")
    parser.add_argument("--report", required=True, help="write the JSON report here")
    args = parser.parse_args()

    os.environ["AGL_CURRENT_ROLE"] = "algorithm"
    os.environ["AGL_MANAGED_STORE"] = "0"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import agentlightning as agl
    from agentlightning.algorithm.apo import APO
    from agentlightning.store.client_server import LightningStoreClient
    from openai import AsyncOpenAI

    sys.path.insert(0, str(ROOT / "examples" / "python"))
    import spider_agent  # the agent object Trainer.fit wants; it runs in the runner processes

    random.seed(args.seed)
    client = AsyncOpenAI(
        base_url=args.optimizer_base_url, api_key="dummy", timeout=args.request_timeout, max_retries=0
    )
    usage = Usage()
    usage.wrap(client)
    apo = APO(
        client,
        gradient_model=args.model,
        apply_edit_model=args.model,
        diversity_temperature=args.diversity_temperature,
        gradient_batch_size=args.gradient_batch_size,
        val_batch_size=args.val_batch_size,
        beam_width=args.beam_width,
        branch_factor=args.branch_factor,
        beam_rounds=args.beam_rounds,
    )
    store = LightningStoreClient(args.store_url)
    seed = Path(args.seed_template).read_text()
    trainer = agl.Trainer(
        algorithm=apo,
        store=store,
        n_runners=1,
        # APO reads the rollouts' conversations through this adapter (it refuses any other).
        adapter=agl.TraceToMessages(),
        initial_resources={"prompt_template": agl.PromptTemplate(template=seed, engine="f-string")},
    )
    train = read_tasks(args.train, None)
    val = read_tasks(args.val, args.val_limit)
    started = time.monotonic()
    trainer.fit(spider_agent.spider_env_prompt_agent, train_dataset=train, val_dataset=val)
    seconds = time.monotonic() - started

    best = apo.get_best_prompt()
    Path(args.best_out).write_text(best.template)
    scores = asyncio.run(version_scores(LightningStoreClient(args.store_url)))
    versions = {}
    for rid in sorted(scores, key=lambda v: (len(v), v)):
        versions[rid] = scores[rid]
    report = {
        "algorithm": "agentlightning 0.3.0 APO",
        "model": args.model,
        "settings": {k: v for k, v in vars(args).items() if k not in ("report", "best_out")},
        "train_tasks": len(train),
        "val_tasks": len(val),
        "best_version": apo._history_best_version,
        "best_score": apo._history_best_score,
        "best_prompt": best.template,
        "versions": versions,
        "optimizer_calls": usage.calls,
        "optimizer_tokens": {"prompt": usage.prompt, "completion": usage.completion},
        "seconds": seconds,
    }
    Path(args.report).write_text(json.dumps(report, indent=2))
    print(
        f"al_apo.py: best {report['best_version']} score {report['best_score']:.3f}, "
        f"{usage.calls} optimiser calls, {seconds:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
