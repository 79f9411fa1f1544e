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

__all__ = [
    "CompositeReward",
    "Decision",
    "FlightRecorder",
    "GovernanceError",
    "Kernel",
    "PolicyReward",
    "RecorderError",
    "RewardConfig",
    "__version__",
    "create_policy_reward",
    "output_action",
    "policy_penalty",
    "presets",
    "spend_action",
    "sql_action",
    "tool_call_action",
    "verify",
]
