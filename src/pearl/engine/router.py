"""Routing, pure: which worker gets a turn.

Session affinity first (the worker that holds a trajectory's KV only prefills the new tokens), unless
that worker is clearly busier than the alternative; otherwise the less loaded of two workers drawn at
random ("power of two choices": near-optimal balance at O(1) cost, which matters when a simulated
cluster routes millions of turns). The draw comes from the caller's seeded RNG, so runs stay
deterministic. Works on any engine exposing `kv_used()`, `kv_capacity`, `load()`, `holds(session)`,
`pre_pending`.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pearl.types import Role


def take_share(on: dict[Any, list[Any]], new: Any) -> list[tuple[Any, Any]]:
    """Rebalancing onto a worker that just joined: move items (trajectories) onto `new` until it holds
    its share (all items // holders), each from the holder that has the most, popped from the end of
    its list (callers sort what should move first last). Mutates `on`; returns (item, source) moves."""
    share, moves = sum(map(len, on.values())) // len(on), []
    others = [k for k in on if k != new]
    while others and len(on[new]) < share:
        src = max(others, key=lambda k: len(on[k]))
        if len(on[src]) <= share:
            break
        item = on[src].pop()
        on[new].append(item)
        moves.append((item, src))
    return moves


LOAD_WEIGHT = 0.002  # each request in flight counts as this much KV fullness


def kv_pressure(e: Any, top: float | None = None) -> float:
    # KV hand-offs still in flight count too, or hand-offs finishing together all pick one worker. A
    # worker slower than the fastest (`rate` / `top` < 1: another kind of hardware, or a smaller tp)
    # counts as fuller while its KV is far from full (speed decides), less so as it fills (memory
    # decides): p / speed^(1-p).
    incoming = getattr(e, "incoming_tokens", 0)
    p = (e.kv_used() + incoming) / e.kv_capacity + LOAD_WEIGHT * (e.load() + (incoming > 0))
    speed = getattr(e, "rate", 1.0) / top if top else 1.0
    return p / speed ** max(0.0, 1.0 - p)


def _two_choices(candidates: Sequence[Any], key, rng: random.Random | None) -> Any:
    n = len(candidates)
    if n <= 2 or rng is None:
        return min(candidates, key=key)
    i, j = rng.randrange(n), rng.randrange(n - 1)
    a, b = candidates[i], candidates[j + (j >= i)]
    return a if key(a) <= key(b) else b


def _rate(e: Any) -> float:
    return getattr(e, "rate", 1.0)


class Candidates(list):
    """Workers to route among, with the fastest one's decode rate (`top`), worked out once (a caller
    that caches the list routes each turn in O(1))."""

    def __init__(self, workers: Any = ()):
        super().__init__(workers)
        self.top = max(map(_rate, self), default=1.0)


def pick_decode(candidates: Sequence[Any], session: str, home: Any | None,
                rng: random.Random | None = None, slack: float = 0.25) -> Any:
    """A worker that will hold the session's KV and decode it (a `mixed` or `decode` worker). A worker's
    speed is its decode rate (`rate`, steps per second) relative to the fastest candidate's."""
    top = getattr(candidates, "top", None) or max(map(_rate, candidates))
    key = lambda e: kv_pressure(e, top)  # noqa: E731
    if home is not None and home.accepting and home.role is not Role.PREFILL and home.holds(session):
        alt = _two_choices(candidates, key, rng)
        return home if key(home) <= key(alt) + slack else alt
    return _two_choices(candidates, key, rng)


def pick_prefill(candidates: Sequence[Any], session: str, home: Any | None, chunk: int,
                 rng: random.Random | None = None) -> Any:
    """A prefill worker: the one with less queued prefill work, or the session's prefix holder."""
    key = lambda e: (e.pre_pending, e.load())  # noqa: E731
    best = _two_choices(candidates, key, rng)
    if (home is not None and home.accepting and home.role is Role.PREFILL and home.holds(session)
            and home.pre_pending <= best.pre_pending + chunk):
        return home
    return best
