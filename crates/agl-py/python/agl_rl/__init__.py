"""agl for Python: governance for reinforcement-learning training of AI agents, in Rust.

The kernel, the flight recorder and the reward arithmetic are agl's own (the same code as the
``agl`` command), compiled into ``agl_rl._native``:

* ``Kernel(policy="standard", *, mode=None, recorder=None)``: policies that judge every action
  before it runs; ``kernel.check({"kind": {"type": "sql", "database": "db", "sql": "…"}})``
  returns a ``Decision`` (``verdict``: allow, warn, modify or block; ``violations``: every
  finding with its policy, severity, reason, effect, penalty and signal). Presets:
  ``presets()``.
* ``FlightRecorder(path=None, *, key_file=None)``: the tamper-evident log a kernel appends every
  check to; ``verify(path)`` recomputes its hash chain.
* ``RewardConfig``, ``PolicyReward``, ``policy_penalty``, ``CompositeReward``,
  ``create_policy_reward``: the seed's (agentmesh-lightning's) reward shaping.
* ``GovernedRunner`` (an Agent Lightning ``LitAgentRunner`` when ``agentlightning`` is
  installed), ``check``, ``GovernedRollout``, ``PolicyViolation``, ``PolicyViolationType``,
  ``PolicyViolationError``: governed steps (``agl_rl.runner``).
* ``GovernedEnvironment`` (a ``gymnasium.Env`` when ``gymnasium`` is installed),
  ``EnvironmentConfig``, ``create_governed_env`` (``agl_rl.environment``).
* ``FlightRecorderEmitter``, ``LightningSpan``, ``create_emitter`` (``agl_rl.emitter``).

Errors: ``GovernanceError`` (a ``ValueError``) for bad policies, actions and configurations,
naming the file, line, column and field; ``RecorderError`` (an ``OSError``) for recorder
databases and keys; ``TypeError`` for arguments of the wrong type.
"""

from ._native import (
    CompositeReward,
    Decision,
    FlightRecorder,
    GovernanceError,
    Kernel,
    PolicyReward,
    RecorderError,
    RewardConfig,
    __version__,
    create_policy_reward,
    policy_penalty,
    presets,
    verify,
)
from .actions import output_action, spend_action, sql_action, tool_call_action
from .emitter import FlightRecorderEmitter, LightningSpan, create_emitter

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers; at run time these load lazily (below)
    from .environment import EnvironmentConfig, GovernedEnvironment, create_governed_env
    from .runner import (
        SEVERITY_PENALTIES,
        GovernedRollout,
        GovernedRunner,
        PolicyViolation,
        PolicyViolationError,
        PolicyViolationType,
        check,
    )

# agl_rl.runner imports agentlightning and agl_rl.environment gymnasium when they are installed
# (seconds and a tenth of a second): they load on first use, so `import agl_rl` stays fast.
_LAZY = {
    "SEVERITY_PENALTIES": "runner",
    "GovernedRollout": "runner",
    "GovernedRunner": "runner",
    "PolicyViolation": "runner",
    "PolicyViolationError": "runner",
    "PolicyViolationType": "runner",
    "check": "runner",
    "EnvironmentConfig": "environment",
    "GovernedEnvironment": "environment",
    "create_governed_env": "environment",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agl_rl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_LAZY))

__all__ = [
    "SEVERITY_PENALTIES",
    "CompositeReward",
    "Decision",
    "EnvironmentConfig",
    "FlightRecorder",
    "FlightRecorderEmitter",
    "GovernanceError",
    "GovernedEnvironment",
    "GovernedRollout",
    "GovernedRunner",
    "Kernel",
    "LightningSpan",
    "PolicyReward",
    "PolicyViolation",
    "PolicyViolationError",
    "PolicyViolationType",
    "RecorderError",
    "RewardConfig",
    "__version__",
    "check",
    "create_emitter",
    "create_governed_env",
    "create_policy_reward",
    "output_action",
    "policy_penalty",
    "presets",
    "spend_action",
    "sql_action",
    "tool_call_action",
    "verify",
]
