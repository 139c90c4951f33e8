"""Routing, pure: which worker gets a turn.

Session affinity first (the worker that holds a trajectory's KV only prefills the new tokens), unless
that worker is clearly busier than the least-loaded one; new sessions go to the least-loaded worker.
Works on any engine exposing `kv_used()`, `kv_capacity`, `load()`, `holds(session)`, `pre_pending`.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def kv_pressure(e: Any) -> float:
    return e.kv_used() / e.kv_capacity + 0.002 * e.load()


def pick_decode(candidates: Sequence[Any], session: str, home: Any | None, slack: float = 0.25) -> Any:
    """A worker that will hold the session's KV and decode it (a `mixed` or `decode` worker)."""
    best = min(candidates, key=kv_pressure)
    if home is not None and home in candidates and home.holds(session):
        if kv_pressure(home) <= kv_pressure(best) + slack:
            return home
    return best


def pick_prefill(candidates: Sequence[Any], session: str, home: Any | None, chunk: int) -> Any:
    """A prefill worker: the one with the least queued prefill work, or the session's prefix holder."""
    best = min(candidates, key=lambda e: (e.pre_pending, e.load()))
    if home is not None and home in candidates and home.holds(session):
        if home.pre_pending <= best.pre_pending + chunk:
            return home
    return best
