"""What the controller sees and what it asks for: the typed interface between `Controller` and a
runtime.

- `Observation`: a snapshot a runtime builds (devices, workers, the trainer, counters, the recently
  finished trajectories). The simulator and the real runtime each build it from their own state; the
  controller cannot tell them apart.
- events (`DevicesAdded`, `Notice`, `DevicesRemoved`, `TrainerIdle`, `TrainerNeedsDevices`,
  `Redecide`): facts that arrive between ticks.
- `Effects`: typed actions (`Start`, `Stop`, `Flip`, `Lend`, `Reclaim`), the decisions taken with their
  reasons, when to tick next, and a follow-up event to evaluate on a fresh observation once the
  actions are applied.
- `Decision`: one record per decision (time, trigger, candidates with predicted batch time, chosen
  shape, plan summary, gain, cost, the rule that decided), JSON-ready through `to_dict`.

Pure values: no clock, no I/O.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Union

from pearl.control.planner import Plan, StepKind
from pearl.types import DeviceStatus, LayoutShape, Pool, Role, WorkerPhase
from pearl.workloads import TrajectorySpec

__all__ = ["Action", "Decision", "DeviceObs", "DevicesAdded", "DevicesRemoved", "Effects", "Event", "Flip",
           "Lend", "Notice", "Observation", "Reclaim", "Redecide", "Resize", "SetCap", "Start", "Stop", "TrainerIdle",
           "TrainerNeedsDevices", "TrainerObs", "WorkerObs", "plan_actions"]


# ---------------------------------------------------------------- observation
@dataclass(frozen=True, slots=True)
class DeviceObs:
    id: int
    pool: Pool
    node: int
    status: DeviceStatus
    notice_at: float | None = None  # revocation announced for this time
    lease_deadline: float | None = None  # a lent train device is due back then


@dataclass(frozen=True, slots=True)
class WorkerObs:
    id: int
    devices: tuple[int, ...]
    role: Role
    phase: WorkerPhase
    accepting: bool  # takes new turns (False while draining before a stop)
    load: int  # requests in flight
    kv_used: int  # KV tokens held


@dataclass(frozen=True, slots=True)
class TrainerObs:
    busy: bool
    groups_ready: int  # finished groups waiting for the next step
    groups_needed: int  # groups per training step
    batch_ready_t: tuple[float, ...] = ()  # times the recent batches became ready (oldest first)
    devices: tuple[int, ...] = ()  # the trainer's own devices


@dataclass(frozen=True, slots=True)
class Observation:
    t: float
    devices: tuple[DeviceObs, ...]  # every device the runtime knows, in a stable order
    workers: tuple[WorkerObs, ...]  # live workers (loading, serving, draining), in a stable order
    shape: LayoutShape  # the live layout (loading and serving workers)
    trainer: TrainerObs
    tokens_generated: float = 0.0  # tokens decoded by every worker ever (a counter)
    active_integral: float = 0.0  # ∫ trajectories in flight dt since the start (a counter)
    # The most recent finished trajectories as measured (tokens per turn, env latency), oldest first,
    # and how many have finished since the start (a counter): what the workload estimate learns from.
    finished: tuple[TrajectorySpec, ...] = ()
    finished_count: int = 0
    # The trajectories in flight as far as they ran (completed turns; the turn in progress with the
    # tokens generated so far, where the runtime knows them), each with whether its last turn is still
    # in progress: the estimate's censored observations (`pearl.control.censored`).
    running: tuple[tuple[TrajectorySpec, bool], ...] = ()
    # KV pressure (counters since the start, on the decode-capable workers: a prefill worker's retained
    # copy is a spare): sessions whose idle KV was evicted (their next turn recomputes the context) and
    # requests finished there; the trajectories in flight now.
    kv_evictions: int = 0
    requests_finished: int = 0
    in_flight: int = 0

    def workers_on(self, devs: tuple[int, ...] | list[int]) -> list[WorkerObs]:
        ds = set(devs)
        return [w for w in self.workers if ds.intersection(w.devices)]


# ---------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class DevicesAdded:
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Notice:
    devices: tuple[int, ...]
    at: float  # when they go


@dataclass(frozen=True, slots=True)
class DevicesRemoved:
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TrainerIdle:
    """The trainer finished a step and waits for the next batch: its devices may be lent."""


@dataclass(frozen=True, slots=True)
class TrainerNeedsDevices:
    """The next batch is ready: lent devices must come back now."""


@dataclass(frozen=True, slots=True)
class Redecide:
    trigger: str


Event = Union[DevicesAdded, Notice, DevicesRemoved, TrainerIdle, TrainerNeedsDevices, Redecide]


# ---------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class Start:
    """Start a worker on `devices` with `role`; it serves `load_s` after it starts. With `delay_s` > 0
    it starts then, and only if the devices are still free (e.g. a stop frees them first)."""

    devices: tuple[int, ...]
    role: Role
    load_s: float
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop a worker; its requests move with their KV (`migrate`) or resume from their tokens. With
    `delay_s` None it stops now; else it stops taking new turns now and stops after `delay_s` (when
    its replacements serve: make-before-break)."""

    worker: int
    migrate: bool = True
    delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class Flip:
    """Change a worker's role with its weights resident (after `delay_s`, if the worker still lives)."""

    worker: int
    role: Role
    delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Resize:
    """A live worker computes on `devices` from now on, without a restart (its tp becomes len(devices)):
    a lent device joins it, or leaves it on the return. Only where `ControlSetting.live_resize` says the
    runtime can (`pearl train`'s local engines: a device is a core, tp its intra-op threads)."""

    worker: int
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Lend:
    devices: tuple[int, ...]
    deadline: float  # due back by then


@dataclass(frozen=True, slots=True)
class Reclaim:
    devices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SetCap:
    """Admit at most `cap` trajectories in flight (None: the staleness gate alone)."""

    cap: int | None


Action = Union[Start, Stop, Flip, Lend, Reclaim, SetCap, Resize]


def plan_actions(plan: Plan) -> list[Action]:
    """A plan as actions, make-before-break: starts and role flips now (or once the stops they wait
    for are done), stops once their replacements serve."""
    ready = [0.0] * len(plan.steps)
    out: list[Action] = []
    for i, s in enumerate(plan.steps):
        begin = max((ready[j] for j in s.after), default=0.0)
        ready[i] = begin + s.cost_s
        if s.kind is StepKind.START:
            out.append(Start(s.devices, s.role, s.cost_s, begin))
        elif s.kind is StepKind.SET_ROLE:
            out.append(Flip(s.worker, s.role, begin))
        elif s.kind is StepKind.STOP:
            out.append(Stop(s.worker, migrate=True, delay_s=begin))
    return out


# ---------------------------------------------------------------- decisions
def _r(x: float | None, nd: int = 3) -> float | None:
    return round(x, nd) if x is not None and math.isfinite(x) else None


@dataclass(frozen=True)
class Decision:
    """One decision and why. `kind` is "layout" (keep, switch, explore) or "borrow" (lend or not)."""

    t: float
    trigger: str
    kind: str
    switch: bool
    reason: str
    rule: str
    current: str | None = None
    current_pred_s: float | None = None
    candidates: tuple[tuple[str, float, str], ...] = ()  # (shape, predicted batch seconds, bottleneck)
    chosen: str | None = None
    chosen_pred_s: float | None = None
    plan: dict[str, Any] | None = None  # starts, stops, flips, migrated, makespan_s
    gain_s: float | None = None
    cost_s: float | None = None
    borrow: bool | None = None
    estimate: dict[str, float] | None = None  # the workload the controller estimated when it decided

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"t": round(self.t, 3), "trigger": self.trigger, "kind": self.kind,
                             "switch": self.switch, "reason": self.reason, "rule": self.rule,
                             "gain_s": _r(self.gain_s), "cost_s": _r(self.cost_s)}
        if self.kind == "borrow":
            d["borrow"] = self.borrow
            return d
        d.update(current=self.current, current_pred_s=_r(self.current_pred_s),
                 candidates=[list(c) for c in self.candidates], chosen=self.chosen,
                 chosen_pred_s=_r(self.chosen_pred_s), plan=self.plan)
        if self.estimate is not None:
            d["estimate"] = self.estimate
        return d


@dataclass
class Effects:
    """What the controller asks of the runtime after one tick or event."""

    actions: list[Action] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    next_tick_t: float | None = None  # tick again at this time (absolute); None: no tick scheduled
    then: Event | None = None  # evaluate this event on a fresh observation after applying the actions
    trainer_wait_s: float = 0.0  # how long the trainer waits for its devices (TrainerNeedsDevices)
