"""Clocks: the one thing that differs between a simulated and a real run's notion of time.

`Clock` is what the runtimes and `ControlDriver` need: `now`, and `at(t, fn, *args)` to run a callback
at time `t`. `VirtualClock` is a discrete-event loop (a heap of (time, counter, callback), so ties run
in insertion order and runs are deterministic); the simulator's run loop is `clock.run(until, stop)`.
`WallClock` keeps the same heap on the wall clock; the real runtime's loop calls `run_due()` between
engine steps, so callbacks run on the thread that owns the engines.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["Clock", "VirtualClock", "WallClock"]


class Clock(Protocol):
    @property
    def now(self) -> float: ...

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None: ...


class _Heap:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._n = 0
        self.events_run = 0

    def _push(self, t: float, fn: Callable[..., Any], args: tuple) -> None:
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, fn, args))


class VirtualClock(_Heap):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self._push(max(t, self.now), fn, args)

    def run(self, until: float, stop: Callable[[], bool] | None = None) -> None:
        """Run events up to time `until` in order, checking `stop()` before each. `now` is left at the
        last event run (a run that ends early does not pretend time passed)."""
        heap, pop = self._heap, heapq.heappop
        while heap and heap[0][0] <= until and not (stop is not None and stop()):
            t, _, fn, args = pop(heap)
            self.now = t
            fn(*args)
            self.events_run += 1
        self.now = min(max(self.now, 0.0), until)


class WallClock(_Heap):
    """Real seconds since construction; callbacks run when `run_due()` is called at or after their time."""

    def __init__(self) -> None:
        super().__init__()
        self._t0 = time.monotonic()

    @property
    def now(self) -> float:
        return time.monotonic() - self._t0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        self._push(t, fn, args)

    def run_due(self) -> int:
        """Run every callback whose time has come; returns how many ran."""
        n = 0
        while self._heap and self._heap[0][0] <= self.now:
            _, _, fn, args = heapq.heappop(self._heap)
            fn(*args)
            n += 1
        self.events_run += n
        return n
