"""Admission control: PEARL chooses the cap on trajectories in flight (issue 9).

The staleness gate lets (η + 1)·B trajectories run at once. When their contexts outgrow the KV cache,
the engines evict idle sessions and every evicted context is prefilled again on its next turn: past
that point more trajectories in flight means less throughput (on s1-swe, tp2: 0.198 traj/s at 128
in flight, 0.145 at 256; `docs/results.md`). The baselines get the cap tuned offline by short runs;
PEARL finds it online, from the signal that says the cache thrashes: evicted sessions per finished
request, summed over the ticks since the last reading in which the layout did not change (a switch,
a lend or a return evicts by itself: its interval is skipped, the steady ones around it still add
up, since a real run lends at every step). Above `high` the cap becomes `decrease` × the
trajectories in flight (once the current cap has been reached); below `low`, after `patience` calm
readings at the cap, and once a trajectory's mean life has passed since the last change (the
signal lags the cap: a trajectory admitted now evicts others only as its context grows, turns
later), it rises by one step, back to no cap at the gate's level. Between the two it holds.
The controller predicts the layouts at the cap it sets (`Controller._recap`), but the cap itself is
measured, not predicted: the predictor now finds the cliff where the simulator does (on s1-swe its
fastest cap is 128 at tp2, the simulator's best; 128 at tp4, where the simulator's best is 160:
`benchmarks/cap_cliff.py`), but its evicted share jumps from 0 to 1 across one step of the cap, a
cap set from it at the start did no better than this search from no cap (s1-swe, seeds 0–3: 0.298
traj/s from 128, 0.303 from 192 or from none), and the cache measured is the real one.

Pure: counters in, a cap and a reason out. No clocks, no I/O.
"""
from __future__ import annotations

import math

from pearl.config_admission import AdmissionConfig

__all__ = ["AdmissionControl"]


class AdmissionControl:
    def __init__(self, k: AdmissionConfig, pipeline: int, group: int, ceiling: int | None = None):
        """`pipeline`: the staleness gate's level, (η + 1)·B; `group`: trajectories admitted together;
        `ceiling`: the configured cap (`rl.max_concurrent_trajectories`), never exceeded."""
        self.k, self.ceiling, self.pipeline = k, ceiling, pipeline
        self.top = min(pipeline, ceiling) if ceiling is not None else pipeline
        self.step = max(group, math.ceil(k.increase_share * pipeline))
        self.floor = min(self.top, max(group, math.ceil(k.floor_share * pipeline)))
        self.cap: int | None = ceiling  # None: the staleness gate alone
        self._mark: tuple[int, int, int] | None = None  # counters at the last tick: (evictions, requests, trajectories)
        # summed over the steady intervals since the last reading: evictions, requests, trajectories
        # finished, trajectories in flight × dt
        self._acc = [0, 0, 0, 0.0]
        self._t = 0.0  # the last tick's time
        self._calm = 0
        self._changed_t = 0.0
        self._devices = 0  # devices holding KV (decode-capable workers') when the cap was last set

    def caps(self) -> list[int]:
        """Caps a thrashing layout may settle at: a quarter, three eighths and a half of the staleness
        gate's level, within the floor and the ceiling. The controller ranks each layout at the best of
        these and the cap in force (`Controller._rank`), since this search moves the cap to where that
        layout's cache stops thrashing, not where the current layout's did. (The grid of eighths up to
        the full level ranked no better on s1-swe and cost 2.3x the control time: docs/results.md.)"""
        return sorted({max(self.floor, min(self.top, round(k * self.pipeline / 8))) for k in (2, 3, 4)})

    def observe(self, t: float, evictions: int, finished: int, trajectories: int, in_flight: float,
                steady: bool = True, devices: int = 0) -> tuple[int | None, str] | None:
        """Counters since the start (evicted sessions and finished requests, every worker; finished
        trajectories) and the time-averaged trajectories in flight since the last reading; `steady`:
        the layout did not change since then (a switch, a lend or a return evicts by itself: such an
        interval is not read); `devices`: the devices of the decode-capable workers now (a cap is KV per
        device: when lent devices come or go, it scales with them). Returns (new cap, reason) when the
        cap changes, else None."""
        scaled = None
        if devices and devices != self._devices:
            if self.cap is not None and self._devices:
                new = max(self.floor, min(self.top, round(self.cap * devices / self._devices)))
                if new != self.cap:
                    scaled = new, f"cap: {devices} devices hold KV (were {self._devices}): at most {new}"
                self.cap = new
            self._devices = devices
        got = self._read(t, evictions, finished, trajectories, in_flight, steady)
        return got if got is not None else scaled

    def _read(self, t, evictions, finished, trajectories, in_flight, steady) -> tuple[int | None, str] | None:
        m, dt, self._t = self._mark, t - self._t, t
        self._mark = (evictions, finished, trajectories)
        if m is None or evictions < m[0] or finished < m[1]:
            self._acc = [0, 0, 0, 0.0]  # counters restarted: read afresh from here
            return None
        if steady:  # an interval with a layout change is skipped, the steady ones around it still count
            a = self._acc
            a[0] += evictions - m[0]
            a[1] += finished - m[1]
            a[2] += trajectories - m[2]
            a[3] += in_flight * dt
        de, df, dn, area = self._acc
        if df < self.k.min_requests:
            return None  # too few to read a rate: keep accumulating
        self._acc = [0, 0, 0, 0.0]
        life = area / max(dn, 1)  # Little's law: W = L / λ
        rate, limit = de / df, self.cap if self.cap is not None else self.top
        if rate > self.k.high:
            self._calm = 0
            if in_flight > limit + self.step:  # still draining down to the current cap
                return None
            new = max(self.floor, int(self.k.decrease * min(in_flight, limit)))
            if new >= limit:
                return None
            self.cap, self._changed_t = new, t
            return new, (f"cap: {rate:.0%} of finished requests evicted a session's KV (> {self.k.high:.0%}) "
                         f"with {in_flight:.0f} trajectories in flight: at most {new} from now on")
        if self.cap is None or rate >= self.k.low or in_flight < self.cap - self.step:
            self._calm = 0  # nothing to raise, not calm, or the cap is not what limits
            return None
        self._calm += 1
        since = t - self._changed_t
        if self._calm < self.k.patience or since < life:
            return None
        self._calm, self._changed_t = 0, t
        new = self.cap + self.step
        self.cap = None if new >= self.top and self.ceiling is None else min(new, self.top)
        return self.cap, (f"cap: {rate:.1%} of finished requests evicted a session's KV (< {self.k.low:.0%}) "
                          f"for {self.k.patience} readings at the cap, {since:.0f} s since the last change "
                          f"(a trajectory's mean life: {life:.0f} s): "
                          + ("no cap (the staleness gate's level)" if self.cap is None else f"at most {self.cap}"))
