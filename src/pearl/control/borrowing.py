"""Borrowing the trainer's idle devices for rollout, and returning them on time.

Job: one pure decision. `BorrowPlanner.should_lend`: when the trainer has finished an update and
waits for its next batch, lend its devices to rollout if the window (idle time less the start, the
return and a safety margin) is positive and the predicted gain pays; say when the devices are due
(`deadline`) and when their return must begin at the latest (`return_start_at`). How the devices
are vacated (stopping their workers, migrating their requests) is the caller's business.

The bound. The trainer waits for a returned device in two cases: the planned return ran late, or the
batch came early (the lent devices themselves speed rollout up). The first is covered by starting
the return by deadline − return cost − safety (`return_start_at`). The second is covered by refusing
to lend when an immediate return would take longer than `return_bound_s`, so a caller that starts
the return the moment the trainer is ready makes it wait at most the bound, provided `return_cost_s`
bounds vacating whatever the lent workers hold.

What it must not do: touch the cluster state, predict the batch time itself, own time (`now` comes in
as data), or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from dataclasses import dataclass

from pearl.config import PolicyConfig

__all__ = ["BorrowPlanner", "LendVerdict"]


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
    def from_policy(cls, policy: PolicyConfig) -> "BorrowPlanner":
        """The planner `policy` configures: a lend must save `lend_gain_factor` times what starting
        and vacating its workers cost (the model does not see the slowdown of migrating back)."""
        k = policy.controller
        return cls(policy.return_bound_s, k.lend_safety_s, k.lend_safety_share,
                   min_gain_s=k.lend_gain_factor * (k.wake_s + k.stop_s))

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
