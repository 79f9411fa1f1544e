"""Type stubs of agl_rl._native (the Rust half of agl_rl). Units: rewards and penalties are
reward units (floats), times in check statistics are seconds or microseconds as named, spend is
USD."""

from os import PathLike
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple, Union

__version__: str

Verdict = Literal["allow", "warn", "modify", "block"]
Mode = Literal["enforce", "audit"]
SeverityName = Literal["low", "medium", "high", "critical"]
Action = Dict[str, Any]
"""``{"kind": {"type": "sql", "database": str, "sql": str, "dialect"?: str} | {"type":
"tool_call", "name": str, "arguments": Any} | {"type": "output", "text": str} | {"type":
"spend", "usd": float, "tokens": int}, "context"?: {"agent_id", "rollout_id", "attempt_id",
"step", "rollout_spend_usd", "run_spend_usd"}}``"""

class GovernanceError(ValueError):
    """Bad input to the kernel or the reward: policy file (file or ``<dict>``, line, column,
    field), preset, mode, action, configuration."""

class RecorderError(OSError):
    """A flight-recorder database or key that cannot be used."""

def presets() -> List[str]:
    """The built-in presets, strictest first: ``["strict", "standard", "permissive"]``."""

class Decision:
    """The kernel's decision about one action."""

    @property
    def verdict(self) -> Verdict: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def violations(self) -> List[Dict[str, Any]]:
        """Every finding in policy order: ``{"policy": str, "severity": SeverityName, "reason":
        str, "effect": "warn" | "modify" | "block", "penalty": float | None, "signal":
        "SIGSTOP" | "SIGKILL" | "SIGCONT" | None}``."""
    @property
    def rewritten(self) -> Optional[Dict[str, Any]]:
        """For ``"modify"``: the action kind that runs instead."""
    @property
    def signals(self) -> List[str]: ...
    @property
    def executes(self) -> bool:
        """Every verdict but ``"block"``."""
    @property
    def is_violation(self) -> bool: ...
    @property
    def max_severity(self) -> Optional[SeverityName]: ...
    def to_dict(self) -> Dict[str, Any]: ...

class FlightRecorder:
    """Tamper-evident, append-only log of every check (a SHA-256 hash chain in SQLite, HMAC
    keyed with ``key_file``, anchored by ``<path>.head``)."""

    def __init__(
        self, path: Union[str, PathLike[str], None] = None, *, key_file: Union[str, PathLike[str], None] = None
    ) -> None:
        """Opens or creates ``path`` (``None``: in memory). Raises ``RecorderError`` for a file
        that is not a recorder, a chain that does not verify, or a key that does not match."""
    @property
    def path(self) -> Optional[str]: ...
    @property
    def keyed(self) -> bool: ...
    @property
    def entries(self) -> int: ...
    @property
    def head_hash(self) -> str:
        """64 hex digits."""
    def flush(self) -> None: ...
    def summary(self) -> Dict[str, Any]:
        """``{"entries": int, "violations": int, "violation_rate": float, "by_verdict": {str:
        int}, "by_policy": {str: int}, "by_severity": {str: int}}``."""
    def verify(self) -> Dict[str, Any]:
        """As ``verify``, against the head this recorder committed last."""
    def entries_list(self) -> List[Dict[str, Any]]:
        """Every entry, oldest first: ``seq``, ``timestamp``, ``action``, ``decision``,
        ``prev_hash``, ``hash``, …"""

def verify(
    path: Union[str, PathLike[str]], *, key_file: Union[str, PathLike[str], None] = None, head: bool = True
) -> Dict[str, Any]:
    """``{"ok": bool, "entries": int, "keyed": bool, "beyond_head": int, "head": {"seq", "hash",
    "count", "mac"} | None, "first_broken": {"seq": int, "reason": str} | None}``. A chain that
    does not verify is ``ok`` False; a missing or foreign file raises ``RecorderError``."""

class Kernel:
    """agl's governance kernel. ``policy``: a preset name, a YAML policy file path, a dict of
    the file's form, or a list of policy entries (``{"version": 1, "policies": [...]}``)."""

    def __init__(
        self,
        policy: Union[str, PathLike[str], Dict[str, Any], Sequence[Dict[str, Any]], None] = None,
        *,
        mode: Optional[Mode] = None,
        recorder: Optional[FlightRecorder] = None,
    ) -> None: ...
    @staticmethod
    def from_yaml(
        text: str, *, origin: str = "<yaml>", mode: Optional[Mode] = None, recorder: Optional[FlightRecorder] = None
    ) -> "Kernel": ...
    def check(self, action: Action) -> Decision:
        """Runs every policy (the GIL is released); policies are told the outcome and the
        recorder appends. Raises ``GovernanceError`` for a malformed action."""
    def preview(self, action: Action) -> Decision:
        """``check`` without effects."""
    def end_rollout(self, rollout_id: str) -> None: ...
    def reset(self) -> None: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def policy_names(self) -> List[str]: ...
    @property
    def origin(self) -> str: ...
    @property
    def recorder(self) -> Optional[FlightRecorder]: ...
    def stats(self) -> Dict[str, float]:
        """``checks``, ``cached_checks``, ``hit_rate``, ``check_seconds``, ``mean_check_us``,
        ``p50_check_us``, ``p99_check_us``, ``checks_per_second``."""

class RewardConfig:
    """Reward shaping parameters (keyword arguments only; unknown fields raise
    ``GovernanceError``)."""

    critical_penalty: float
    high_penalty: float
    medium_penalty: float
    low_penalty: float
    clean_bonus: float
    multiplicative: bool
    multiplicative_factor: float
    min_reward: Optional[float]
    max_reward: Optional[float]
    python_compat: bool
    def __init__(
        self,
        *,
        critical_penalty: float = -100.0,
        high_penalty: float = -50.0,
        medium_penalty: float = -10.0,
        low_penalty: float = -1.0,
        clean_bonus: float = 5.0,
        multiplicative: bool = False,
        multiplicative_factor: float = 0.5,
        min_reward: Optional[float] = -100.0,
        max_reward: Optional[float] = 100.0,
        python_compat: bool = False,
    ) -> None: ...
    def to_dict(self) -> Dict[str, Any]: ...

class PolicyReward:
    """Base reward + violation penalties (or multiplicative factor) + clean bonus, clamped."""

    def __init__(
        self,
        kernel: Any = None,
        base_reward_fn: Optional[Callable[[Any], float]] = None,
        config: Optional[RewardConfig] = None,
        *,
        shaped: bool = True,
    ) -> None: ...
    def __call__(self, rollout: Any) -> float: ...
    def score(self, rollout: Any) -> Dict[str, float]:
        """``final_reward``, ``unclamped``, ``base``, ``policy_penalty``, ``bonus``,
        ``violations``."""
    def compute(self, base: float, succeeded: bool, violations: Sequence[Any]) -> Dict[str, float]: ...
    def base_reward(self, rollout: Any) -> float: ...
    def annotation(self, rollout: Any, base: Optional[float] = None) -> Tuple[Dict[str, float], Dict[str, Any]]:
        """Scores like ``score`` (recorded) with ``base`` as the base reward when given;
        returns ``(breakdown, reward span attributes)``."""
    @property
    def base_reward_fn(self) -> Optional[Callable[[Any], float]]: ...
    def get_stats(self) -> Dict[str, float]:
        """``total_rewards``, ``total_penalties``, ``avg_penalty``, ``violation_rate``,
        ``clean_rate``."""
    def reset_stats(self) -> None: ...
    @property
    def config(self) -> RewardConfig: ...
    @property
    def kernel(self) -> Any: ...
    @property
    def shaped(self) -> bool: ...

def policy_penalty(
    violations: Sequence[Any],
    config: Optional[RewardConfig] = None,
    *,
    critical_penalty: Optional[float] = None,
    high_penalty: Optional[float] = None,
    medium_penalty: Optional[float] = None,
    low_penalty: Optional[float] = None,
) -> float: ...
def create_policy_reward(
    kernel: Any = None,
    base_reward_fn: Optional[Callable[[Any], float]] = None,
    severity_penalties: Optional[Dict[str, float]] = None,
    clean_bonus: float = 5.0,
    multiplicative: bool = False,
) -> PolicyReward: ...

class CompositeReward:
    def __init__(self, components: Sequence[Tuple[Callable[[Any], float], float]], normalize: bool = False) -> None: ...
    @property
    def weights(self) -> List[float]: ...
    def __call__(self, rollout: Any) -> float: ...

def severity_penalties() -> List[Tuple[str, float]]:
    """``[("critical", 100.0), ("high", 50.0), ("medium", 10.0), ("low", 1.0)]``."""

def decision_violations(decision: Decision) -> List[Dict[str, Any]]:
    """One ``PolicyViolation`` dict per finding: ``violation_type``, ``policy_name``,
    ``description``, ``severity``, ``timestamp`` (ISO-8601, UTC), ``action_blocked``,
    ``penalty`` (explicit magnitude or None)."""

def gateway_violations(spans: Sequence[Any]) -> List[Dict[str, Any]]:
    """The violations agl's LLM gateway recorded in ``spans`` (dicts or objects with ``name``
    and ``attributes``), as ``PolicyViolation`` dicts."""

def governance_attributes(violations: Sequence[Dict[str, Any]], signals: Sequence[str], success: bool) -> Dict[str, Any]:
    """The attributes of a rollout's governance annotation span."""

class EnvironmentConfig:
    """Keyword arguments only; unknown fields raise ``GovernanceError``."""

    def __init__(
        self,
        *,
        max_steps: int = 100,
        violation_penalty: float = -10.0,
        terminate_on_critical: bool = True,
        step_penalty: float = -0.1,
        success_bonus: float = 10.0,
        reset_kernel_state: bool = True,
        python_compat: bool = False,
    ) -> None: ...
    max_steps: int
    violation_penalty: float
    terminate_on_critical: bool
    step_penalty: float
    success_bonus: float
    reset_kernel_state: bool
    python_compat: bool
    def violation_reward(self, violation: Any) -> float:
        """The reward added for one violation (reward units, ≤ 0 with the defaults)."""
    def to_dict(self) -> Dict[str, Any]: ...

class EnvironmentCore:
    """The native core of ``agl_rl.GovernedEnvironment`` (use that class)."""

    def __init__(
        self,
        kernel: Kernel,
        task_generator: Optional[Callable[[Optional[int]], Any]] = None,
        reward_fn: Optional[Callable[[Any, Any, Any], float]] = None,
        config: Optional[EnvironmentConfig] = None,
    ) -> None: ...
    def reset(self, seed: Optional[int] = None) -> Tuple[Any, Dict[str, Any]]: ...
    def step(self, action: Action) -> Tuple[Any, float, bool, bool, Dict[str, Any]]: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def episode(self) -> int: ...
    @property
    def rollout_id(self) -> Optional[str]: ...
    @property
    def config(self) -> EnvironmentConfig: ...
    def state(self) -> Dict[str, Any]: ...
    def last_decision(self) -> Optional[Decision]: ...
    def metrics(self) -> Dict[str, Any]: ...
    def spaces(self) -> Tuple[Dict[str, Any], Dict[str, Any]]: ...
    def close(self) -> None: ...

class LightningSpan:
    """The seed's span export format (not an Agent Lightning span). Times: ``datetime``
    (naive is UTC), Unix seconds or ISO-8601 text in; Unix seconds out."""

    def __init__(
        self,
        span_id: str,
        trace_id: str,
        name: str,
        start_time: Any,
        end_time: Any = None,
        attributes: Optional[Dict[str, Any]] = None,
        events: Optional[List[Any]] = None,
    ) -> None: ...
    @property
    def span_id(self) -> str: ...
    @property
    def trace_id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def start_time(self) -> float: ...
    @property
    def end_time(self) -> Optional[float]: ...
    @property
    def attributes(self) -> Dict[str, Any]: ...
    @property
    def events(self) -> List[Any]: ...
    def to_dict(self) -> Dict[str, Any]:
        """``span_id``, ``trace_id``, ``name``, ``start_time``, ``end_time`` (ISO-8601, as
        ``datetime.isoformat()``), ``attributes``, ``events``."""
    def to_json(self) -> str: ...

class FlightRecorderEmitter:
    def __init__(
        self,
        flight_recorder: FlightRecorder,
        include_policy_checks: bool = True,
        include_signals: bool = True,
        include_tool_calls: bool = True,
        trace_id_prefix: str = "agentos",
        poll_interval: float = 0.1,
    ) -> None: ...
    def get_spans(self) -> List[LightningSpan]: ...
    def get_new_spans(self) -> List[LightningSpan]: ...
    def export_to_file(self, path: Union[str, PathLike[str]]) -> int: ...
    def get_violation_summary(self) -> Dict[str, Any]:
        """``total_entries``, ``total_violations``, ``violation_rate``, ``policies_violated``."""
    def get_stats(self) -> Dict[str, int]:
        """``emitted_count``, ``last_position``."""
    def store_entries(self) -> List[Dict[str, Any]]: ...
    @property
    def poll_interval(self) -> float:
        """Seconds."""
    @property
    def trace_id_prefix(self) -> str: ...
