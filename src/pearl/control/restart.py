"""The full-restart ablation of the transition planner (`pearl.control.planner`): stop every worker,
then start the target from scratch on the free devices and the released ones. Placement is the
planner's, so a comparison with `plan_transition` isolates incrementality.

What it must not do: touch the cluster state, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from pearl.control.planner import (DeviceView, Plan, StepKind, TransitionCosts, WorkerView, _assign, _Builder,
                                   _check_capacity, _check_slots, _check_unique, _left, _penalty, _Slot, _slots)
from pearl.types import LayoutShape, Role

__all__ = ["plan_full_restart"]


def plan_full_restart(workers: Sequence[WorkerView], free: Sequence[DeviceView], target: LayoutShape,
                      costs: TransitionCosts = TransitionCosts(), *,
                      device_nodes: Mapping[int, int] | None = None) -> Plan:
    """The ablation: stop every worker (its requests leave, token-level), then start the whole
    target from scratch on the free devices and the released ones. Placement still puts prefill on
    transient devices, so the comparison with `plan_transition` isolates incrementality."""
    ws = sorted(workers, key=lambda w: w.id)
    _check_unique(workers, free)
    _check_capacity(workers, free, target)
    starts: list[tuple[_Slot, Role]] = []
    free_left, freed_left = list(free), list(ws)
    for tp, roles in target.tp_groups():
        slots = _slots(free_left, freed_left, tp, device_nodes)
        _check_slots(target, len(roles), tp, len(slots))
        n = len(slots)
        ops, sec = np.zeros((n, n)), np.zeros((n, n))
        for i, s in enumerate(slots):
            for j, r in enumerate(roles):
                ops[i, j], sec[i, j] = 1, _penalty(r, s.transient, costs)
        cols = _assign(n, ops, sec)
        new = [(s, roles[c]) for s, c in zip(slots, cols) if c < len(roles)]
        starts += new
        free_left, freed_left = _left(free_left, freed_left, {d for sl, _ in new for d in sl.devices}, ())
    b = _Builder(target)
    stop_at: dict[int, int] = {}
    for w in ws:
        deps = b.migrate_then(w, None, costs, ())
        stop_at[w.id] = b.add(StepKind.STOP, w.id, w.devices, None, costs.stop_s, "full restart", deps)
    for s, r in starts:
        b.add(StepKind.START, None, s.devices, r, costs.start_s,
              f"full restart: new {r.value} worker on devices {list(s.devices)}",
              [stop_at[o] for o in s.owners])
    return b.build()
