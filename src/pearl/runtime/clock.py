"""Clocks. `VirtualClock` is a discrete-event loop: a heap of (time, counter, callback) so ties run
in insertion order and runs are deterministic. `WallClock` gives the real time to the same callers."""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._n = 0
        self.events_run = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        if t < self.now:
            t = self.now
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, fn, args))

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap and heap[0][0] <= until:
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            self.events_run += 1
            if stop is not None and stop():
                return
        self.now = max(self.now, until) if not heap or heap[0][0] > until else self.now

    def pending(self) -> int:
        return len(self._heap)


class WallClock:
    """The real clock, for the real runtime."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    @property
    def now(self) -> float:
        return time.monotonic() - self._t0
