"""GovernedRunner inside Agent Lightning 0.3's Trainer, against `agl store`: an unchanged
``@rollout`` agent, rollouts enqueued in the store, the runner role of the Trainer with the
governed runner; then the store holds each rollout's governance span and its shaped reward,
and the emitter writes the flight recorder into the same store.

Needs agentlightning (installed beside the wheel in CI) and an ``agl`` binary (``AGL_BIN``,
conftest.py's ``agl_store``)."""

from __future__ import annotations

import asyncio
import pytest

import agl_rl
from agl_rl import FlightRecorder, FlightRecorderEmitter, GovernedRunner, Kernel, PolicyReward, sql_action

from conftest import extra

al = extra("agentlightning")
from agentlightning.emitter.reward import find_final_reward  # noqa: E402
from agentlightning.store.client_server import LightningStoreClient  # noqa: E402


class SqlAgent(al.LitAgent):
    """An agent written for Agent Lightning; its one governance call is agl_rl.check."""

    def rollout(self, task, resources, rollout):
        agl_rl.check(sql_action(task["sql"], "shop"))
        return 1.0


def test_trainer_runs_the_governed_runner_against_agl_store(agl_store, monkeypatch):
    monkeypatch.setenv("AGL_CURRENT_ROLE", "runner")
    monkeypatch.setenv("AGL_MANAGED_STORE", "0")
    tasks = [{"sql": "SELECT name FROM users"}, {"sql": "DROP TABLE users"}, {"sql": "SELECT 1"}]
    client = LightningStoreClient(agl_store)

    async def enqueue():
        await client.update_resources("r0", {})
        return [(await client.enqueue_rollout(input=t, mode="train")).rollout_id for t in tasks]

    rollout_ids = asyncio.run(enqueue())
    recorder = FlightRecorder()
    kernel = Kernel([{"type": "sql_safety", "config": {"denied": ["drop"]}}], recorder=recorder)
    seen = []
    tracer = al.OtelTracer()
    runner = GovernedRunner(
        kernel,
        violation_callback=seen.append,
        reward_fn=PolicyReward(kernel),
        tracer=tracer,
        max_rollouts=len(tasks),
        poll_interval=0.1,
    )
    trainer_store = LightningStoreClient(agl_store)
    al.Trainer(store=trainer_store, n_runners=1, tracer=tracer, runner=runner).fit(SqlAgent())
    asyncio.run(trainer_store.close())

    stats = runner.get_stats()
    assert stats["total_rollouts"] == 3 and stats["total_violations"] == 1
    assert [v.policy_name for v in seen] == ["sql_safety"]

    async def read():
        out = {}
        for rid in rollout_ids:
            attempts = list(await client.query_attempts(rid))
            spans = list(await client.query_spans(rid, attempts[-1].attempt_id))
            out[rid] = (attempts[-1], spans)
        return out

    stored = asyncio.run(read())
    rewards = []
    for rid in rollout_ids:
        attempt, spans = stored[rid]
        assert attempt.status == "succeeded", (rid, attempt)
        gov = [s for s in spans if "agent_os.violations" in s.attributes]
        assert len(gov) == 1
        rewards.append(find_final_reward(spans))
        if rid == rollout_ids[1]:
            assert gov[0].attributes["agent_os.violations"] == 1
            assert gov[0].attributes["agl.success"] is False
            assert attempt.metadata["total_penalty"] == 100.0
        else:
            assert gov[0].attributes["agent_os.violations"] == 0
    # clean: the agent's 1.0 + the clean bonus 5; blocked: base 0 - 100 (clamped at -100)
    assert rewards == [6.0, -100.0, 6.0]

    # the flight recorder into the same store: one policy-check span per check, on its attempt
    emitter = FlightRecorderEmitter(recorder)
    assert asyncio.run(emitter.emit_to_store(client)) == 3
    assert asyncio.run(emitter.emit_to_store(client)) == 0  # deterministic ids: nothing twice

    async def checks():
        spans = list(await client.query_spans(rollout_ids[1], "latest"))
        return [s for s in spans if s.attributes.get("agent_os.entry_type") == "policy_check"]

    dropped = asyncio.run(checks())
    assert len(dropped) == 1 and dropped[0].attributes["agent_os.policy_violated"] is True
    asyncio.run(client.close())
