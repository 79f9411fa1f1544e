#!/usr/bin/env python3
"""Per-check SQL governance latency from Python: agl (`agl_rl`) vs agentmesh-lightning 5.0.0
with its kernel agent-os-kernel 3.7.0, on the same SQL workload, in one run, plus how many
destructive statements each lets through and how many benign queries each wrongly blocks.

Usage:
    python3 scripts/bench/py_governance_latency.py \\
        --agl-python /var/tmp/pyw-test/bin/python \\
        --agentmesh-python /var/tmp/agentmesh-venv/bin/python \\
        [--rounds N] [--json OUT] [--spider FILE] [--adversarial FILE]

The driver needs only the standard library. It starts one long-lived worker per side (each
venv's python running this same file with `--worker agl|agentmesh`), then runs N rounds; in
each round both workers run the whole workload, one after the other, the order alternating
between rounds (agl first in odd rounds), so both sides see the same machine conditions.
Workers talk to the driver with JSON lines on stdin/stdout.

Workload (the same for both sides, read by each worker from the repository):
  * Spider dev gold queries, `data/spider/dev_gold.sql` (`SQL<TAB>db_id` per line, 1,034
    queries, all benign: should be allowed). Database = db_id, dialect sqlite.
  * Adversarial corpus, `crates/agl-gov/tests/data/adversarial_sql.txt`, parsed exactly like
    `crates/agl-gov/tests/adversarial.rs`: blank lines and lines starting with `#` skipped; an
    optional `mysql:` / `postgres:` / `generic:` / `sqlite:` prefix picks the dialect (default
    sqlite); escapes `\\t \\n \\r \\f \\0 \\\\ \\u{XXXX}` decoded. 207 destructive inputs, all of which
    should be blocked. Database `db`. agentmesh has no dialect notion: it gets the decoded SQL.
  Timed passes run over the distinct (sql, database, dialect) items: 771 with the stock files
  (Spider dev gold has 564 distinct (sql, db_id) pairs among its 1,034 lines), so a
  first-sight pass has no agl cache hit; counts are over every corpus line.

Configurations (exactly what is built):
  agl (`from agl_rl import Kernel, sql_action`), call timed: `kernel.check(action)` with
  `action = sql_action(sql, database, dialect=dialect)` built beforehand:
    agl.standard  Kernel("standard")
    agl.seed      Kernel([{"type": "sql_safety", "config": {"denied": ["drop", "delete"]}},
                          {"type": "cost_control", "config": {"max_cost_usd": 100}}])
                  (the seed quick start's SQLPolicy(deny=[DROP, DELETE]) + CostControlPolicy(100))
    Let through = `decision.executes`.
  agentmesh: the seed's documented quick start (`from agent_os import KernelSpace`,
  `from agent_os.policies import SQLPolicy, CostControlPolicy`, `KernelSpace(policy=[...])`,
  `GovernedRunner(kernel)`, `await runner.step(sql)`) is first tried verbatim in a separate
  probe process and every failure is printed with its exception text. What is benchmarked is
  what exists in agent-os-kernel 3.7.0 (`agent_control_plane`, which `agent_os` re-exports
  KernelSpace from), agent role "bench-agent", coroutines driven to completion without an
  event loop (none of them suspends; an event loop would add its own overhead):
    am.runner     the seed path as far as it runs: GovernedRunner(KernelSpace(policy_engine=
                  PolicyEngine() allowing database_query)), runner.init(agent=async identity),
                  timed `runner.step(sql)`. KernelSpace has no execute()/execute_async(), so
                  the runner calls the agent directly: no SQL check at all.
                  Let through = rollout.success and no blocking violation.
    am.exec       KernelSpace(policy_engine=PolicyEngine() allowing database_query) with tool
                  `database_query` registered (a no-op), timed `kernel.syscall(SyscallRequest(
                  SYS_EXEC, {"tool": "database_query", "args": {"query": sql}}), ctx)`: the
                  kernel's tool-execution choke point, with the tool's arguments under "args"
                  as register_tool documents. Let through = result.success (tool ran).
    am.checkpolicy  KernelSpace(policy_engine=PolicyEngine() allowing database_query and
                  syscall_sys_checkpolicy), timed `kernel.syscall(SyscallRequest(
                  SYS_CHECKPOLICY, {"action": "database_query", "args": {"query": sql}}), ctx)`:
                  the kernel's own SQL check (PolicyEngine.check_violation's destructive-SQL
                  regexes: DROP, DELETE FROM, TRUNCATE, ALTER TABLE..DROP, UPDATE..WHERE 1=1;
                  fixed, not configurable). Closest working equivalent of the seed's kernel.
                  Let through = result.success and return_value["allowed"].
    am.engine     the same check without the kernel: timed `PolicyEngine.check_violation(
                  "bench-agent", "database_query", {"query": sql})`. Let through = None.
    am.cprules    control-plane default rules `create_policies_from_config()` (default
                  SQLPolicyConfig) added to a PolicyEngine, timed `engine.validate_request(
                  ExecutionRequest(DATABASE_QUERY, {"query": sql}))` (rule no_destructive_sql;
                  it needs sqlglot, which the package does not depend on, and fails closed
                  without it). Let through = is_valid.
  No agentmesh configuration has a cost-control equivalent that imports in 3.7.0.
  Logging of both packages goes to a NullHandler (records are still built; nothing printed).

Measurement: `time.perf_counter_ns()` around each single check call, from Python. Per round
and configuration: a fresh kernel (built outside the timing), one "first-sight" pass over
the distinct items (agl: every item a cache miss), then one "repeat" pass over the same items
on the same kernel (agl: cache hits; agentmesh caches nothing). Reported per check in
microseconds: mean, p50, p99 (nearest rank); checks/s = checks / summed check time. Ratios
are agentmesh mean / agl mean (>1: agentmesh slower), per round and over all rounds. The
timer's own overhead (an empty perf_counter_ns pair) is reported per worker. Counts (let
through, wrongly blocked) come from the first-sight pass of round 1; later passes are checked
to agree.

Exit status: 0 on success, 2 for bad input (missing or malformed files, bad python path),
3 when a worker cannot import its package or fails.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SPIDER = REPO / "data" / "spider" / "dev_gold.sql"
DEFAULT_ADVERSARIAL = REPO / "crates" / "agl-gov" / "tests" / "data" / "adversarial_sql.txt"
DIALECTS = ("mysql", "postgres", "generic", "sqlite")
AGENT = "bench-agent"
SEED_SQL = "SELECT name FROM users WHERE id = 42"

AGL_CONFIGS = ["agl.standard", "agl.seed"]
AM_CONFIGS = ["am.runner", "am.exec", "am.checkpolicy", "am.engine", "am.cprules"]
MODES = ["first-sight", "repeat"]


class InputError(Exception):
    """Bad input: reported as one line, exit status 2."""


# ---------------------------------------------------------------------------------------------
# Workload (parsed identically in driver and workers)
# ---------------------------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    """Rust's str::lines(): split on \\n, drop one trailing \\r; no other line breaks."""
    out = text.split("\n")
    if out and out[-1] == "":
        out.pop()
    return [l[:-1] if l.endswith("\r") else l for l in out]


def _decode(s: str, where: str) -> str:
    """adversarial.rs decode(): \\t \\n \\r \\f \\0 \\\\ \\u{XXXX}."""
    out = []
    i, n = 0, len(s)
    simple = {"t": "\t", "n": "\n", "r": "\r", "f": "\x0c", "0": "\0", "\\": "\\"}
    while i < n:
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i >= n:
            raise InputError(f"{where}: backslash at end of line")
        e = s[i]
        i += 1
        if e in simple:
            out.append(simple[e])
        elif e == "u":
            if i >= n or s[i] != "{":
                raise InputError(f"{where}: bad \\u escape (expected '{{')")
            j = s.find("}", i + 1)
            hexdigits = s[i + 1 : j] if j >= 0 else s[i + 1 :]
            try:
                out.append(chr(int(hexdigits, 16)))
            except (ValueError, OverflowError):
                raise InputError(f"{where}: bad \\u{{{hexdigits}}} escape") from None
            i = j + 1 if j >= 0 else n
        else:
            raise InputError(f"{where}: unknown escape \\{e}")
    return "".join(out)


def _read(path: Path, what: str) -> str:
    if not path.is_file():
        raise InputError(f"{what} not found: {path}")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {what} {path}: {e}") from None


def load_workload(spider: Path, adversarial: Path) -> dict:
    """Returns {"spider": [(sql, db)], "adv": [(sql, dialect, raw_line)], "items": distinct
    [(sql, db, dialect)], "spider_idx": [item index], "adv_idx": [item index]}."""
    spider_rows = []
    for no, line in enumerate(_lines(_read(spider, "Spider gold file")), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise InputError(f"{spider}:{no}: expected `SQL<TAB>db_id`, found no tab")
        sql, db = line.rsplit("\t", 1)
        if not sql.strip() or not db.strip():
            raise InputError(f"{spider}:{no}: empty SQL or db_id")
        spider_rows.append((sql, db.strip()))
    adv_rows = []
    for no, line in enumerate(_lines(_read(adversarial, "adversarial corpus")), 1):
        if not line.strip() or line.startswith("#"):
            continue
        dialect, rest = "sqlite", line
        head, sep, tail = line.partition(":")
        if sep and head in DIALECTS:
            dialect, rest = head, tail
        adv_rows.append((_decode(rest, f"{adversarial}:{no}"), dialect, line))
    if not spider_rows:
        raise InputError(f"no queries in {spider}")
    if not adv_rows:
        raise InputError(f"no inputs in {adversarial}")
    items, index = [], {}

    def key(sql, db, dialect):
        k = (sql, db, dialect)
        if k not in index:
            index[k] = len(items)
            items.append(k)
        return index[k]

    spider_idx = [key(sql, db, "sqlite") for sql, db in spider_rows]
    adv_idx = [key(sql, "db", d) for sql, d, _ in adv_rows]
    return {"spider": spider_rows, "adv": adv_rows, "items": items,
            "spider_idx": spider_idx, "adv_idx": adv_idx}


# ---------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------


def _drive(coro):
    """Runs a coroutine that never suspends to completion, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("coroutine suspended; it needs an event loop")


def _timer_overhead_ns() -> float:
    pc = time.perf_counter_ns
    n, tot = 20000, 0
    for _ in range(n):
        t0 = pc()
        t1 = pc()
        tot += t1 - t0
    return tot / n


def _silence_logging():
    import logging
    logging.getLogger().addHandler(logging.NullHandler())  # no lastResort printing to stderr
    logging.captureWarnings(True)


class AglSide:
    configs = AGL_CONFIGS

    def __init__(self, items):
        import agl_rl
        from agl_rl import Kernel, sql_action
        self.Kernel = Kernel
        self.actions = [sql_action(sql, db, dialect=d) for sql, db, d in items]
        try:
            from importlib.metadata import version
            self.versions = {"agl_rl": version("agl_rl")}
        except Exception:  # noqa: BLE001 - version is informational only
            self.versions = {"agl_rl": getattr(agl_rl, "__version__", "?")}
        w = self.make("agl.standard")  # warm-up on statements outside the workload
        for sql in ("SELECT 1", "DROP TABLE warmup"):
            w.check(sql_action(sql, "warmup"))

    def make(self, name):
        if name == "agl.standard":
            return self.Kernel("standard")
        if name == "agl.seed":
            return self.Kernel([
                {"type": "sql_safety", "config": {"denied": ["drop", "delete"]}},
                {"type": "cost_control", "config": {"max_cost_usd": 100}},
            ])
        raise ValueError(name)

    def passes(self, name):
        k = self.make(name)
        check = k.check
        pc = time.perf_counter_ns
        acts = self.actions
        out = []
        for _mode in MODES:
            times, results = [0] * len(acts), [None] * len(acts)
            gc.collect()
            for i, a in enumerate(acts):
                t0 = pc()
                d = check(a)
                t1 = pc()
                times[i] = t1 - t0
                results[i] = d
            out.append((times, [bool(d.executes) for d in results],
                        [d.verdict for d in results]))
        try:
            extra = {"kernel_stats": dict(k.stats())}
        except Exception:  # noqa: BLE001
            extra = {}
        return out, extra


class AgentmeshSide:
    configs = AM_CONFIGS

    def __init__(self, items):
        _silence_logging()
        from datetime import datetime
        from agent_lightning_gov import GovernedRunner
        from agent_control_plane import KernelSpace, PolicyEngine, SyscallRequest, SyscallType
        from agent_control_plane.agent_kernel import ActionType, AgentContext, ExecutionRequest
        from agent_control_plane.policy_engine import create_policies_from_config
        self.GovernedRunner, self.KernelSpace, self.PolicyEngine = GovernedRunner, KernelSpace, PolicyEngine
        self.create_policies_from_config = create_policies_from_config
        sqls = [sql for sql, _db, _d in items]
        self.sqls = sqls
        self.exec_reqs = [SyscallRequest(SyscallType.SYS_EXEC,
                                         {"tool": "database_query", "args": {"query": s}})
                          for s in sqls]
        self.check_reqs = [SyscallRequest(SyscallType.SYS_CHECKPOLICY,
                                          {"action": "database_query", "args": {"query": s}})
                           for s in sqls]
        self.engine_args = [{"query": s} for s in sqls]
        actx = AgentContext(agent_id=AGENT, session_id="bench", created_at=datetime.now())
        self.exec_requests = [ExecutionRequest(request_id=f"r{i}", agent_context=actx,
                                               action_type=ActionType.DATABASE_QUERY,
                                               parameters={"query": s}, timestamp=datetime.now())
                              for i, s in enumerate(sqls)]
        try:
            from importlib.metadata import version
            self.versions = {p: version(p) for p in ("agentmesh-lightning", "agent-os-kernel")}
        except Exception:  # noqa: BLE001
            self.versions = {}
        for name in self.configs:  # warm-up outside the workload
            fn, _ = self.make(name, warm=True)
            fn(0)

    def _engine(self, tools):
        e = self.PolicyEngine()
        e.add_constraint(AGENT, tools)
        return e

    def make(self, name, warm=False):
        """Returns (call(i) -> raw result, let_through(raw) -> bool)."""
        if name == "am.runner":
            k = self.KernelSpace(policy_engine=self._engine(["database_query"]))
            runner = self.GovernedRunner(k)

            async def agent(task):
                return task

            runner.init(agent)
            step, sqls = runner.step, (["SELECT 1"] if warm else self.sqls)
            return (lambda i: _drive(step(sqls[i])),
                    lambda r: bool(r.success) and not any(v.action_blocked for v in r.violations))
        if name in ("am.exec", "am.checkpolicy"):
            tools = ["database_query"] + (["syscall_sys_checkpolicy"] if name == "am.checkpolicy" else [])
            k = self.KernelSpace(policy_engine=self._engine(tools))
            k.register_tool("database_query", lambda query=None: None)
            ctx = k.create_agent_context(AGENT)
            sc = k.syscall
            reqs = self.exec_reqs if name == "am.exec" else self.check_reqs
            if name == "am.exec":
                return (lambda i: _drive(sc(reqs[i], ctx)), lambda r: bool(r.success))
            return (lambda i: _drive(sc(reqs[i], ctx)),
                    lambda r: bool(r.success) and bool((r.return_value or {}).get("allowed")))
        if name == "am.engine":
            cv, args = self._engine(["database_query"]).check_violation, self.engine_args
            return (lambda i: cv(AGENT, "database_query", args[i]), lambda r: r is None)
        if name == "am.cprules":
            e = self.PolicyEngine()
            for rule in self.create_policies_from_config():
                e.add_custom_rule(rule)
            vr, reqs = e.validate_request, self.exec_requests
            return (lambda i: vr(reqs[i]), lambda r: bool(r[0]))
        raise ValueError(name)

    def passes(self, name):
        call, let = self.make(name)
        pc = time.perf_counter_ns
        n = len(self.sqls)
        out = []
        for _mode in MODES:
            times, results = [0] * n, [None] * n
            gc.collect()
            for i in range(n):
                t0 = pc()
                r = call(i)
                t1 = pc()
                times[i] = t1 - t0
                results[i] = r
            lets = [let(r) for r in results]
            out.append((times, lets, ["allow" if x else "block" for x in lets]))
        return out, {}


def seed_probe() -> list[dict]:
    """Runs the seed's quick start verbatim; returns [{step, ok, detail}]."""
    import asyncio
    import logging
    import types
    steps = []

    class Grab(logging.Handler):
        def __init__(self):
            super().__init__()
            self.msgs = []

        def emit(self, record):
            msg = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                e = record.exc_info[1]
                msg += f" [{type(e).__name__}: {e}]"
            self.msgs.append(f"{record.levelname} {record.name}: {msg}")

    grab = Grab()
    logging.getLogger().addHandler(grab)
    logging.getLogger().setLevel(logging.WARNING)

    def t(step, fn):
        try:
            r = fn()
            steps.append({"step": step, "ok": True, "detail": repr(r)[:300]})
            return r
        except BaseException as e:  # noqa: BLE001 - the probe reports every failure
            steps.append({"step": step, "ok": False, "detail": f"{type(e).__name__}: {e}"})
            return None

    def imp(stmt):
        ns: dict = {}
        exec(stmt, ns)  # noqa: S102 - fixed statements from the seed README
        return {k: v for k, v in ns.items() if not k.startswith("__")}

    t("from agent_lightning_gov import GovernedRunner, PolicyReward",
      lambda: imp("from agent_lightning_gov import GovernedRunner, PolicyReward"))
    t("from agent_lightning_gov import PolicyReward, RewardConfig  (README 'PolicyReward')",
      lambda: imp("from agent_lightning_gov import PolicyReward, RewardConfig"))
    t("from agent_os import KernelSpace", lambda: imp("from agent_os import KernelSpace"))
    t("from agent_os.policies import SQLPolicy, CostControlPolicy",
      lambda: imp("from agent_os.policies import SQLPolicy, CostControlPolicy"))
    try:
        import yaml  # noqa: F401
        have_yaml = True
    except ImportError:
        have_yaml = False
    if not have_yaml:
        # Probe only (this process runs no benchmark): with an empty stand-in for the missing
        # `yaml` module, does agent_os.policies have the classes the seed imports?
        sys.modules["yaml"] = types.ModuleType("yaml")
        t("  same import with an empty stand-in `yaml` module (probe only)",
          lambda: imp("from agent_os.policies import SQLPolicy, CostControlPolicy"))
        for m in [m for m in sys.modules if m == "yaml" or m.split(".")[0] == "agent_os"]:
            del sys.modules[m]
    from agent_control_plane import KernelSpace
    t("KernelSpace(policy=[...])  (agent_control_plane.KernelSpace, the class agent_os re-exports)",
      lambda: KernelSpace(policy=[]))
    from agent_lightning_gov import GovernedRunner, PolicyReward
    kernel = KernelSpace()
    t("KernelSpace has execute / execute_async (what GovernedRunner.step calls)",
      lambda: {"execute": hasattr(kernel, "execute"), "execute_async": hasattr(kernel, "execute_async")})
    runner = GovernedRunner(kernel)
    t("PolicyReward(kernel, base_reward_fn=...)", lambda: PolicyReward(kernel, base_reward_fn=lambda r: 0.0))
    before = len(grab.msgs)
    ro = t(f"await runner.step({SEED_SQL!r})  (no runner.init, as in the seed)",
           lambda: asyncio.run(runner.step(SEED_SQL)))
    if ro is not None:
        steps.append({"step": "  -> rollout", "ok": bool(ro.success),
                      "detail": f"success={ro.success} violations={len(ro.violations)}; logged: "
                                + " | ".join(grab.msgs[before:])})

    async def agent(task):
        return task

    runner.init(agent)
    before = len(grab.msgs)
    ro = t("after runner.init(agent): await runner.step('DROP TABLE users')",
           lambda: asyncio.run(runner.step("DROP TABLE users")))
    if ro is not None:
        steps.append({"step": "  -> rollout", "ok": bool(ro.success),
                      "detail": f"success={ro.success} violations={len(ro.violations)} "
                                f"output={ro.task_output!r}; logged: " + " | ".join(grab.msgs[before:])})
    logging.getLogger().removeHandler(grab)
    return steps


def worker_main(side: str, spider: Path, adversarial: Path) -> int:
    proto = sys.stdout
    sys.stdout = sys.stderr  # anything the packages print must not corrupt the protocol

    def send(obj):
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    try:
        wl = load_workload(spider, adversarial)
    except InputError as e:
        send({"error": str(e)})
        return 2
    if side == "agentmesh-probe":
        try:
            send({"probe": seed_probe()})
        except Exception as e:  # noqa: BLE001
            send({"error": f"agentmesh seed probe ({sys.executable}) failed; is agentmesh-lightning "
                           f"5.0.0 with agent-os-kernel 3.7.0 installed there? {type(e).__name__}: {e}"})
            return 3
        return 0
    try:
        impl = AglSide(wl["items"]) if side == "agl" else AgentmeshSide(wl["items"])
    except Exception as e:  # noqa: BLE001 - reported to the driver as a clear message
        pkg = "agl_rl" if side == "agl" else "agentmesh-lightning / agent-os-kernel"
        send({"error": f"{side} worker ({sys.executable}) cannot set up {pkg}: {type(e).__name__}: {e}"})
        return 3
    send({"ready": True, "python": sys.version.split()[0], "versions": impl.versions,
          "items": len(wl["items"]), "timer_overhead_ns": _timer_overhead_ns()})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if not cmd.startswith("round"):
            send({"error": f"unknown command {cmd!r}"})
            continue
        res = {}
        try:
            for name in impl.configs:
                passes, extra = impl.passes(name)
                res[name] = {"passes": [{"ns": t, "let": l, "verdict": v} for t, l, v in passes],
                             **extra}
        except Exception as e:  # noqa: BLE001
            send({"error": f"{side} worker failed in {cmd}: {type(e).__name__}: {e}"})
            return 3
        send({"round": cmd, "results": res})
    return 0


# ---------------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------------


def _stats(ns: list[int]) -> dict:
    s = sorted(ns)
    n = len(s)

    def rank(p):
        return s[max(0, min(n - 1, -(-p * n // 100) - 1))]

    tot = sum(s)
    return {"n": n, "mean_us": tot / n / 1e3, "p50_us": rank(50) / 1e3, "p99_us": rank(99) / 1e3,
            "checks_per_s": n / (tot / 1e9) if tot else float("inf")}


class Worker:
    def __init__(self, side, python, script, spider, adversarial):
        self.side = side
        self.proc = subprocess.Popen(
            [python, "-u", str(script), "--worker", side, "--spider", str(spider),
             "--adversarial", str(adversarial)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            encoding="utf-8", cwd=str(REPO))

    def recv(self):
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read().strip().splitlines()[-5:]
            raise RuntimeError(f"{self.side} worker exited (status {self.proc.wait()}) without an "
                               f"answer; stderr tail: {' / '.join(err) or '(empty)'}")
        msg = json.loads(line)
        if "error" in msg:
            raise RuntimeError(msg["error"])
        return msg

    def ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.recv()

    def close(self):
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001
            self.proc.kill()
            self.proc.wait()


def _check_python(path: str, flag: str) -> str:
    p = Path(path)
    if not p.exists():
        raise InputError(f"{flag}: {path} does not exist")
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise InputError(f"{flag}: {path} is not an executable file")
    return str(p)


def _fmt(x, w=9, d=2):
    return f"{x:{w}.{d}f}"


def driver_main(args) -> int:
    agl_py = _check_python(args.agl_python, "--agl-python")
    am_py = _check_python(args.agentmesh_python, "--agentmesh-python")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise InputError(f"--json: directory of {args.json} does not exist")
    wl = load_workload(args.spider, args.adversarial)
    n_sp, n_adv = len(wl["spider"]), len(wl["adv"])
    script = Path(__file__).resolve()
    print(f"# py_governance_latency: {n_sp} Spider gold queries ({args.spider}), {n_adv} adversarial "
          f"inputs ({args.adversarial}); {len(wl['items'])} distinct items timed per pass; "
          f"{args.rounds} round(s)")

    probe = Worker("agentmesh-probe", am_py, script, args.spider, args.adversarial)
    try:
        probe_steps = probe.recv()["probe"]
    finally:
        probe.close()
    print("\n## agentmesh seed quick start, run verbatim (separate process)")
    for s in probe_steps:
        print(f"  [{'ok' if s['ok'] else 'FAIL'}] {s['step']}\n         {s['detail']}")

    workers = {}
    try:
        workers["agl"] = Worker("agl", agl_py, script, args.spider, args.adversarial)
        workers["agentmesh"] = Worker("agentmesh", am_py, script, args.spider, args.adversarial)
        ready = {side: w.recv() for side, w in workers.items()}
        print("\n## workers", flush=True)
        for side, r in ready.items():
            print(f"  {side:9s} python {r['python']} {r['versions']} timer overhead "
                  f"{r['timer_overhead_ns']:.0f} ns/pair (included in every number below)")
        rounds = []  # [{config: {"passes": [...]}}]
        for r in range(1, args.rounds + 1):
            order = ["agl", "agentmesh"] if r % 2 == 1 else ["agentmesh", "agl"]
            res = {}
            for side in order:
                t0 = time.monotonic()
                res.update(workers[side].ask(f"round {r}")["results"])
                print(f"  round {r}: {side} done in {time.monotonic() - t0:.1f} s", flush=True)
            rounds.append(res)
    finally:
        for w in workers.values():
            w.close()

    configs = AGL_CONFIGS + AM_CONFIGS
    # Correctness counts: round 1 first-sight; every other pass must agree.
    counts, disagreements = {}, []
    for c in configs:
        let = rounds[0][c]["passes"][0]["let"]
        adv_through = [wl["adv"][j][2] for j, i in enumerate(wl["adv_idx"]) if let[i]]
        sp_blocked = [j + 1 for j, i in enumerate(wl["spider_idx"]) if not let[i]]
        counts[c] = {"adversarial_let_through": len(adv_through), "adversarial_total": n_adv,
                     "spider_blocked": len(sp_blocked), "spider_total": n_sp,
                     "adversarial_let_through_lines": adv_through,
                     "spider_blocked_line_numbers": sp_blocked}
        for ri, rr in enumerate(rounds):
            for pi, p in enumerate(rr[c]["passes"]):
                if p["let"] != let:
                    disagreements.append(f"{c} round {ri + 1} {MODES[pi]}")
    print("\n## decisions (round 1, first-sight)")
    print(f"  {'config':16s} {'adversarial let through':>24s} {'Spider gold blocked':>20s}")
    for c in configs:
        k = counts[c]
        print(f"  {c:16s} {k['adversarial_let_through']:>14d} / {n_adv:<7d} "
              f"{k['spider_blocked']:>10d} / {n_sp}")
    if disagreements:
        print(f"  WARNING: decisions changed between passes: {', '.join(disagreements)}")
    for c in ("agl.standard", "agl.seed", "am.checkpolicy"):
        ex = counts[c]["adversarial_let_through_lines"][:4]
        if ex:
            print(f"  e.g. {c} lets through: " + "; ".join(repr(x) for x in ex))

    # Latency table.
    summary = {}
    print("\n## latency per check, microseconds (mean per round, then pooled over rounds)")
    rh = " ".join(f"{'r' + str(i + 1) + ' mean':>9s}" for i in range(len(rounds)))
    print(f"  {'config':16s} {'mode':11s} {rh} {'mean':>9s} {'p50':>9s} {'p99':>9s} {'checks/s':>11s}")
    for c in configs:
        for pi, m in enumerate(MODES):
            per_round = [_stats(rr[c]["passes"][pi]["ns"]) for rr in rounds]
            pooled = _stats([x for rr in rounds for x in rr[c]["passes"][pi]["ns"]])
            summary[f"{c}/{m}"] = {"per_round": per_round, "pooled": pooled}
            cols = " ".join(_fmt(s["mean_us"]) for s in per_round)
            print(f"  {c:16s} {m:11s} {cols} {_fmt(pooled['mean_us'])} {_fmt(pooled['p50_us'])} "
                  f"{_fmt(pooled['p99_us'])} {pooled['checks_per_s']:>11,.0f}")

    ratios = {}
    print("\n## ratio of means, agentmesh / agl (>1: agentmesh slower); per round, then pooled")
    print("   am.checkpolicy vs agl.seed is the like-for-like pair (the seed's kernel vs its agl twin)")
    for base in AGL_CONFIGS:
        for m in MODES:
            print(f"  vs {base} {m}:")
            for c in AM_CONFIGS:
                a, b = summary[f"{c}/{m}"], summary[f"{base}/{m}"]
                pr = [x["mean_us"] / y["mean_us"] for x, y in zip(a["per_round"], b["per_round"])]
                pooled = a["pooled"]["mean_us"] / b["pooled"]["mean_us"]
                ratios[f"{c}/{base}/{m}"] = {"per_round": pr, "pooled": pooled}
                print(f"    {c:16s} " + " ".join(f"{x:8.1f}x" for x in pr) + f"   pooled {pooled:8.1f}x")

    if args.json:
        out = {"workload": {"spider": str(args.spider), "adversarial": str(args.adversarial),
                            "spider_queries": n_sp, "adversarial_inputs": n_adv,
                            "distinct_items": len(wl["items"])},
               "rounds": len(rounds), "workers": ready, "seed_probe": probe_steps,
               "counts": counts, "decision_disagreements": disagreements,
               "latency_us": summary, "ratios_agentmesh_over_agl": ratios,
               "agl_kernel_stats_last_round": {c: rounds[-1][c].get("kernel_stats") for c in AGL_CONFIGS}}
        try:
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
        except OSError as e:
            raise InputError(f"--json: cannot write {args.json}: {e}") from None
        print(f"\n# wrote {args.json}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agl-python", help="python of the venv with agl_rl installed")
    ap.add_argument("--agentmesh-python",
                    help="python of the venv with agentmesh-lightning 5.0.0 + agent-os-kernel 3.7.0")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--json", help="also write every number (and the let-through lines) here")
    ap.add_argument("--spider", type=Path, default=DEFAULT_SPIDER, help=f"default {DEFAULT_SPIDER}")
    ap.add_argument("--adversarial", type=Path, default=DEFAULT_ADVERSARIAL,
                    help=f"default {DEFAULT_ADVERSARIAL}")
    ap.add_argument("--worker", choices=["agl", "agentmesh", "agentmesh-probe"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.spider, args.adversarial)
    if not args.agl_python or not args.agentmesh_python:
        ap.error("--agl-python and --agentmesh-python are both required")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    try:
        return driver_main(args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
