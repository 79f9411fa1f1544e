"""The seed's training API from Python on agl's kernel: GovernedRunner (standalone),
GovernedEnvironment, FlightRecorderEmitter and LightningSpan, against the installed wheel.

gymnasium is installed beside the wheel in CI (scripts/ci/python_wheel.sh); with
AGL_RL_REQUIRE_EXTRAS=1 a missing extra fails instead of skipping."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest

import agl_rl
from agl_rl import (
    EnvironmentConfig,
    FlightRecorder,
    FlightRecorderEmitter,
    GovernanceError,
    GovernedEnvironment,
    GovernedRollout,
    GovernedRunner,
    Kernel,
    LightningSpan,
    PolicyReward,
    PolicyViolation,
    PolicyViolationError,
    PolicyViolationType,
    RewardConfig,
    create_emitter,
    create_governed_env,
    sql_action,
    tool_call_action,
)

from conftest import extra

def _kernel(recorder=None) -> Kernel:
    return Kernel(
        [
            {"type": "sql_safety", "config": {"denied": ["drop", "delete"]}},
            {"type": "tool_policy", "config": {"deny": ["pay"]}},
        ],
        recorder=recorder,
    )


def _sql_agent(task: str):
    """The seed's quick-start agent: checks the SQL, then 'runs' it."""
    agl_rl.check(sql_action(task, "shop"))
    return {"rows": 1, "accuracy": 0.8}


# -- GovernedRunner on its own ------------------------------------------------------------


def test_seed_quick_start_clean_and_blocked():
    kernel = _kernel()
    seen = []
    runner = GovernedRunner(kernel, violation_callback=seen.append)
    runner.init(_sql_agent)
    reward_fn = PolicyReward(kernel, base_reward_fn=lambda r: r.task_output["accuracy"] if r.success else 0.0)

    clean = asyncio.run(runner.step("SELECT name FROM users WHERE id = 42"))
    assert isinstance(clean, GovernedRollout)
    assert clean.success and clean.violations == [] and clean.total_penalty == 0
    assert clean.task_output == {"rows": 1, "accuracy": 0.8}
    assert clean.execution_time_ms > 0
    assert reward_fn(clean) == pytest.approx(0.8 + 5.0)

    bad = asyncio.run(runner.step("DROP TABLE users", mode="eval"))
    assert not bad.success and bad.task_output is None
    assert len(bad.violations) == 1
    v = bad.violations[0]
    assert v.violation_type is PolicyViolationType.BLOCKED and v.action_blocked
    assert v.policy_name == "sql_safety" and v.severity == "critical"
    assert bad.total_penalty == 100.0 and v.penalty == 100.0
    assert bad.mode == "eval" and bad.rollout_id.startswith("step-")
    assert reward_fn(bad) == -100.0
    assert seen == [v]
    stats = runner.get_stats()
    assert stats["total_rollouts"] == 2 and stats["total_violations"] == 1
    assert runner.get_violation_rate() == 0.5


def test_agent_that_recovers_is_still_not_a_success_and_fail_on_violation_aborts():
    kernel = _kernel()

    def careful(task):
        try:
            agl_rl.check(tool_call_action("pay", {"usd": 5}))
        except PolicyViolationError as e:
            assert e.decision is not None and e.decision.verdict == "block"
        agl_rl.check(sql_action("SELECT 1", "shop"))
        return "done"

    runner = GovernedRunner(kernel, log_violations=False)
    runner.init(careful)
    r = asyncio.run(runner.step("t"))
    assert r.task_output == "done" and not r.success and len(r.violations) == 1

    strict = GovernedRunner(kernel, fail_on_violation=True, log_violations=False)
    strict.init(careful)
    r = asyncio.run(strict.step("t"))
    # the first block refuses every later action, so the SELECT raised too and the output is dropped
    assert r.task_output is None and not r.success and len(r.violations) == 1


def test_async_agent_and_concurrent_steps_keep_their_own_violations():
    kernel = _kernel()

    async def agent(task):
        await asyncio.sleep(0.01)
        agl_rl.check(sql_action(task, "shop"))
        await asyncio.sleep(0.01)
        return task

    runner = GovernedRunner(kernel, log_violations=False)
    runner.init(agent)

    async def both():
        return await asyncio.gather(*(runner.step(t) for t in ["SELECT 1", "DELETE FROM t", "SELECT 2", "DROP TABLE t"]))

    out = asyncio.run(both())
    assert [len(r.violations) for r in out] == [0, 1, 0, 1]
    assert [r.success for r in out] == [True, False, True, False]


def test_check_outside_a_step_and_bad_runner_input():
    with pytest.raises(RuntimeError, match="no governed step"):
        agl_rl.check(sql_action("SELECT 1"))
    with pytest.raises(TypeError, match="agl_rl.Kernel"):
        GovernedRunner("standard")
    runner = GovernedRunner(_kernel())
    with pytest.raises(RuntimeError, match="init"):
        asyncio.run(runner.step("SELECT 1"))
    runner.init(lambda t: agl_rl.check({"kind": {"type": "sql", "sql": "SELECT 1", "database": "d"}, "contxt": {}}))
    r = asyncio.run(runner.step("x"))  # the malformed action is the agent's failure
    assert not r.success and r.task_output is None


def test_policy_violation_round_trip_and_custom_penalties():
    v = PolicyViolation(PolicyViolationType.WARNED, "cost", "over budget", "high")
    assert v.penalty == 50.0 and not v.action_blocked
    assert PolicyViolation.from_dict(v.to_dict()) == v
    v2 = PolicyViolation(PolicyViolationType.WARNED, "cost", "x", "low", explicit_penalty=7.0)
    r = GovernedRollout(task_input=None, success=True, violations=[v, v2])
    assert r.total_penalty == 57.0
    # a RewardConfig's table applies to violations without an explicit penalty
    cfg = RewardConfig(high_penalty=-20.0, clean_bonus=0.0, min_reward=None)
    assert PolicyReward(config=cfg)(r) == pytest.approx(1.0 - 20.0 - 7.0)
    assert agl_rl.SEVERITY_PENALTIES == {"critical": 100.0, "high": 50.0, "medium": 10.0, "low": 1.0}


def test_gateway_violation_spans_become_violations():
    spans = [
        {"name": "agentlightning.annotation", "attributes": {"agl.source": "gateway", "agent_os.violation.policy": "pii", "agent_os.violation.severity": "High", "agent_os.violation.reason": "email", "agent_os.violation.blocked": True}},
        {"name": "openai.chat.completion", "attributes": {"agent_os.violation.policy": "ignored"}},
    ]
    out = agl_rl._native.gateway_violations(spans)
    assert len(out) == 1
    v = PolicyViolation.from_dict(out[0])
    assert v.violation_type is PolicyViolationType.BLOCKED and v.severity == "high" and v.policy_name == "pii"
    attrs = agl_rl._native.governance_attributes([v.to_dict()], ["SIGSTOP"], False)
    assert attrs["agent_os.violations"] == 1 and attrs["agent_os.total_penalty"] == 50.0
    assert attrs["agent_os.policies_violated"] == ["pii"] and attrs["agent_os.signals"] == ["SIGSTOP"]
    assert attrs["agl.success"] is False
    with pytest.raises(GovernanceError, match="unknown signal"):
        agl_rl._native.governance_attributes([], ["SIGHUP"], True)


# -- GovernedEnvironment --------------------------------------------------------------------


def test_environment_episode_rewards_termination_and_metrics():
    gym = extra("gymnasium")
    kernel = _kernel()
    env = GovernedEnvironment(
        kernel,
        task_generator=lambda seed: f"task-{seed}",
        config=EnvironmentConfig(max_steps=3),
    )
    assert isinstance(env, gym.Env)
    state, info = env.reset(seed=7)
    assert state == "task-7" and info == {"episode": 1, "kernel_policies": ["sql_safety", "tool_policy"]}
    state, reward, terminated, truncated, info = env.step(sql_action("SELECT 1", "shop"))
    # task reward 1 + step penalty -0.1 + success bonus 10
    assert reward == pytest.approx(10.9) and not terminated and not truncated
    assert info["step"] == 1 and info["success"] and info["violations"] == []
    _, reward, terminated, _, info = env.step(sql_action("DROP TABLE t", "shop"))
    # blocked: task reward 0, -0.1, a critical violation costs -10 × 10
    assert reward == pytest.approx(-100.1) and terminated and env.terminated
    assert info["violations"][0]["policy"] == "sql_safety" and info["violations"][0]["blocked"]
    assert env.last_decision.verdict == "block"
    with pytest.raises(GovernanceError, match="is over"):
        env.step(sql_action("SELECT 1", "shop"))
    env.reset()
    for _ in range(3):
        _, _, terminated, truncated, _ = env.step(tool_call_action("search", {"q": "x"}))
    assert truncated and not terminated
    m = env.get_metrics()
    assert m["total_episodes"] == 2 and m["total_steps"] == 5 and m["total_violations"] == 1
    assert m["successful_episodes"] == 2 and m["success_rate"] == 1.0
    env.close()


def test_environment_reward_fn_python_compat_and_errors():
    kernel = _kernel()
    calls = []

    def reward_fn(state, action, result):
        calls.append((state, action["kind"]["type"], result is None))
        return 0.5

    env = create_governed_env(kernel, max_steps=10, python_compat=True, success_bonus=0.0)
    assert env.config.python_compat and env.config.max_steps == 10
    with pytest.raises(GovernanceError, match="reset"):
        env.step(sql_action("SELECT 1"))
    env2 = GovernedEnvironment(kernel, task_generator=lambda: "s", reward_fn=reward_fn)
    env2.reset()
    _, r, *_ = env2.step(tool_call_action("pay", {}))
    assert calls == [("s", "tool_call", True)]
    assert r == pytest.approx(0.5 - 0.1 - 10.0 * 5)  # a denied tool is a high-severity violation
    with pytest.raises(GovernanceError, match="unknown option `max_step`"):
        create_governed_env(kernel, max_step=3)
    with pytest.raises(GovernanceError, match="max_steps"):
        EnvironmentConfig(max_steps=0)
    with pytest.raises(GovernanceError, match="violation_penalty"):
        EnvironmentConfig(violation_penalty="high")

    def broken(state, action, result):
        raise KeyError("from the user's reward")

    env3 = GovernedEnvironment(kernel, reward_fn=broken)
    env3.reset()
    with pytest.raises(KeyError, match="from the user's reward"):
        env3.step(sql_action("SELECT 1"))
    with pytest.raises((GovernanceError, TypeError)):
        env3.step({"kind": {"type": "sqll"}})
    low = PolicyViolation(PolicyViolationType.WARNED, "p", "d", "low")
    assert EnvironmentConfig().violation_reward(low) == pytest.approx(-1.0)
    assert EnvironmentConfig(python_compat=True).violation_reward(low) == pytest.approx(-10.0)


# -- FlightRecorderEmitter and LightningSpan --------------------------------------------------


def test_emitter_spans_new_spans_summary_and_export(tmp_path):
    rec = FlightRecorder()
    kernel = _kernel(rec)
    kernel.check(sql_action("SELECT 1", "shop"))
    kernel.check(tool_call_action("pay", {"usd": 5}))
    emitter = FlightRecorderEmitter(rec, trace_id_prefix="train")
    spans = emitter.get_spans()
    assert [s.name for s in spans] == ["agent_os.policy_check", "agent_os.policy_check", "agent_os.tool_call"]
    assert spans[1].attributes["agent_os.policy_violated"] is True
    assert spans[1].attributes["agent_os.policy_name"] == "tool_policy"
    assert spans[0].trace_id == "train-unknown"
    assert [s.span_id for s in emitter.get_new_spans()] == ["1", "2", "2.tool"]
    assert emitter.get_new_spans() == []
    kernel.check(sql_action("DELETE FROM t", "shop"))
    assert [s.span_id for s in emitter.get_new_spans()] == ["3"]
    summary = emitter.get_violation_summary()
    assert summary["total_entries"] == 3 and summary["total_violations"] == 2
    assert summary["policies_violated"] == {"tool_policy": 1, "sql_safety": 1}
    out = tmp_path / "audit.json"
    assert emitter.export_to_file(out) == 4
    assert [d["span_id"] for d in json.loads(out.read_text())] == ["1", "2", "2.tool", "3"]
    assert create_emitter(rec, include_tool_calls=False).get_spans()[-1].name == "agent_os.policy_check"
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(GovernanceError):
        emitter.export_to_file(link)


def test_emitter_stream_drains_and_stops():
    rec = FlightRecorder()
    kernel = _kernel(rec)
    emitter = FlightRecorderEmitter(rec, poll_interval=0.01)

    async def go():
        stop = asyncio.Event()
        got = []

        async def consume():
            async for s in emitter.stream(stop):
                got.append(s.span_id)

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.03)
        kernel.check(sql_action("SELECT 1"))
        await asyncio.sleep(0.05)
        kernel.check(sql_action("SELECT 2"))
        stop.set()
        await asyncio.wait_for(task, 5)
        return got

    assert asyncio.run(go()) == ["1", "2"]
    with pytest.raises(GovernanceError, match="poll_interval"):
        FlightRecorderEmitter(rec, poll_interval=0)


def test_lightning_span_seed_form():
    t = datetime(2024, 1, 1, tzinfo=timezone.utc)
    span = LightningSpan(
        span_id="entry-001",
        trace_id="agentos-agent-42",
        name="agent_os.policy_check",
        start_time=t,
        end_time=datetime(2024, 1, 1, 0, 0, 1),
        attributes={"agent_os.policy_violated": True},
        events=[],
    )
    d = span.to_dict()
    assert list(d) == ["span_id", "trace_id", "name", "start_time", "end_time", "attributes", "events"]
    assert d["start_time"] == "2024-01-01T00:00:00+00:00" and d["end_time"] == "2024-01-01T00:00:01+00:00"
    assert json.loads(span.to_json()) == d
    assert span.start_time == t.timestamp()
    with pytest.raises(GovernanceError, match="start_time"):
        LightningSpan("a", "b", "c", "yesterday")
    with pytest.raises(TypeError):
        LightningSpan("a", "b", "c", object())


def test_the_module_works_without_the_optional_packages():
    """agentlightning and gymnasium are optional: with both unimportable, agl_rl imports, the
    runner runs callable agents and the environment is a plain object with the same methods."""
    import subprocess
    import sys

    code = """
import sys
sys.modules["agentlightning"] = None  # makes `import agentlightning` raise ImportError
sys.modules["gymnasium"] = None
import asyncio, agl_rl
from agl_rl import GovernedEnvironment, GovernedRunner, Kernel, sql_action
k = Kernel("standard")
r = GovernedRunner(k, log_violations=False)
r.init(lambda t: agl_rl.check(sql_action(t, "shop")) and "ran")
assert asyncio.run(r.step("SELECT 1")).success
assert not asyncio.run(r.step("DROP TABLE t")).success
try:
    asyncio.run(r.iter())
except RuntimeError as e:
    assert "agentlightning" in str(e)
else:
    raise AssertionError("iter without agentlightning must say what is missing")
env = GovernedEnvironment(k)
assert type(env).__mro__[1] is object
env.reset(seed=1)
assert env.step(sql_action("SELECT 1", "shop"))[4]["success"]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
