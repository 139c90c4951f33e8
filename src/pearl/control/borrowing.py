"""Borrowing the trainer's idle devices for rollout, and returning them on time.

Job: two pure decisions. `BorrowPlanner.should_lend`: when the trainer has finished an update and
waits for its next batch, lend its devices to rollout if the window (idle time less the start, the
return and a safety margin) is positive and the predicted gain pays; say when the devices are due
(`deadline`) and when their return must begin (`return_start_at`). `BorrowPlanner.return_plan`: when
the return begins, drain each lent worker (stop admitting, let its requests finish) if that finishes
before the deadline, else migrate its requests token-level (with the tokens collected so far) to the
workers that stay.

The bound. The trainer waits for a returned device in two cases: the planned return ran late, or the
batch came early (the lent devices themselves speed rollout up). The first is covered by starting
the return at deadline − return cost − safety. The second is covered by refusing to lend when an
immediate return (migrate everything now) would take longer than `return_bound_s`: the caller starts
the return the moment the trainer is ready (`must_return`), and asks `return_plan` for a deadline of
now + bound. So `return_cost_s` must bound the migration of whatever the lent workers hold; the
controller keeps it so by capping their admission (`max_requests_within`).

What it must not do: touch the cluster state, predict the batch time itself, own time (`now` comes in
as data), or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import Sequence

from pearl.config import PolicyConfig

__all__ = ["BorrowPlanner", "LendVerdict", "ReturnAction", "ReturnKind", "max_requests_within",
           "must_return"]


@dataclass(frozen=True)
class LendVerdict:
    lend: bool
    n_devices: int
    deadline: float  # the devices must be back by then (the predicted end of the trainer's idle time)
    return_start_at: float  # the return begins then at the latest
    reason: str  # "<rule>: <numbers>"
    window_s: float = 0.0  # useful lent time per device
    gain_s: float = 0.0  # predicted seconds of batch time saved

    @property
    def rule(self) -> str:
        return self.reason.split(":", 1)[0]


class ReturnKind(str, Enum):
    DRAIN = "drain"  # stop admitting; in-flight requests finish in place
    MIGRATE = "migrate"  # move in-flight requests (tokens so far, KV if it can travel) to survivors


@dataclass(frozen=True)
class ReturnAction:
    worker: int
    devices: tuple[int, ...]
    kind: ReturnKind
    n_requests: int
    done_by: float  # predicted time the worker's devices are free (requests gone, worker stopped)
    reason: str


def max_requests_within(bound_s: float, migrate_request_s: float, stop_s: float) -> float:
    """How many in-flight requests a lent worker may hold so that migrating them all and stopping it
    fits in `bound_s` (the admission cap that keeps an emergency return within the bound); an int,
    or inf when migration is free."""
    if bound_s < stop_s:
        return 0
    return math.inf if migrate_request_s <= 0 else math.floor((bound_s - stop_s) / migrate_request_s + 1e-9)


def must_return(now: float, verdict: LendVerdict, trainer_ready: bool) -> bool:
    """Start returning now: the planned time has come, or the trainer is ready early."""
    return verdict.lend and (trainer_ready or now >= verdict.return_start_at)


class BorrowPlanner:
    """Lending decisions for the trainer's idle devices (see the module docstring)."""

    def __init__(self, return_bound_s: float = 5.0, safety_s: float = 0.25, safety_frac: float = 0.2,
                 min_gain_s: float = 1.0):
        for name, v in (("return_bound_s", return_bound_s), ("safety_s", safety_s),
                        ("safety_frac", safety_frac), ("min_gain_s", min_gain_s)):
            if not v >= 0:
                raise ValueError(f"BorrowPlanner: {name} must be >= 0, got {v!r}")
        self.return_bound_s, self.safety_s = return_bound_s, safety_s
        self.safety_frac, self.min_gain_s = safety_frac, min_gain_s

    @classmethod
    def from_policy(cls, policy: PolicyConfig, **kw) -> "BorrowPlanner":
        return cls(policy.return_bound_s, **kw)

    def safety(self, return_cost_s: float) -> float:
        """Slack before the deadline: the return-cost estimate can be off, proportionally and not."""
        return self.safety_s + self.safety_frac * return_cost_s

    def should_lend(self, now: float, trainer_idle_until_s: float, n_train_devices: int,
                    gain_per_device_s: float, start_cost_s: float, return_cost_s: float) -> LendVerdict:
        """Lend all `n_train_devices` until `trainer_idle_until_s` (the predicted time the next batch
        is ready), or refuse. `gain_per_device_s` is the predicted seconds of batch time saved per lent
        device per second it serves; `start_cost_s` / `return_cost_s` are the times to start a worker on
        a lent device (weights from a peer) and to vacate it by migration."""
        deadline = trainer_idle_until_s
        start_ret = deadline - return_cost_s - self.safety(return_cost_s)
        window = start_ret - (now + start_cost_s)  # = idle − start − return − safety
        n = max(0, int(n_train_devices))
        gain = n * max(0.0, gain_per_device_s) * max(0.0, window)

        def verdict(ok: bool, rule: str, why: str) -> LendVerdict:
            return LendVerdict(ok, n if ok else 0, deadline, start_ret, f"{rule}: {why}", window, gain)

        if n == 0:
            return verdict(False, "no-devices", "the trainer has no idle device to lend")
        if not window > 0:
            return verdict(False, "window", f"idle {deadline - now:.3g} s ≤ start {start_cost_s:.3g} s + "
                                            f"return {return_cost_s:.3g} s + safety "
                                            f"{self.safety(return_cost_s):.3g} s")
        if return_cost_s > self.return_bound_s:
            return verdict(False, "bound", f"an immediate return takes {return_cost_s:.3g} s > bound "
                                           f"{self.return_bound_s:g} s (an early batch would wait)")
        if not gain > self.min_gain_s:
            return verdict(False, "no-gain", f"saves {gain:.3g} s of batch time ≤ {self.min_gain_s:g} s")
        return verdict(True, "lend", f"{n} devices for {window:.3g} s save {gain:.3g} s; return starts at "
                                     f"{start_ret:.6g}, due {deadline:.6g}")

    def return_plan(self, now: float, lent: Sequence[tuple[int, int, int]], deadline: float,
                    drain_rate: float, *, migrate_request_s: float = 0.03,
                    stop_s: float = 0.5) -> list[ReturnAction]:
        """One action per lent worker. `lent` holds (device, worker, n_active) per lent device (a tp>1
        worker appears once per device); `drain_rate` is requests finished per second per worker.
        Drain is preferred (nothing moves) when it ends by `deadline`; else migrate. For an early
        return, pass deadline = now + return_bound_s."""
        workers: dict[int, tuple[list[int], int]] = {}
        for dev, wid, n_active in lent:
            devs, n = workers.setdefault(wid, ([], 0))
            devs.append(dev)
            workers[wid] = (devs, max(n, int(n_active)))
        out = []
        for wid in sorted(workers):
            devs, n = workers[wid]
            devices = tuple(sorted(devs))
            drain_t = 0.0 if n == 0 else (n / drain_rate if drain_rate > 0 else math.inf)
            if now + drain_t + stop_s <= deadline:
                out.append(ReturnAction(wid, devices, ReturnKind.DRAIN, n, now + drain_t + stop_s,
                                        f"drain: {n} requests finish in {drain_t:.3g} s, before the "
                                        f"deadline"))
                continue
            done = now + n * migrate_request_s + stop_s
            late = f"; {done - deadline:.3g} s late" if done > deadline else ""
            out.append(ReturnAction(wid, devices, ReturnKind.MIGRATE, n, done,
                                    f"migrate: draining {n} requests would take {drain_t:.3g} s, past "
                                    f"the deadline; move them token-level{late}"))
        return out
