"""Incremental transition plans: the smallest change that turns today's workers into a target shape.

Job: given the live workers, the free devices and a target `LayoutShape`, decide which workers stay,
which flip role (weights resident: cheap), which stop (their in-flight requests migrate to
survivors) and where new workers start (only on free devices, only when the target needs more
workers than exist), then order those steps make-before-break and cost them. `pearl.control.restart`
holds the ablation (stop everything, start the target from scratch).

The core is one min-cost assignment (scipy's `linear_sum_assignment`): rows are the existing workers
plus candidate start slots (tp free devices on one node); columns are the target's role slots plus
"out" columns (stop a worker / leave a slot unused). The cost is lexicographic: first the number of
starts + stops + flips (the smallest change), then device-seconds of disruption, then placement
(decode/mixed on transient devices is penalised: a prefill worker holds no long-lived KV, so it is
the cheap role to vacate when a lent or elastic device must go).

A target with workers of two tps (a prefill tp of its own, `LayoutShape.tp_prefill`, or colocated side
workers, `LayoutShape.tp_side`) is planned one tp at a time (`LayoutShape.tp_groups`), the larger
first (it needs more devices on one node): the same assignment over the workers of that size and
slots of that size, then the other tp over what is left (free devices not started on, the devices of
workers that stop). A worker of one size never becomes a worker of the other.

What it must not do: touch the cluster state, own time, or import torch, Ray, asyncio or `time`.
It returns a `Plan`; the controller executes it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from enum import Enum
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from pearl.errors import ResourceError
from pearl.types import LayoutShape, Pool, Role

__all__ = ["DeviceView", "InfeasiblePlan", "Plan", "PlanStep", "StepKind", "TransitionCosts",
           "WorkerView", "plan_transition"]


@dataclass(frozen=True)
class DeviceView:
    id: int
    pool: Pool
    node: int
    transient: bool  # a lent train device or an elastic one: may have to go soon


@dataclass(frozen=True)
class WorkerView:
    id: int
    devices: tuple[int, ...]
    role: Role
    transient: bool
    n_active: int  # in-flight requests
    kv_tokens: int  # their KV


@dataclass(frozen=True)
class TransitionCosts:
    flip_s: float = 0.05  # role flip with weights resident (+ drain of requests the new role can run)
    migrate_request_s: float = 0.03  # per in-flight request moved (KV transfer)
    start_s: float = 10.0  # start a worker on a new device (pull weights from a peer)
    stop_s: float = 0.5
    transient_decode_penalty: float = 1.0  # prefer prefill on transient devices, decode/mixed on stable


class StepKind(str, Enum):
    START = "start"
    STOP = "stop"
    SET_ROLE = "set_role"
    MIGRATE = "migrate"


@dataclass(frozen=True)
class PlanStep:
    kind: StepKind
    worker: int | None  # None for a START (the runtime assigns the id)
    devices: tuple[int, ...]  # the devices the step occupies
    role: Role | None  # the role a START / SET_ROLE gives
    cost_s: float  # the step's duration
    reason: str
    after: tuple[int, ...] = ()  # indices of steps this one waits for (always earlier in the plan)


@dataclass(frozen=True)
class Plan:
    target: LayoutShape
    steps: tuple[PlanStep, ...]
    n_starts: int
    n_stops: int
    n_flips: int
    n_migrated: int
    cost_s: float  # device-seconds of disruption: Σ step duration × devices it occupies
    makespan_s: float  # critical path through `after`

    @property
    def n_changes(self) -> int:
        return self.n_starts + self.n_stops + self.n_flips


class InfeasiblePlan(ResourceError, ValueError):
    """The target needs more devices (or tp-sized groups on one node) than workers + free provide."""


# What each role can run, and what a worker's in-flight requests need next. A mixed worker's requests
# are almost all decoding (its prefill chunks finish within a step), so they need decode.
_CAN = {Role.MIXED: frozenset({"prefill", "decode"}), Role.PREFILL: frozenset({"prefill"}),
        Role.DECODE: frozenset({"decode"})}
_NEEDS = {Role.MIXED: "decode", Role.DECODE: "decode", Role.PREFILL: "prefill"}


def _must_migrate(old: Role, new: Role | None) -> bool:
    """A flip keeps the requests the new role can continue; a stop keeps none."""
    return new is None or _NEEDS[old] not in _CAN[new]


def _penalty(role: Role, transient: bool, costs: TransitionCosts) -> float:
    return costs.transient_decode_penalty if transient and role is not Role.PREFILL else 0.0


@dataclass(frozen=True)
class _Slot:
    """tp devices on one node where a worker could start; `owners` are the stopped workers that
    must release some of these devices first (a tp change or a full restart), else it is free."""

    devices: tuple[int, ...]
    transient: bool
    owners: tuple[int, ...] = ()


def _slots(free: Sequence[DeviceView], freed: Sequence[WorkerView], tp: int,
           device_nodes: Mapping[int, int] | None) -> list[_Slot]:
    """Cut devices into tp-sized groups, one node each. Stable devices are grouped first and
    transient ones last, so a group is transient only where it has to be. Devices of a stopped
    worker whose node is unknown stay among themselves (a worker's devices share a node)."""
    by_node: dict[object, list[tuple[bool, bool, int, int | None]]] = {}
    for d in free:
        by_node.setdefault(("n", d.node), []).append((False, d.transient, d.id, None))
    for w in freed:
        for dev in w.devices:
            key = ("n", device_nodes[dev]) if device_nodes and dev in device_nodes else ("w", w.id)
            by_node.setdefault(key, []).append((True, w.transient, dev, w.id))
    out: list[_Slot] = []
    for key in sorted(by_node, key=repr):
        devs = sorted(by_node[key])  # free before freed, stable before transient, then id
        for i in range(0, len(devs) - tp + 1, tp):
            grp = devs[i:i + tp]
            out.append(_Slot(tuple(g[2] for g in grp), any(g[1] for g in grp),
                             tuple(sorted({g[3] for g in grp if g[3] is not None}))))
    return out


def _check_unique(workers: Sequence[WorkerView], free: Sequence[DeviceView]) -> None:
    seen: set[int] = set()
    for dev in [d for w in workers for d in w.devices] + [d.id for d in free]:
        if dev in seen:
            raise ValueError(f"device {dev} appears twice among the workers and free devices")
        seen.add(dev)
    if len({w.id for w in workers}) != len(workers):
        raise ValueError("worker ids are not unique")


def _check_capacity(workers: Sequence[WorkerView], free: Sequence[DeviceView], target: LayoutShape) -> None:
    held, n_free = sum(len(w.devices) for w in workers), len(free)
    if target.n_devices > held + n_free:
        what = " + ".join(f"{len(roles)} × tp {tp}" for tp, roles in target.tp_groups())
        raise InfeasiblePlan(f"target {target} needs {target.n_devices} devices ({what}) but workers hold "
                             f"{held} and {n_free} are free ({held + n_free} in all)")


def _check_slots(target: LayoutShape, n_roles: int, tp: int, n_slots_possible: int) -> None:
    if n_roles > n_slots_possible:
        raise InfeasiblePlan(f"target {target} needs {n_roles} workers of tp {tp} but "
                             f"only {n_slots_possible} can be placed (tp devices on one node each)")


def _left(free: Sequence[DeviceView], freed: Sequence[WorkerView], used: set[int],
          stopped: Sequence[WorkerView]) -> tuple[list[DeviceView], list[WorkerView]]:
    """What a later tp group may start on: the free devices and released devices not `used` by the
    starts planned so far, plus the devices of the workers planned to stop (`stopped`)."""
    rest = [replace(w, devices=tuple(d for d in w.devices if d not in used)) for w in freed]
    return [d for d in free if d.id not in used], [w for w in rest if w.devices] + list(stopped)


class _Builder:
    """Accumulates steps in dependency order and computes the plan's totals."""

    def __init__(self, target: LayoutShape):
        self.target, self.steps, self.n_migrated = target, [], 0

    def add(self, kind: StepKind, worker: int | None, devices: tuple[int, ...], role: Role | None,
            cost_s: float, reason: str, after: Sequence[int] = ()) -> int:
        self.steps.append(PlanStep(kind, worker, devices, role, cost_s, reason, tuple(sorted(set(after)))))
        return len(self.steps) - 1

    def migrate_then(self, w: WorkerView, new: Role | None, costs: TransitionCosts,
                     providers: Sequence[int]) -> list[int]:
        """MIGRATE (if needed) for `w` before it flips to `new` or stops (new=None)."""
        deps = list(providers)
        if w.n_active > 0 and _must_migrate(w.role, new):
            need = _NEEDS[w.role]
            hosts = [r for r in (Role.MIXED, Role.PREFILL, Role.DECODE)
                     if self.target.count(r) and need in _CAN[r]]
            where = (f"surviving {need}-capable workers" if hosts else
                     f"no {need}-capable survivor: they resume from their collected tokens later")
            self.n_migrated += w.n_active
            deps.append(self.add(StepKind.MIGRATE, w.id, w.devices, None,
                                 w.n_active * costs.migrate_request_s,
                                 f"move {w.n_active} in-flight requests ({w.kv_tokens} KV tokens) of "
                                 f"{w.role.value} worker {w.id} to {where}", providers))
        return deps

    def build(self) -> Plan:
        end: list[float] = []
        for s in self.steps:  # steps only wait for earlier ones, so one pass gives the critical path
            end.append(max((end[i] for i in s.after), default=0.0) + s.cost_s)
        kinds = [s.kind for s in self.steps]
        return Plan(self.target, tuple(self.steps), kinds.count(StepKind.START),
                    kinds.count(StepKind.STOP), kinds.count(StepKind.SET_ROLE),
                    self.n_migrated,
                    sum(s.cost_s * len(s.devices) for s in self.steps), max(end, default=0.0))


def _assign(rows: int, ops: np.ndarray, sec: np.ndarray) -> list[int]:
    """Min-cost assignment of rows to columns (target slots, then out columns), lexicographic in
    (ops, secondary cost): `big` exceeds any assignment's total secondary cost."""
    big = 1.0 + float(np.sum(np.max(sec, axis=1))) if rows else 1.0
    _, cols = linear_sum_assignment(ops * big + sec)
    return [int(c) for c in cols]


def plan_transition(workers: Sequence[WorkerView], free: Sequence[DeviceView], target: LayoutShape,
                    costs: TransitionCosts = TransitionCosts(), *,
                    device_nodes: Mapping[int, int] | None = None) -> Plan:
    """The smallest make-before-break plan from `workers` (+ `free` devices) to `target`.

    Workers whose tp differs from the target's cannot fill a slot: they stop, and their devices may
    host new workers once they are released (`device_nodes` maps device → node so that devices of
    different stopped workers can be grouped; without it each stays with its own worker's). A target
    with a per-role tp is planned one tp group at a time (module docstring).
    """
    groups = target.tp_groups()
    sizes = {tp for tp, _ in groups}
    other = sorted((w for w in workers if len(w.devices) not in sizes), key=lambda w: w.id)
    _check_unique(workers, free)
    _check_capacity(workers, free, target)
    surplus = _surplus(workers, groups, costs, device_nodes or {}, free, other)
    flips: list[tuple[WorkerView, Role]] = []
    stops: list[WorkerView] = []
    starts: list[tuple[_Slot, Role]] = []
    free_left, freed_left = list(free), other + surplus
    for tp, roles in groups:
        keep = sorted((w for w in workers if len(w.devices) == tp and w not in surplus), key=lambda w: w.id)
        slots = _slots(free_left, freed_left, tp, device_nodes)
        _check_slots(target, len(roles), tp, len(keep) + len(slots))
        cols = _assign_group(keep, slots, roles, costs, tp)
        n_t = len(roles)
        flips += [(w, roles[c]) for w, c in zip(keep, cols) if c < n_t and roles[c] is not w.role]
        out = [w for w, c in zip(keep, cols) if c >= n_t]
        stops += out
        new = [(sl, roles[c]) for sl, c in zip(slots, cols[len(keep):]) if c < n_t]
        starts += new
        free_left, freed_left = _left(free_left, freed_left, {d for sl, _ in new for d in sl.devices}, out)
    return _ordered(target, flips, stops + surplus + other, starts, costs, sizes)


def _surplus(workers: Sequence[WorkerView], groups: Sequence[tuple[int, list[Role]]], costs: TransitionCosts,
             nodes: Mapping[int, int], free: Sequence[DeviceView], other: Sequence[WorkerView]) -> list[WorkerView]:
    """Workers of a later tp group's size that stop whatever the plan, so that the first (larger) group
    may start on their devices: those beyond that group's role slots (the same assignment as the
    group's own, without start slots; among equals, the last in (node, device) order); and where the
    first group would lack places, the ones whose devices complete groups of its tp on one node (with
    the free devices and those of the `other` workers that stop): they start again elsewhere."""
    out: list[WorkerView] = []
    (big, big_roles), n_big = groups[0], sum(len(w.devices) == groups[0][0] for w in workers)
    for tp, roles in groups[1:]:
        same = sorted((w for w in workers if len(w.devices) == tp), key=lambda w: w.id)
        pick: list[WorkerView] = []
        if len(same) > len(roles):
            order = sorted(range(len(same)), key=lambda i: (nodes.get(same[i].devices[0], -1), same[i].devices))
            cols = _assign_group(same, [], roles, costs, tp, [1e-6 * (len(same) - order.index(i)) for i in range(len(same))])
            pick = [w for w, c in zip(same, cols) if c >= len(roles)]
        if n_big + len(_slots(free, [*other, *out, *pick], big, nodes)) < len(big_roles):
            short = len(big_roles) - n_big - len(_slots(free, [*other, *out], big, nodes))
            pick = _completing(same, pick, big, nodes, free, [*other, *out], short)
        out += pick
    return out


def _completing(same: Sequence[WorkerView], pick: Sequence[WorkerView], big: int, nodes: Mapping[int, int],
                free: Sequence[DeviceView], stopped: Sequence[WorkerView], short: int) -> list[WorkerView]:
    """Workers of `same` to stop, at least as many as `pick` holds, chosen so that their devices, with
    the free ones and those of `stopped`, make `short` more groups of `big` devices on one node (as
    many as they can): node by node, the one that completes a group with the fewest stops first;
    the rest as in `pick`."""
    room = Counter([d.node for d in free] + [nodes.get(x) for w in stopped for x in w.devices])
    on: dict[object, list[WorkerView]] = {}
    for w in same:
        on.setdefault(nodes.get(w.devices[0]), []).append(w)
    out: list[WorkerView] = []
    while short > 0:
        need = {n: -(-(big - room[n] % big) // len(ws[0].devices)) for n, ws in on.items() if ws}
        ok = [n for n in need if need[n] <= len(on[n])]
        if not ok:
            break
        n = min(ok, key=lambda x: (need[x], repr(x)))
        out += on[n][:need[n]]
        room[n] += sum(len(w.devices) for w in on[n][:need[n]])
        on[n], short = on[n][need[n]:], short - 1
    return out + [w for w in dict.fromkeys([*pick, *same]) if w not in out][:len(pick) - len(out)]


def _assign_group(keep: Sequence[WorkerView], slots: Sequence[_Slot], roles: Sequence[Role],
                  costs: TransitionCosts, tp: int, stop_bias: Sequence[float] = ()) -> list[int]:
    """The min-cost assignment of the workers of one size (`keep`) and the start `slots` of that size
    to the role slots (`roles`) or out (stop / unused): each row's column. `stop_bias`: a tie-break
    added to each worker's stop."""
    n_rows, n_t = len(keep) + len(slots), len(roles)
    n_cols = n_rows  # target slots + (n_rows - n_t) out columns: every row gets exactly one
    ops, sec = np.zeros((n_rows, n_cols)), np.zeros((n_rows, n_cols))
    for i, w in enumerate(keep):
        k = len(w.devices)
        move = w.n_active * costs.migrate_request_s * k
        for j, r in enumerate(roles):
            if r is w.role:
                sec[i, j] = _penalty(r, w.transient, costs)
            else:
                ops[i, j] = 1
                sec[i, j] = costs.flip_s * k + (move if _must_migrate(w.role, r) else 0.0) \
                    + _penalty(r, w.transient, costs)
        ops[i, n_t:], sec[i, n_t:] = 1, costs.stop_s * k + move + (stop_bias[i] if stop_bias else 0.0)
    for i, s in enumerate(slots, start=len(keep)):
        for j, r in enumerate(roles):
            ops[i, j] = 1
            # A slot that waits for a stop breaks before it makes: a tiny preference for free ones.
            sec[i, j] = costs.start_s * tp + _penalty(r, s.transient, costs) + (1e-3 if s.owners else 0.0)
    return _assign(n_rows, ops, sec)


def _ordered(target: LayoutShape, flips: list[tuple[WorkerView, Role]], stops: list[WorkerView],
             starts: list[tuple[_Slot, Role]], costs: TransitionCosts, sizes: set[int]) -> Plan:
    """Order the chosen changes make-before-break:
    1. starts on free devices (nothing to wait for);
    2. flips that only gain a function (prefill/decode → mixed): they drain nothing;
    3. flips that lose a function, then stops: each waits for the steps of (1)–(2) that provide what
       it loses (its capacity's replacement), and for the migration of its requests;
    4. starts on devices released by stops (tp change, restart), after those stops.
    """
    b = _Builder(target)
    providers: list[tuple[int, frozenset[str]]] = []  # (step index, functions it adds)
    for s, r in starts:
        if not s.owners:
            i = b.add(StepKind.START, None, s.devices, r, costs.start_s,
                      f"new {r.value} worker on free {'transient' if s.transient else 'stable'} "
                      f"devices {list(s.devices)} (pulls weights from a peer)")
            providers.append((i, _CAN[r]))
    lossy: list[tuple[WorkerView, Role]] = []
    for w, r in sorted(flips, key=lambda f: f[0].id):
        if _CAN[w.role] < _CAN[r]:
            i = b.add(StepKind.SET_ROLE, w.id, w.devices, r, costs.flip_s,
                      f"flip {w.role.value}→{r.value}: weights resident, its requests stay")
            providers.append((i, _CAN[r] - _CAN[w.role]))
        else:
            lossy.append((w, r))

    def waits_for(lost: frozenset[str]) -> list[int]:
        return [i for i, adds in providers if adds & lost]

    for w, r in lossy:
        deps = b.migrate_then(w, r, costs, waits_for(_CAN[w.role] - _CAN[r]))
        b.add(StepKind.SET_ROLE, w.id, w.devices, r, costs.flip_s,
              f"flip {w.role.value}→{r.value}: weights resident, cheaper than stop + start", deps)
    stop_at: dict[int, int] = {}
    for w in stops:
        deps = b.migrate_then(w, None, costs, waits_for(_CAN[w.role]))
        tp = "/".join(str(x) for x in sorted(sizes, reverse=True))
        why = (f"tp {len(w.devices)} ≠ target tp {tp}" if len(w.devices) not in sizes else
               f"surplus {w.role.value} worker (target has {target.count(w.role)})")
        stop_at[w.id] = b.add(StepKind.STOP, w.id, w.devices, None, costs.stop_s, why, deps)
    for s, r in starts:
        if s.owners:
            b.add(StepKind.START, None, s.devices, r, costs.start_s,
                  f"new {r.value} worker on devices {list(s.devices)} released by workers "
                  f"{list(s.owners)} (pulls weights from a peer)", [stop_at[o] for o in s.owners])
    return b.build()
