"""Builders of the action dicts ``Kernel.check`` takes (the JSON form of agl's ``Action``).

Each returns ``{"kind": {...}, "context": {...}}``; the context keys are ``agent_id``,
``rollout_id``, ``attempt_id``, ``step`` (0-based), ``rollout_spend_usd`` and
``run_spend_usd`` (USD), all optional.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


def _action(kind: Dict[str, Any], context: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"kind": kind}
    if context:
        out["context"] = dict(context)
    return out


def sql_action(
    sql: str, database: str = "main", *, dialect: str = "sqlite", context: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """Execute ``sql`` (the text as the agent wrote it) against ``database``; ``dialect`` is
    ``sqlite``, ``mysql``, ``postgres`` or ``generic``."""
    return _action({"type": "sql", "database": database, "sql": sql, "dialect": dialect}, context)


def tool_call_action(name: str, arguments: Any = None, *, context: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Call the tool ``name`` with ``arguments`` (JSON-like, usually a dict)."""
    return _action({"type": "tool_call", "name": name, "arguments": {} if arguments is None else arguments}, context)


def output_action(text: str, *, context: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Text the model produced (an answer or a message to a user)."""
    return _action({"type": "output", "text": text}, context)


def spend_action(usd: float = 0.0, tokens: int = 0, *, context: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Spend ``usd`` US dollars and/or ``tokens`` tokens (priced by the cost policy)."""
    return _action({"type": "spend", "usd": usd, "tokens": tokens}, context)
