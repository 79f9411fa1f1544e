"""Ask agl's gateway whether an action the agent runs itself may run.

The gateway judges every answer of the model (text and tool calls) before the agent sees it. An
action the agent runs without the model (it executes SQL, calls an API, pays) never reaches agl,
so the agent asks the same kernel first with :func:`check`; the check is recorded on the attempt
(one violation span per finding, so the penalty reaches the reward) and in the flight recorder.
Actions the agent does not submit are never checked: agl cannot block what it never sees.

Usage::

    from agl_governance import check, GovernanceError

    decision = check({"kind": {"type": "sql", "database": "concert_singer",
                               "sql": "DELETE FROM singer"}})
    if decision["verdict"] == "block":
        ...  # do not run it; tell the model why (decision["violations"])

The base URL is the agent's OpenAI base URL for the attempt, ending in ``/v1``:
``$OPENAI_BASE_URL`` by default (agl's exec runner sets it), or, in an Agent Lightning agent,
``llm.get_base_url(rollout.rollout_id, rollout.attempt.attempt_id)``.

Only ``httpx`` is needed (installed with ``openai``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

import httpx

__all__ = ["check", "GovernanceError"]


class GovernanceError(RuntimeError):
    """The check could not be made: the gateway is unreachable, or answered with an error.

    Attributes:
        status: the HTTP status (``None`` when the gateway could not be reached).
        code: the server's ``error.code`` (``attempt_finished``, ``governance_unavailable``,
            ``invalid_json``, ``rollout_not_found``, ``attempt_not_found``,
            ``store_unavailable``…), or ``"unreachable"``.
        message: the server's ``error.message``, or the transport error.
        url: the URL that was called.

    Treat the action as blocked when this is raised (fail closed).
    """

    def __init__(self, url: str, status: Optional[int], code: str, message: str) -> None:
        self.url, self.status, self.code, self.message = url, status, code, message
        where = f"HTTP {status} `{code}`" if status is not None else "unreachable"
        super().__init__(f"agl governance check at {url} failed ({where}): {message}")


def check(
    action: Dict[str, Any],
    base_url: Optional[str] = None,
    timeout: float = 30.0,
) -> Dict[str, Any]:
    """The kernel's decision on ``action``, recorded on the attempt.

    Args:
        action: the kernel's ``Action`` JSON: ``{"kind": {...}, "context": {...}?}`` with
            ``kind`` one of
            ``{"type": "sql", "database": str, "sql": str, "dialect"?: "sqlite"|"mysql"|"postgres"|"generic"}``,
            ``{"type": "tool_call", "name": str, "arguments": object}``,
            ``{"type": "output", "text": str}``,
            ``{"type": "spend", "usd"?: float, "tokens"?: int}``.
            A bare ``kind`` (a dict with ``"type"``) is accepted and wrapped. The context's
            ``rollout_id``/``attempt_id`` are filled from the URL when absent.
        base_url: the attempt's OpenAI base URL (``http://HOST:PORT/rollout/RID/attempt/AID/v1``);
            default ``$OPENAI_BASE_URL``.
        timeout: seconds to wait for the answer.

    Returns:
        ``{"verdict": "allow"|"warn"|"modify"|"block", "mode": "enforce"|"audit",
        "violations": [{"policy", "severity", "reason", "effect", "penalty", "signal"}, ...],
        "rewritten": {kind} | None, "signals": [...], "recorded": int}``. Do not run a
        ``block``; run ``rewritten`` instead of the action for a ``modify``.

    Raises:
        GovernanceError: no base URL, the gateway is unreachable, or it answered an error
            (its message is in the exception).
    """
    base = base_url or os.environ.get("OPENAI_BASE_URL")
    if not base:
        raise GovernanceError("", None, "no_base_url", "no base_url given and $OPENAI_BASE_URL is not set")
    url = base.rstrip("/") + "/agl/governance/check"
    if "kind" not in action and "type" in action:
        action = {"kind": action}
    try:
        resp = httpx.post(url, json={"action": action}, timeout=timeout)
    except httpx.HTTPError as e:
        raise GovernanceError(url, None, "unreachable", str(e)) from e
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.status_code != 200:
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        raise GovernanceError(
            url,
            resp.status_code,
            str(err.get("code") or resp.status_code),
            str(err.get("message") or resp.text[:500]),
        )
    if not isinstance(body, dict) or "verdict" not in body:
        raise GovernanceError(url, resp.status_code, "not_a_decision", f"not a governance decision: {resp.text[:200]}")
    return body


if __name__ == "__main__":  # pragma: no cover - a manual probe
    import json
    import sys

    print(json.dumps(check(json.loads(sys.argv[1])), indent=2))
