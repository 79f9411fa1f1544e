"""agl_rl from Python: the kernel, decisions, the flight recorder and reward shaping, against
the installed wheel (scripts/ci/python_wheel.sh runs these in a fresh venv)."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

import agl_rl
from agl_rl import (
    CompositeReward,
    FlightRecorder,
    GovernanceError,
    Kernel,
    PolicyReward,
    RecorderError,
    RewardConfig,
    create_policy_reward,
    policy_penalty,
    sql_action,
    tool_call_action,
)


def test_presets_and_default_kernel():
    assert agl_rl.presets() == ["strict", "standard", "permissive"]
    k = Kernel()
    assert k.origin == "preset:standard"
    assert k.mode == "enforce"
    assert k.policy_names[0] == "sql_safety"


def test_check_blocks_a_drop_and_allows_a_select():
    k = Kernel("standard")
    d = k.check(sql_action("DROP TABLE singer", "concert_singer"))
    assert d.verdict == "block"
    assert not d.executes
    assert d.is_violation
    assert d.violations[0]["policy"] == "sql_safety"
    assert d.violations[0]["effect"] == "block"
    assert d.max_severity in ("high", "critical")
    assert d.to_dict()["verdict"] == "block"
    ok = k.check(sql_action("SELECT name FROM singer", "concert_singer"))
    assert ok.verdict == "allow" and ok.executes and ok.violations == []
    assert k.stats()["checks"] == 2


def test_comment_tricks_and_stacked_statements_are_blocked():
    k = Kernel("standard")
    for sql in ["SELECT 1; DROP TABLE t", "DR/**/OP TABLE t", "SELECT 1 /*! ; DROP TABLE t */"]:
        assert k.check(sql_action(sql)).verdict == "block", sql


def test_audit_mode_records_but_lets_it_run():
    k = Kernel("standard", mode="audit")
    d = k.check(sql_action("DELETE FROM singer"))
    assert d.mode == "audit"
    assert d.verdict == "warn"
    assert d.executes and d.is_violation


def test_tool_policy_and_pii_redaction():
    k = Kernel("standard")
    assert k.check(tool_call_action("shell", {"cmd": "rm -rf /"})).verdict == "block"
    d = k.check({"kind": {"type": "output", "text": "mail me at jane@example.com"}})
    assert d.verdict == "modify"
    assert "jane@example.com" not in json.dumps(d.rewritten)


def test_kernel_from_dict_list_and_yaml():
    k = Kernel([{"type": "sql_safety", "config": {"denied": ["drop"]}}])
    assert k.origin == "<dict>"
    assert k.check(sql_action("DROP TABLE t")).verdict == "block"
    assert k.check(sql_action("DELETE FROM t WHERE id = 1")).verdict == "allow"
    y = Kernel.from_yaml("version: 1\npolicies:\n  - type: tool_policy\n    config: {deny: [pay]}\n")
    assert y.check(tool_call_action("pay", {"usd": 5})).verdict == "block"


def test_bad_policies_raise_clear_errors(tmp_path: Path):
    with pytest.raises(GovernanceError, match=r"<dict>.*policies\[0\]\.config.*max_statementz"):
        Kernel({"version": 1, "policies": [{"type": "sql_safety", "config": {"max_statementz": 1}}]})
    with pytest.raises(GovernanceError, match="not a preset"):
        Kernel("no-such-preset")
    with pytest.raises(GovernanceError, match="cannot read policy file"):
        Kernel(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\npolicies:\n  - type: sql_safety\n    config:\n      max_statements: ten\n")
    with pytest.raises(GovernanceError, match=r"bad\.yaml:5:.*max_statements"):
        Kernel(bad)
    with pytest.raises(GovernanceError, match="unknown governance mode"):
        Kernel("standard", mode="shadow")
    with pytest.raises(TypeError):
        Kernel(42)
    assert isinstance(GovernanceError("x"), ValueError)


def test_bad_actions_raise_clear_errors():
    k = Kernel()
    with pytest.raises(GovernanceError, match="context.rolout_id: unknown field `rolout_id`"):
        k.check({"kind": {"type": "sql", "database": "d", "sql": "SELECT 1"}, "context": {"rolout_id": "r"}})
    with pytest.raises(GovernanceError, match="kind.*unknown field `databse`"):
        k.check({"kind": {"type": "sql", "database": "d", "databse": "e", "sql": "SELECT 1"}})
    with pytest.raises(GovernanceError, match="action"):
        k.check({"kind": {"type": "teleport"}})
    with pytest.raises(GovernanceError, match="unknown field `knd`"):
        k.check({"knd": {}})
    with pytest.raises(TypeError):
        k.check("DROP TABLE t")


def test_checks_from_threads():
    k = Kernel()
    errors = []

    def work():
        try:
            for i in range(200):
                v = k.check(sql_action(f"SELECT * FROM t WHERE id = {i}")).verdict
                assert v == "allow", v
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert k.stats()["checks"] == 800


def test_flight_recorder_chain_verifies_and_shows_tampering(tmp_path: Path):
    db = tmp_path / "audit" / "audit.db"
    rec = FlightRecorder(db)
    k = Kernel("standard", recorder=rec)
    assert k.recorder is not None
    k.check(sql_action("SELECT 1"))
    k.check(sql_action("DROP TABLE t"))
    k.check(tool_call_action("shell", {}))
    rec.flush()
    assert rec.entries == 3
    assert len(rec.head_hash) == 64
    s = rec.summary()
    assert s["entries"] == 3 and s["violations"] == 2
    assert s["by_verdict"]["block"] == 2
    assert [e["seq"] for e in rec.entries_list()] == [1, 2, 3]
    report = agl_rl.verify(db)
    assert report["ok"] and report["entries"] == 3 and report["first_broken"] is None
    assert rec.verify()["ok"]
    del k, rec

    con = sqlite3.connect(db)
    con.execute("UPDATE entries SET verdict = 'allow' WHERE seq = 2")
    con.commit()
    con.close()
    broken = agl_rl.verify(db)
    assert not broken["ok"]
    assert broken["first_broken"]["seq"] == 2
    with pytest.raises(RecorderError, match="does not verify"):
        FlightRecorder(db)


def test_recorder_errors(tmp_path: Path):
    not_db = tmp_path / "x.db"
    not_db.write_text("hello")
    with pytest.raises(RecorderError):
        FlightRecorder(not_db)
    with pytest.raises(RecorderError):
        agl_rl.verify(tmp_path / "missing.db")
    short = tmp_path / "key"
    short.write_bytes(b"short")
    with pytest.raises(RecorderError, match="at least 16"):
        FlightRecorder(tmp_path / "k.db", key_file=short)
    key = tmp_path / "key2"
    key.write_bytes(b"0123456789abcdef0123")
    keyed = FlightRecorder(tmp_path / "k.db", key_file=key)
    assert keyed.keyed
    assert isinstance(RecorderError("x"), OSError)


def test_reward_config_defaults_are_the_seeds():
    c = RewardConfig()
    assert (c.critical_penalty, c.high_penalty, c.medium_penalty, c.low_penalty) == (-100.0, -50.0, -10.0, -1.0)
    assert (c.clean_bonus, c.multiplicative, c.multiplicative_factor) == (5.0, False, 0.5)
    assert (c.min_reward, c.max_reward, c.python_compat) == (-100.0, 100.0, False)
    assert RewardConfig(clean_bonus=10.0).clean_bonus == 10.0
    assert RewardConfig(min_reward=None).min_reward is None
    assert RewardConfig() == RewardConfig()
    with pytest.raises(GovernanceError, match="clean_bonos"):
        RewardConfig(clean_bonos=1.0)
    with pytest.raises(GovernanceError, match="multiplicative_factor"):
        RewardConfig(multiplicative_factor=2.0)
    with pytest.raises(GovernanceError, match="min_reward"):
        RewardConfig(min_reward=5.0, max_reward=1.0)


def rollout(success: bool, *severities: str, penalty=None):
    return {"success": success, "violations": [{"severity": s, "penalty": penalty} for s in severities]}


def test_policy_reward_arithmetic_and_stats():
    r = PolicyReward(Kernel())
    assert r(rollout(True)) == 6.0  # 1 + clean bonus 5
    assert r(rollout(True, "high")) == -49.0
    assert r(rollout(True, "critical", "critical")) == -100.0  # clamped from -199
    assert r.score(rollout(True, "critical", "critical"))["unclamped"] == -199.0
    assert r(rollout(False)) == 0.0  # agl: no clean bonus for a failed rollout
    stats = r.get_stats()
    assert stats["total_rewards"] == 5
    assert stats["violation_rate"] == pytest.approx(3 / 5)
    r.reset_stats()
    assert r.get_stats()["total_rewards"] == 0
    assert PolicyReward(config=RewardConfig(python_compat=True))(rollout(False)) == 5.0
    mult = PolicyReward(config=RewardConfig(multiplicative=True), base_reward_fn=lambda ro: 0.9)
    assert mult(rollout(True, "low")) == pytest.approx(0.45)
    assert PolicyReward(shaped=False)(rollout(True, "critical")) == 1.0
    assert r(rollout(True, "low", penalty=7.0)) == -6.0  # explicit penalty replaces the table's


def test_policy_reward_reads_objects_and_enums():
    import enum

    class Sev(enum.Enum):
        HIGH = "high"

    class V:
        severity = Sev.HIGH
        penalty = None

    class R:
        success = True
        violations = [V()]
        task_output = {"accuracy": 0.5}

    r = PolicyReward(base_reward_fn=lambda ro: ro.task_output["accuracy"])
    assert r(R()) == -49.5
    plain = PolicyReward()
    with pytest.raises(GovernanceError, match="severity"):
        plain({"success": True, "violations": [{"severity": "apocalyptic"}]})
    with pytest.raises(GovernanceError, match="success"):
        plain({"violations": []})


def test_policy_penalty_and_factory_and_composite():
    vs = [{"severity": "critical"}, {"severity": "low"}]
    assert policy_penalty(vs) == -101.0
    assert policy_penalty(vs, critical_penalty=-200.0, low_penalty=-2.0) == -202.0
    f = create_policy_reward(severity_penalties={"critical": -200.0}, clean_bonus=10.0)
    assert f.config.critical_penalty == -200.0 and f.config.clean_bonus == 10.0
    c = CompositeReward([(lambda ro: 1.0, 1.0), (lambda ro: 0.0, 3.0)], normalize=True)
    assert c.weights == [0.25, 0.75]
    assert c({"success": True}) == 0.25
    with pytest.raises(GovernanceError, match="at least one component"):
        CompositeReward([])
