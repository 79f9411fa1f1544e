"""``GovernedEnvironment``: a Gymnasium environment whose every action is checked by agl's
kernel, with the reward shaped by the violations (the seed's ``agent_lightning_gov.environment``:
``GovernedEnvironment``, ``EnvironmentConfig``, ``create_governed_env``).

An action is a kernel action dict (``agl_rl.sql_action("shop", "SELECT 1")`` and friends); it is
judged, not executed: ``reward_fn(state, action, result)`` gets ``result`` = the action that
would run (the action, or its rewrite for a ``modify`` verdict) or ``None`` when blocked (default
reward: 1.0 if it would run, else 0.0). The state is ``task_generator()``'s value at each reset
(``None`` without one); a generator that takes one argument receives the reset's ``seed``.

One step: ``reward = task reward + step_penalty + Σ violation_penalty × penalty(v) / 10`` (with
the default ``violation_penalty`` -10 a violation costs -100 / -50 / -10 / -1 for critical /
high / medium / low, or its policy's explicit penalty), plus ``success_bonus`` for a successful
step without violations; ``terminated`` on a critical violation (``terminate_on_critical``),
``truncated`` at ``max_steps``. Where this differs from the seed on purpose (the low-severity
penalty, success counting, no stepping past the end of an episode, the seed honoured) see
``EnvironmentConfig(python_compat=True)`` and the docs. Without ``gymnasium`` installed the class
is a plain object with the same methods.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple

from ._native import Decision, EnvironmentConfig, EnvironmentCore, Kernel

try:
    import gymnasium as _gym

    _Base: Any = _gym.Env
except ImportError:  # gymnasium is optional
    _gym = None
    _Base = object


def _with_seed(generator: Optional[Callable[..., Any]]) -> Optional[Callable[[Optional[int]], Any]]:
    if generator is None:
        return None
    if not callable(generator):
        raise TypeError("task_generator must be callable")
    try:
        params = [
            p
            for p in inspect.signature(generator).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = []
    if params:
        return lambda seed: generator(seed)
    return lambda seed: generator()


class GovernedEnvironment(_Base):  # type: ignore[misc,valid-type]
    """``GovernedEnvironment(kernel, task_generator=None, reward_fn=None, config=None)``: see
    the module docs. ``reset(seed=None, options=None) -> (state, {"episode",
    "kernel_policies"})``; ``step(action) -> (state, reward, terminated, truncated, info)``,
    ``info = {"violations": [{"policy", "description", "severity", "blocked", "step",
    "timestamp"}], "step", "total_reward", "success"}``. ``step`` before ``reset`` or after the
    episode ended raises ``GovernanceError``; a malformed action raises ``GovernanceError`` or
    ``TypeError``; exceptions of ``task_generator``/``reward_fn`` propagate unchanged."""

    metadata: Dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        kernel: Kernel,
        task_generator: Optional[Callable[..., Any]] = None,
        reward_fn: Optional[Callable[[Any, Any, Any], float]] = None,
        config: Optional[EnvironmentConfig] = None,
    ) -> None:
        if not isinstance(kernel, Kernel):
            raise TypeError(f"GovernedEnvironment needs an agl_rl.Kernel, got {type(kernel).__name__}")
        if reward_fn is not None and not callable(reward_fn):
            raise TypeError("reward_fn must be callable")
        self.kernel = kernel
        self._core = EnvironmentCore(kernel, _with_seed(task_generator), reward_fn, config)

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None) -> Tuple[Any, Dict[str, Any]]:
        if _gym is not None:
            super().reset(seed=seed)
        if seed is not None and (not isinstance(seed, int) or seed < 0):
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        return self._core.reset(seed)

    def step(self, action: Dict[str, Any]) -> Tuple[Any, float, bool, bool, Dict[str, Any]]:
        return self._core.step(action)

    @property
    def terminated(self) -> bool:
        """Whether the current episode is over (terminated or truncated)."""
        return self._core.terminated

    @property
    def episode(self) -> int:
        return self._core.episode

    @property
    def rollout_id(self) -> Optional[str]:
        """The rollout id the episode's actions are checked under (``env-<8 hex>-ep<n>``)."""
        return self._core.rollout_id

    @property
    def config(self) -> EnvironmentConfig:
        return self._core.config

    @property
    def state(self) -> Dict[str, Any]:
        """``{"step_count", "total_reward", "violations", "terminated", "truncated",
        "succeeded"}`` of the current episode."""
        return self._core.state()

    @property
    def last_decision(self) -> Optional[Decision]:
        """The kernel's ``Decision`` of the last step."""
        return self._core.last_decision()

    def spaces(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """The observation and action spaces, described in words (they are not numeric)."""
        return self._core.spaces()

    def get_metrics(self) -> Dict[str, Any]:
        """``total_episodes``, ``total_steps``, ``total_violations``, ``successful_episodes``,
        ``success_rate``, ``violations_per_episode``, ``steps_per_episode``,
        ``successful_steps``."""
        return self._core.metrics()

    def close(self) -> None:
        self._core.close()


def create_governed_env(kernel: Kernel, **kwargs: Any) -> GovernedEnvironment:
    """``GovernedEnvironment(kernel, config=EnvironmentConfig(**kwargs))``: every keyword is
    an ``EnvironmentConfig`` field; an unknown one raises ``GovernanceError`` (the seed drops it
    silently)."""
    return GovernedEnvironment(kernel, config=EnvironmentConfig(**kwargs))
