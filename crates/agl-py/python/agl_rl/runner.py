"""``GovernedRunner``: runs an agent with every action it asks about checked by agl's kernel, and
reports ``GovernedRollout``s (the seed's ``agent_lightning_gov.runner``, on agl's kernel).

Two ways to run, one class:

* **On its own** (the seed's quick start): ``runner.init(agent)`` with a callable
  ``agent(task_input)`` (sync or async), then ``rollout = await runner.step(task_input,
  mode="train")``.
* **Inside Agent Lightning** (agentlightning 0.3, optional): when ``agentlightning`` is
  installed, ``GovernedRunner`` is a subclass of its ``LitAgentRunner``, so
  ``Trainer(runner=GovernedRunner(kernel, reward_fn=PolicyReward(...)), ...)`` runs a
  ``LitAgent``/``@rollout`` agent under governance with no change to the agent. After each
  rollout the runner reads the violations agl's LLM gateway recorded for the attempt (``agl
  store --llm-upstream``), adds the violations of the agent's own ``check()`` calls, and stores
  one governance annotation span and, with a ``reward_fn``, the shaped reward as the rollout's
  last reward span: the reward the algorithm trains on.

An agent asks before each action with ``agl_rl.check(action)`` (or ``runner.check(action)``): the
kernel's ``Decision`` comes back; a blocked action raises ``PolicyViolationError`` and must not
run. An uncaught ``PolicyViolationError`` ends the rollout as unsuccessful, not failed: its
penalty is a training signal.

Deliberate differences from agentmesh-lightning (as agl's Rust ``GovernedRunner``): violations
are those of the step's own checks, never ambient kernel history; a rollout with a blocked
action is never a success; ``fail_on_violation`` refuses every later action of the rollout
(``PolicyViolationError``) and drops its output instead of raising out of the runner; ``step``
needs an agent (the seed's mock kernel "executes" the input itself); statistics are per runner
object (per process under Agent Lightning's multi-process strategy); with no ``agentlightning``
installed, ``iter`` is unavailable.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any, Awaitable, Callable, Dict, List, Optional, Union

from . import _native
from ._native import Decision, Kernel, PolicyReward

logger = logging.getLogger("agl_rl.runner")

SEVERITY_PENALTIES: Dict[str, float] = dict(_native.severity_penalties())
"""The penalty magnitude (reward units) of a violation without an explicit penalty: critical
100, high 50, medium 10, low 1 (the one table agl's reward and environment use too)."""


class PolicyViolationType(str, Enum):
    """What happened to the action that violated a policy."""

    BLOCKED = "blocked"
    MODIFIED = "modified"
    WARNED = "warned"
    SIGNAL_SENT = "signal_sent"


@dataclass
class PolicyViolation:
    """One policy violation of a step. ``severity``: ``"low"``, ``"medium"``, ``"high"`` or
    ``"critical"``. ``explicit_penalty``: the policy's own penalty magnitude, else ``None``;
    ``penalty`` (read-only) is it or the ``SEVERITY_PENALTIES`` value."""

    violation_type: PolicyViolationType
    policy_name: str
    description: str
    severity: str
    timestamp: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    action_blocked: bool = False
    explicit_penalty: Optional[float] = None

    @property
    def penalty(self) -> float:
        if self.explicit_penalty is not None:
            return float(self.explicit_penalty)
        try:
            return SEVERITY_PENALTIES[str(getattr(self.severity, "value", self.severity)).lower()]
        except KeyError:
            raise ValueError(
                f"violation severity must be low, medium, high or critical, not {self.severity!r}"
            ) from None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "PolicyViolation":
        """From the JSON form (``violation_type``, ``policy_name``, ``description``,
        ``severity``, ``timestamp`` as ISO-8601, ``action_blocked``, ``penalty`` or ``None``)."""
        ts = d.get("timestamp")
        return cls(
            violation_type=PolicyViolationType(d["violation_type"]),
            policy_name=d["policy_name"],
            description=d["description"],
            severity=d["severity"],
            timestamp=datetime.fromisoformat(ts.replace("Z", "+00:00")) if isinstance(ts, str) else (ts or datetime.now(timezone.utc)),
            action_blocked=bool(d.get("action_blocked", False)),
            explicit_penalty=d.get("penalty"),
        )

    def to_dict(self) -> Dict[str, Any]:
        """The JSON form (see ``from_dict``)."""
        ts = self.timestamp if self.timestamp.tzinfo else self.timestamp.replace(tzinfo=timezone.utc)
        return {
            "violation_type": PolicyViolationType(self.violation_type).value,
            "policy_name": self.policy_name,
            "description": self.description,
            "severity": str(getattr(self.severity, "value", self.severity)).lower(),
            "timestamp": ts.isoformat(),
            "action_blocked": self.action_blocked,
            "penalty": self.explicit_penalty,
        }


class PolicyViolationError(Exception):
    """An action was blocked (``violation``: the first blocking violation; ``decision``: the
    kernel's ``Decision``, ``None`` for an action refused after ``fail_on_violation``)."""

    def __init__(self, violation: PolicyViolation, decision: Optional[Decision] = None) -> None:
        super().__init__(f"Policy violation: {violation.description}")
        self.violation = violation
        self.decision = decision


@dataclass
class GovernedRollout:
    """The result of one governed step. ``execution_time_ms``: wall time in milliseconds;
    ``total_penalty``: the sum of the violations' penalty magnitudes, derived on every read."""

    task_input: Any
    task_output: Any = None
    success: bool = False
    violations: List[PolicyViolation] = field(default_factory=list)
    signals_sent: List[str] = field(default_factory=list)
    execution_time_ms: float = 0.0
    mode: Optional[str] = None
    rollout_id: Optional[str] = None
    attempt_id: Optional[str] = None

    @property
    def total_penalty(self) -> float:
        return sum(v.penalty for v in self.violations)

    @property
    def blocked(self) -> bool:
        """Whether any action of the step was blocked."""
        return any(v.action_blocked for v in self.violations)


class _Step:
    """The governance state of the step running in this context."""

    def __init__(self, runner: "GovernedRunner", rollout_id: str, attempt_id: Optional[str], mode: Optional[str]):
        self.runner = runner
        self.rollout_id = rollout_id
        self.attempt_id = attempt_id
        self.mode = mode
        self.checks = 0
        self.violations: List[PolicyViolation] = []
        self.signals: List[str] = []
        self.aborted: Optional[PolicyViolation] = None
        self.started = time.perf_counter()


_current: contextvars.ContextVar[Optional[_Step]] = contextvars.ContextVar("agl_rl_step", default=None)


def check(action: Dict[str, Any]) -> Decision:
    """Checks ``action`` (a kernel action dict, see ``agl_rl.sql_action`` and friends) for the
    governed step running in this context, and returns the kernel's ``Decision``. The action's
    ``context`` gets the step's rollout id, attempt id and 0-based check index unless set.
    Raises ``PolicyViolationError`` when the action is blocked (do not run it), and
    ``RuntimeError`` outside a step of a ``GovernedRunner``."""
    step = _current.get()
    if step is None:
        raise RuntimeError(
            "agl_rl.check: no governed step is running here; call it from an agent that a GovernedRunner runs"
        )
    return step.runner._check(step, action)


def _report(runner: "GovernedRunner", v: PolicyViolation) -> None:
    if runner.log_violations:
        logger.warning(
            "Policy violation: %s - %s (severity=%s, blocked=%s)",
            v.policy_name,
            v.description,
            v.severity,
            v.action_blocked,
        )
    if runner.violation_callback is not None:
        runner.violation_callback(v)


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rollouts = 0
        self.violations = 0
        self.violating = 0

    def add(self, rollout: GovernedRollout) -> None:
        with self.lock:
            self.rollouts += 1
            self.violations += len(rollout.violations)
            self.violating += 1 if rollout.violations else 0


class _GovernedCore:
    """What every GovernedRunner has, with or without Agent Lightning."""

    def _setup(
        self,
        kernel: Kernel,
        fail_on_violation: bool,
        log_violations: bool,
        violation_callback: Optional[Callable[[PolicyViolation], Any]],
        reward_fn: Optional[PolicyReward],
    ) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"GovernedRunner needs an agl_rl.Kernel, got {type(kernel).__name__}")
        if reward_fn is not None and not isinstance(reward_fn, PolicyReward):
            raise TypeError(f"reward_fn must be an agl_rl.PolicyReward, got {type(reward_fn).__name__}")
        if violation_callback is not None and not callable(violation_callback):
            raise TypeError("violation_callback must be callable")
        self.kernel = kernel
        self.fail_on_violation = bool(fail_on_violation)
        self.log_violations = bool(log_violations)
        self.violation_callback = violation_callback
        self.reward_fn = reward_fn
        self._counters = _Counters()
        self._callable_agent: Optional[Callable[[Any], Any]] = None

    # -- checks ---------------------------------------------------------------------------
    def check(self, action: Dict[str, Any]) -> Decision:
        """``agl_rl.check(action)`` for a step of this runner."""
        step = _current.get()
        if step is None or step.runner is not self:
            raise RuntimeError("GovernedRunner.check: no step of this runner is running here")
        return self._check(step, action)

    def _check(self, step: _Step, action: Dict[str, Any]) -> Decision:
        if not isinstance(action, dict):
            raise TypeError("action must be a dict like agl_rl.sql_action(database, sql)")
        if step.aborted is not None:
            raise PolicyViolationError(step.aborted, None)
        action = dict(action)
        ctx = dict(action.get("context") or {})
        ctx.setdefault("rollout_id", step.rollout_id)
        if step.attempt_id is not None:
            ctx.setdefault("attempt_id", step.attempt_id)
        ctx.setdefault("step", step.checks)
        action["context"] = ctx
        step.checks += 1
        decision = self.kernel.check(action)
        found = [PolicyViolation.from_dict(d) for d in _native.decision_violations(decision)]
        step.violations.extend(found)
        step.signals.extend(decision.signals)
        for v in found:
            _report(self, v)
        if not decision.executes:
            blocking = next((v for v in found if v.action_blocked), found[0] if found else None)
            if blocking is None:  # a block without a finding cannot happen; stay fail-closed
                blocking = PolicyViolation(PolicyViolationType.BLOCKED, "kernel", "blocked", "critical", action_blocked=True)
            if self.fail_on_violation:
                step.aborted = blocking
            raise PolicyViolationError(blocking, decision)
        return decision

    # -- statistics -----------------------------------------------------------------------
    def get_stats(self) -> Dict[str, Union[int, float]]:
        """``total_rollouts``, ``total_violations``, ``violation_rate`` (violations per
        rollout, the seed's meaning), ``violating_rollouts``, ``violating_rollout_fraction``,
        over the rollouts this runner object reported."""
        c = self._counters
        with c.lock:
            n = max(c.rollouts, 1)
            return {
                "total_rollouts": c.rollouts,
                "total_violations": c.violations,
                "violation_rate": c.violations / n,
                "violating_rollouts": c.violating,
                "violating_rollout_fraction": c.violating / n,
            }

    def get_violation_rate(self) -> float:
        """``get_stats()["violation_rate"]``."""
        return float(self.get_stats()["violation_rate"])

    # -- the seed's standalone step ---------------------------------------------------------
    async def step(self, input: Any, *, mode: Optional[str] = "train", resources: Any = None, event: Any = None) -> GovernedRollout:  # noqa: A002
        """Runs the agent given to ``init`` on ``input`` as one governed step and returns its
        ``GovernedRollout`` (the agent's exceptions other than ``PolicyViolationError`` are
        logged and give an unsuccessful rollout without output). Raises ``RuntimeError``
        without an agent."""
        agent = self._callable_agent
        if agent is None:
            raise RuntimeError("GovernedRunner.step: call init(agent) with a callable agent(task_input) first")
        st = _Step(self, f"step-{uuid.uuid4().hex[:12]}", None, mode)
        token = _current.set(st)
        output: Any = None
        returned = False
        try:
            out = agent(input)
            if inspect.isawaitable(out):
                out = await out
            output, returned = out, True
        except PolicyViolationError:
            pass
        except Exception:  # the agent's own failure: an unsuccessful rollout, as in Rust
            logger.warning("GovernedRunner.step: the agent raised", exc_info=True)
        finally:
            _current.reset(token)
            self.kernel.end_rollout(st.rollout_id)
        rollout = self._finish(st, input, output if returned and st.aborted is None else None, returned)
        return rollout

    def _finish(self, st: _Step, task_input: Any, output: Any, returned: bool) -> GovernedRollout:
        success = returned and st.aborted is None and not any(v.action_blocked for v in st.violations)
        rollout = GovernedRollout(
            task_input=task_input,
            task_output=output,
            success=success,
            violations=list(st.violations),
            signals_sent=list(st.signals),
            execution_time_ms=(time.perf_counter() - st.started) * 1000.0,
            mode=st.mode,
            rollout_id=st.rollout_id,
            attempt_id=st.attempt_id,
        )
        self._counters.add(rollout)
        return rollout

    def _log_totals(self) -> None:
        s = self.get_stats()
        logger.info(
            "GovernedRunner: %d rollouts, %d violations (%.3f per rollout)",
            s["total_rollouts"],
            s["total_violations"],
            s["violation_rate"],
        )


_BLOCKED = object()


def _agentlightning():
    try:
        import agentlightning  # noqa: F401
        from agentlightning.runner import LitAgentRunner
    except ImportError:
        return None
    return LitAgentRunner


_LitAgentRunner = _agentlightning()


if _LitAgentRunner is None:

    class GovernedRunner(_GovernedCore):
        """``GovernedRunner(kernel, fail_on_violation=False, log_violations=True,
        violation_callback=None, *, reward_fn=None)`` (see the module docs). Without
        ``agentlightning`` installed it runs callable agents with ``step``."""

        def __init__(
            self,
            kernel: Kernel,
            fail_on_violation: bool = False,
            log_violations: bool = True,
            violation_callback: Optional[Callable[[PolicyViolation], Any]] = None,
            *,
            reward_fn: Optional[PolicyReward] = None,
        ) -> None:
            self._setup(kernel, fail_on_violation, log_violations, violation_callback, reward_fn)
            self.worker_id: Optional[int] = None
            self.store: Any = None

        def init(self, agent: Callable[[Any], Any], **kwargs: Any) -> None:
            if not callable(agent):
                raise TypeError("GovernedRunner.init: agent must be callable (install agentlightning for LitAgent agents)")
            self._callable_agent = agent

        def init_worker(self, worker_id: int, store: Any = None, **kwargs: Any) -> None:
            self.worker_id, self.store = worker_id, store

        def teardown_worker(self, worker_id: int, *args: Any, **kwargs: Any) -> None:
            self.worker_id, self.store = None, None

        def teardown(self, *args: Any, **kwargs: Any) -> None:
            self._log_totals()
            self._callable_agent = None

        async def iter(self, *, event: Any = None) -> None:
            raise RuntimeError("GovernedRunner.iter serves an Agent Lightning store: pip install 'agentlightning==0.3.0'")

else:
    from agentlightning.emitter.reward import find_final_reward
    from agentlightning.litagent import LitAgent
    from agentlightning.types import Span, TraceStatus

    class _GuardedAgent:
        """The runner's view of a LitAgent: a blocked action that escapes the agent ends its
        rollout (unsuccessful, penalised) instead of failing the attempt."""

        def __init__(self, agent: Any) -> None:
            self._agent = agent

        def __getattr__(self, name: str) -> Any:
            return getattr(self._agent, name)

        def is_async(self) -> bool:
            return self._agent.is_async()

        def training_rollout(self, *a: Any, **k: Any) -> Any:
            return _guard(lambda: self._agent.training_rollout(*a, **k))

        def validation_rollout(self, *a: Any, **k: Any) -> Any:
            return _guard(lambda: self._agent.validation_rollout(*a, **k))

        async def training_rollout_async(self, *a: Any, **k: Any) -> Any:
            return await _guard_async(self._agent.training_rollout_async(*a, **k))

        async def validation_rollout_async(self, *a: Any, **k: Any) -> Any:
            return await _guard_async(self._agent.validation_rollout_async(*a, **k))

    def _guard(f: Callable[[], Any]) -> Any:
        try:
            return f()
        except PolicyViolationError:
            return _BLOCKED

    async def _guard_async(aw: Awaitable[Any]) -> Any:
        try:
            return await aw
        except PolicyViolationError:
            return _BLOCKED

    class GovernedRunner(_GovernedCore, _LitAgentRunner):  # type: ignore[misc,valid-type]
        """``GovernedRunner(kernel, fail_on_violation=False, log_violations=True,
        violation_callback=None, *, reward_fn=None, tracer=None, **runner_kwargs)``: an Agent
        Lightning ``LitAgentRunner`` (``runner_kwargs``: its ``max_rollouts``,
        ``poll_interval``, …; ``tracer`` defaults to Agent Lightning's default, the AgentOps
        tracer) that governs every rollout (see the module docs)."""

        def __init__(
            self,
            kernel: Kernel,
            fail_on_violation: bool = False,
            log_violations: bool = True,
            violation_callback: Optional[Callable[[PolicyViolation], Any]] = None,
            *,
            reward_fn: Optional[PolicyReward] = None,
            tracer: Any = None,
            **runner_kwargs: Any,
        ) -> None:
            self._setup(kernel, fail_on_violation, log_violations, violation_callback, reward_fn)
            if tracer is None:
                from agentlightning.tracer.agentops import AgentOpsTracer

                tracer = AgentOpsTracer()
            _LitAgentRunner.__init__(self, tracer, **runner_kwargs)

        def init(self, agent: Any, **kwargs: Any) -> None:
            """``agent``: a ``LitAgent`` (``@rollout`` functions are LitAgents) for Agent
            Lightning's loop, or a callable ``agent(task_input)`` for ``step``."""
            if isinstance(agent, LitAgent):
                _LitAgentRunner.init(self, agent, **kwargs)
            elif callable(agent):
                self._callable_agent = agent
            else:
                raise TypeError(f"GovernedRunner.init: agent must be a LitAgent or a callable, got {type(agent).__name__}")

        def teardown(self, *args: Any, **kwargs: Any) -> None:
            self._log_totals()
            self._callable_agent = None
            if self._agent is not None:
                _LitAgentRunner.teardown(self, *args, **kwargs)

        def get_agent(self) -> Any:
            return _GuardedAgent(_LitAgentRunner.get_agent(self))

        async def step(self, input: Any, *, mode: Optional[str] = "train", resources: Any = None, event: Any = None) -> Any:  # noqa: A002
            """With a callable agent (``init(callable)``): the seed's governed step, returning a
            ``GovernedRollout``. With a LitAgent: Agent Lightning's ``step`` (one rollout
            through the store, governed as in ``iter``), returning its ``Rollout``."""
            if self._callable_agent is not None or self._agent is None:
                return await _GovernedCore.step(self, input, mode=mode)
            return await _LitAgentRunner.step(self, input, resources=resources, mode=mode, event=event)

        async def _step_impl(self, next_rollout: Any, raise_on_exception: bool = False) -> str:
            st = _Step(self, next_rollout.rollout_id, next_rollout.attempt.attempt_id, next_rollout.mode)
            token = _current.set(st)
            try:
                return await _LitAgentRunner._step_impl(self, next_rollout, raise_on_exception)
            finally:
                _current.reset(token)
                self.kernel.end_rollout(next_rollout.rollout_id)

        async def _post_process_rollout_result(self, rollout: Any, raw_result: Any) -> Any:
            st = _current.get()
            blocked = raw_result is _BLOCKED
            result = None if blocked else raw_result
            spans = list(await _LitAgentRunner._post_process_rollout_result(self, rollout, result))
            if st is None:  # not a step of this runner's loop
                return spans
            store = self.get_store()
            rid, aid = rollout.rollout_id, rollout.attempt.attempt_id
            try:
                stored = await store.query_spans(rid, aid)
            except Exception:
                logger.warning("GovernedRunner: could not read the attempt's spans for gateway violations", exc_info=True)
                stored = []
            for d in _native.gateway_violations([{"name": s.name, "attributes": dict(s.attributes)} for s in stored]):
                v = PolicyViolation.from_dict(d)
                st.violations.append(v)
                _report(self, v)
            governed = self._finish(st, rollout.input, None if st.aborted is not None else result, not blocked)
            attrs = _native.governance_attributes([v.to_dict() for v in governed.violations], governed.signals_sent, governed.success)
            mine = [("agentlightning.annotation", attrs)]
            if self.reward_fn is not None:
                base: Optional[float] = None
                if self.reward_fn.base_reward_fn is None:
                    agent_reward = find_final_reward(spans)
                    base = float(agent_reward) if agent_reward is not None else (1.0 if governed.success else 0.0)
                _, reward_attrs = self.reward_fn.annotation(governed, base=base)
                mine.append(("agentlightning.annotation", reward_attrs))
            added = []
            for name, a in mine:
                seq = await store.get_next_span_sequence_id(rid, aid)
                now = time.time()
                span = Span.from_attributes(
                    attributes=a,
                    rollout_id=rid,
                    attempt_id=aid,
                    sequence_id=seq,
                    name=name,
                    start_time=now,
                    end_time=now,
                    status=TraceStatus(status_code="OK"),
                )
                added.append(await store.add_span(span) or span)
            await store.update_attempt(
                rid,
                aid,
                metadata={
                    "success": governed.success,
                    "violations": len(governed.violations),
                    "total_penalty": governed.total_penalty,
                },
            )
            return spans + added
