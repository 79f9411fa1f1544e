"""``FlightRecorderEmitter``: a flight recorder's entries as spans, to files, to a stream, or
into an Agent Lightning store (the seed's ``agent_lightning_gov.emitter``: ``LightningSpan``,
``FlightRecorderEmitter``, ``create_emitter``).

The conversion (one policy-check span per kernel check, a tool-call span per tool call, a
signal span per signal; ``agent_os.*`` attributes) is agl's, shared with the ``agl`` command;
its table is in the docs. ``emit_to_store(store)`` writes the entries of checks made for a
rollout as ``agentlightning.annotation`` spans of that rollout's attempt, with deterministic
ids, so emitting twice stores nothing twice; entries without a rollout, or of a rollout the
store does not know, are skipped. It returns the number of spans stored (the seed returns the
number produced).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Optional

from ._native import FlightRecorder, LightningSpan
from ._native import FlightRecorderEmitter as _NativeEmitter

if TYPE_CHECKING:
    import asyncio

__all__ = ["FlightRecorderEmitter", "LightningSpan", "create_emitter"]


class FlightRecorderEmitter(_NativeEmitter):
    """``FlightRecorderEmitter(flight_recorder, include_policy_checks=True,
    include_signals=True, include_tool_calls=True, trace_id_prefix="agentos",
    poll_interval=0.1)``. ``get_spans()``, ``get_new_spans()`` (only entries added since the
    last call), ``export_to_file(path)`` (JSON array; never through a symlink),
    ``get_violation_summary()``, ``get_stats()`` come from agl; ``stream()`` and
    ``emit_to_store(store)`` are here."""

    async def stream(self, stop: Optional[asyncio.Event] = None) -> AsyncIterator[LightningSpan]:
        """Yields new spans as they are recorded, polling every ``poll_interval`` seconds;
        when ``stop`` is set it polls once more and ends (drain, then exit)."""
        import asyncio

        while True:
            stopping = stop is not None and stop.is_set()
            for span in await asyncio.to_thread(self.get_new_spans):
                yield span
            if stopping:
                return
            if stop is None:
                await asyncio.sleep(self.poll_interval)
            else:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_interval)
                except asyncio.TimeoutError:
                    pass

    async def emit_to_store(self, store: Any) -> int:
        """Stores every entry made for a rollout as spans of its attempt (the entry's attempt,
        else the rollout's latest) in ``store``: an Agent Lightning ``LightningStore`` (e.g.
        ``LightningStoreClient("http://…")`` pointing at ``agl store``). Returns the number of
        spans stored; raises the store's errors."""
        import asyncio

        from agentlightning.types import Span, TraceStatus

        attempts: Dict[str, List[str]] = {}
        stored = 0
        for entry in await asyncio.to_thread(self.store_entries):
            rid = entry["rollout_id"]
            if rid not in attempts:
                try:
                    found = await store.query_attempts(rid)
                except Exception:  # an unknown rollout
                    found = []
                attempts[rid] = [a.attempt_id for a in found]
            known = attempts[rid]
            aid = entry["attempt_id"] if entry["attempt_id"] in known else (known[-1] if known and entry["attempt_id"] is None else None)
            if aid is None:
                continue
            seq = await store.get_next_span_sequence_id(rid, aid)
            spans = [
                Span.from_attributes(
                    attributes=part["attributes"],
                    rollout_id=rid,
                    attempt_id=aid,
                    sequence_id=seq,
                    name="agentlightning.annotation",
                    trace_id=entry["trace_id"],
                    span_id=part["span_id"],
                    start_time=entry["time"],
                    end_time=entry["time"],
                    status=TraceStatus(status_code="OK"),
                )
                for part in entry["spans"]
            ]
            added = await store.add_many_spans(spans)
            stored += len([s for s in added if s is not None]) if added is not None else len(spans)
        return stored


def create_emitter(flight_recorder: FlightRecorder, **kwargs: Any) -> FlightRecorderEmitter:
    """``FlightRecorderEmitter(flight_recorder, **kwargs)``."""
    return FlightRecorderEmitter(flight_recorder, **kwargs)
