"""Tests of pearl.control.planner: the incremental plan is the smallest change (checked against brute
force on small random cases), lands exactly on the target, never reuses a device, starts only on
free devices, orders make-before-break, and is never costlier than the full-restart ablation."""
from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.control.planner import (DeviceView, InfeasiblePlan, Plan, PlanStep, StepKind, TransitionCosts,
                                   WorkerView, plan_transition)
from pearl.control.restart import plan_full_restart
from pearl.types import LayoutShape, Pool, Role

M, P, D = Role.MIXED, Role.PREFILL, Role.DECODE
C = TransitionCosts()
# Which functions a role has; independent of the planner's own tables on purpose.
CAN = {M: {"prefill", "decode"}, P: {"prefill"}, D: {"decode"}}
# A flip migrates the worker's requests when the new role cannot continue them.
MIGRATES = {(M, P), (D, P), (P, D)}


def wv(i, role, n=0, transient=False, devices=None):
    return WorkerView(i, devices or (i,), role, transient, n, 100 * n)


def dv(i, transient=False, node=0):
    return DeviceView(i, Pool.ELASTIC if transient else Pool.ROLLOUT, node, transient)


def apply_plan(workers, plan: Plan) -> list[tuple[int | None, tuple[int, ...], Role]]:
    """The layout after `plan` runs: (worker id, or None for a new one; devices; role) per worker."""
    live = {w.id: (w.devices, w.role) for w in workers}
    new: list[tuple[int | None, tuple[int, ...], Role]] = []
    for s in plan.steps:
        if s.kind is StepKind.SET_ROLE:
            live[s.worker] = (live[s.worker][0], s.role)
        elif s.kind is StepKind.STOP:
            del live[s.worker]
        elif s.kind is StepKind.START:
            new.append((None, s.devices, s.role))
    return [(i, d, r) for i, (d, r) in sorted(live.items())] + new


# ------------------------------------------------------------------ brute force

def brute(workers, n_free, target, costs=C):
    """Min over every assignment of (changes, device-seconds): each worker keeps its role, flips to
    another or stops; the target's remaining slots are started on free devices (tp 1)."""
    best = None
    for choice in itertools.product([None, M, P, D], repeat=len(workers)):
        counts = {r: sum(1 for c in choice if c is r) for r in (M, P, D)}
        if any(counts[r] > target.count(r) for r in counts):
            continue
        n_start = target.n_workers - sum(counts.values())
        if n_start > n_free:
            continue
        changes, cost = n_start, n_start * costs.start_s
        for w, c in zip(workers, choice):
            move = w.n_active * costs.migrate_request_s
            if c is None:
                changes, cost = changes + 1, cost + costs.stop_s + move
            elif c is not w.role:
                changes += 1
                cost += costs.flip_s + (move if (w.role, c) in MIGRATES else 0.0)
        if best is None or (changes, cost) < best:
            best = (changes, cost)
    return best


@st.composite
def cases(draw):
    n_w = draw(st.integers(0, 6))
    n_f = draw(st.integers(0, 4))
    workers = [wv(i, draw(st.sampled_from([M, P, D])), draw(st.integers(0, 5)), draw(st.booleans()))
               for i in range(n_w)]
    free = [dv(10 + i, draw(st.booleans())) for i in range(n_f)]
    n_t = draw(st.integers(0, n_w + n_f))
    if draw(st.booleans()):
        target = LayoutShape.colocated(n_t)
    else:
        p = draw(st.integers(0, n_t))
        target = LayoutShape.disaggregated(p, n_t - p)
    return workers, free, target


def closure(steps: tuple[PlanStep, ...], i: int) -> set[int]:
    seen, todo = set(), list(steps[i].after)
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(steps[j].after)
    return seen


def check_plan(workers, free, target, plan):
    """Lands on the target, reuses no device, and orders make-before-break. A start may only use free
    devices or ones released by a stopped worker (a tp change), and then waits for those stops.
    Providers of a function are starts on free devices (they wait for nothing) and flips that only
    gain one (prefill/decode → mixed, which drain nothing and also wait for nothing); every stop and
    every lossy flip waits, directly or through others, for each provider of a function it loses."""
    free_ids = {d.id for d in free}
    by_worker = {w.id: w for w in workers}
    owner = {d: w.id for w in workers for d in w.devices}
    stop_at = {s.worker: i for i, s in enumerate(plan.steps) if s.kind is StepKind.STOP}
    released = {d for wid in stop_at for d in by_worker[wid].devices}
    # lands exactly on the target, no device twice, new workers only on free or released devices
    layout = apply_plan(workers, plan)
    assert sorted(r.value for _, _, r in layout) == sorted(r.value for r in target.roles())
    used = [d for _, devs, _ in layout for d in devs]
    assert len(used) == len(set(used))
    assert all(set(devs) <= free_ids | released for wid, devs, _ in layout if wid is None)
    starts = [i for i, s in enumerate(plan.steps) if s.kind is StepKind.START]
    assert plan.n_starts == len(starts) and len(starts) * target.tp <= len(free) + len(released)
    assert plan.n_stops == len(stop_at)
    # what each provider adds
    provides: dict[int, set[str]] = {}
    for i, s in enumerate(plan.steps):
        if s.kind is StepKind.START and set(s.devices) <= free_ids:
            provides[i] = CAN[s.role]
        elif s.kind is StepKind.SET_ROLE and CAN[by_worker[s.worker].role] < CAN[s.role]:
            provides[i] = CAN[s.role] - CAN[by_worker[s.worker].role]
    for i, s in enumerate(plan.steps):
        assert all(j < i for j in s.after)  # steps only wait for earlier steps
        if s.kind is StepKind.START:
            assert len(s.devices) == target.tp
            # break-before-make only where a device is reused: after its old worker's stop
            assert set(s.after) == {stop_at[owner[d]] for d in s.devices if d not in free_ids}
            continue
        w = by_worker[s.worker]
        if s.kind is StepKind.MIGRATE:
            # a migration serves exactly one later stop/flip of the same worker, which waits for it
            (k,) = [k for k, t in enumerate(plan.steps) if i in t.after and t.worker == w.id]
            assert plan.steps[k].kind in (StepKind.STOP, StepKind.SET_ROLE)
            continue
        if i in provides:  # a flip that only gains drains nothing: it waits for nothing
            assert s.kind is StepKind.SET_ROLE and not s.after
            continue
        lost = CAN[w.role] - (CAN[s.role] if s.kind is StepKind.SET_ROLE else set())
        assert lost
        # make-before-break: every start or flip providing what this worker loses comes first
        before = closure(plan.steps, i)
        for j, adds in provides.items():
            if adds & lost:
                assert j in before, (s, plan.steps[j])
        new_role = s.role if s.kind is StepKind.SET_ROLE else None
        migrates = w.n_active > 0 and (new_role is None or (w.role, new_role) in MIGRATES)
        assert migrates == any(plan.steps[j].kind is StepKind.MIGRATE and plan.steps[j].worker == w.id
                               for j in s.after)


# ------------------------------------------------------------------ properties

@settings(max_examples=300, deadline=None)
@given(cases())
def test_incremental_plan_is_minimal_and_well_formed(case):
    workers, free, target = case
    plan = plan_transition(workers, free, target, C)
    check_plan(workers, free, target, plan)
    changes, _ = brute(workers, len(free), target)
    assert plan.n_changes == changes
    restart = plan_full_restart(workers, free, target, C)
    assert restart.n_changes >= plan.n_changes
    assert restart.cost_s >= plan.cost_s - 1e-9
    assert sorted(r.value for _, _, r in apply_plan(workers, restart)) == sorted(r.value for r in target.roles())


@settings(max_examples=200, deadline=None)
@given(cases())
def test_without_placement_penalty_the_cost_is_minimal_too(case):
    # With no transient preference the secondary objective is exactly device-seconds (tp 1), so the
    # plan's cost must equal brute force's cheapest among the smallest changes.
    workers, free, target = case
    costs = TransitionCosts(transient_decode_penalty=0.0)
    plan = plan_transition(workers, free, target, costs)
    _, cost = brute(workers, len(free), target, costs)
    assert plan.cost_s == pytest.approx(cost, abs=1e-9)


# ------------------------------------------------------------------ choices

def test_mode_change_is_role_flips_and_picks_the_idlest_worker_for_prefill():
    workers = [wv(0, M, 7), wv(1, M, 2), wv(2, M, 9), wv(3, M, 5)]
    plan = plan_transition(workers, [], LayoutShape.disaggregated(1, 3))
    assert (plan.n_starts, plan.n_stops, plan.n_flips) == (0, 0, 4)
    (to_p,) = [s for s in plan.steps if s.kind is StepKind.SET_ROLE and s.role is P]
    assert to_p.worker == 1 and plan.n_migrated == 2  # only the prefill flip moves requests
    assert plan.makespan_s == pytest.approx(2 * C.migrate_request_s + C.flip_s)


def test_starts_put_prefill_on_transient_and_decode_on_stable_devices():
    plan = plan_transition([wv(0, P), wv(1, D)], [dv(10, transient=True), dv(11)],
                           LayoutShape.disaggregated(2, 2))
    placed = {s.devices: s.role for s in plan.steps if s.kind is StepKind.START}
    assert placed == {(10,): P, (11,): D}


def test_surplus_stop_prefers_fewest_requests_then_transient():
    plan = plan_transition([wv(0, D, 4), wv(1, D, 1), wv(2, D, 1, transient=True)], [],
                           LayoutShape.disaggregated(0, 2))
    (stop,) = [s for s in plan.steps if s.kind is StepKind.STOP]
    assert stop.worker == 2 and plan.n_migrated == 1


def test_make_before_break_flips_wait_for_the_start_that_replaces_them():
    # Two mixed workers -> 1P:2D with one free device: start a prefill worker and flip both mixed
    # workers to decode (their requests stay), rather than starting decode and migrating to prefill.
    plan = plan_transition([wv(0, M, 3), wv(1, M, 2)], [dv(10)], LayoutShape.disaggregated(1, 2))
    assert (plan.n_starts, plan.n_flips, plan.n_migrated) == (1, 2, 0)
    assert plan.steps[0].kind is StepKind.START and plan.steps[0].role is P
    assert all(s.after == (0,) for s in plan.steps[1:])
    assert plan.makespan_s == pytest.approx(C.start_s + C.flip_s)
    assert plan.cost_s == pytest.approx(C.start_s + 2 * C.flip_s)


def test_stop_migrates_then_stops_after_replacement():
    # A transient decode worker is replaced by a decode worker on a stable free device... only when
    # the target needs the change: here the target shrinks, so only a stop with a migration.
    plan = plan_transition([wv(0, D, 5), wv(1, D, 0)], [], LayoutShape.disaggregated(0, 1))
    assert [s.kind for s in plan.steps] == [StepKind.STOP]
    plan = plan_transition([wv(0, D, 5), wv(1, P, 2)], [dv(10)], LayoutShape.disaggregated(0, 2))
    kinds = [s.kind for s in plan.steps]
    # P->D flip (its prefill requests migrate first) beats a start + stop
    assert kinds == [StepKind.MIGRATE, StepKind.SET_ROLE] and plan.n_migrated == 2


def test_stop_waits_for_its_replacement_start():
    # A tp-1 mixed worker cannot serve a tp-2 target: a tp-2 mixed worker starts on two free devices
    # and the old one stops (its request migrating) only once the new one is up: make before break.
    free = [dv(10), dv(11)]
    plan = plan_transition([wv(0, M, 1)], free, LayoutShape.colocated(1, tp=2),
                           device_nodes={0: 0, 10: 0, 11: 0})
    assert [s.kind for s in plan.steps] == [StepKind.START, StepKind.MIGRATE, StepKind.STOP]
    start, migrate, stop = plan.steps
    assert start.devices == (10, 11) and start.role is M and start.after == ()
    assert migrate.after == (0,) and stop.after == (0, 1)
    assert plan.makespan_s == pytest.approx(C.start_s + C.migrate_request_s + C.stop_s)
    check_plan([wv(0, M, 1)], free, LayoutShape.colocated(1, tp=2), plan)


def test_stop_waits_for_the_flip_that_takes_over_its_role():
    # 1P:1D -> one mixed worker: the busier decode worker flips to mixed (keeping its requests) and
    # the idle prefill worker stops, but only after the flip gives the cluster prefill again.
    workers = [wv(0, P, 0), wv(1, D, 4)]
    plan = plan_transition(workers, [], LayoutShape.colocated(1))
    assert [(s.kind, s.worker) for s in plan.steps] == [(StepKind.SET_ROLE, 1), (StepKind.STOP, 0)]
    assert plan.steps[0].role is M and plan.steps[0].after == ()
    assert plan.steps[1].after == (0,)
    assert plan.makespan_s == pytest.approx(C.flip_s + C.stop_s)
    check_plan(workers, [], LayoutShape.colocated(1), plan)
    # and a stop that migrates waits for both its migration and the flip
    workers = [wv(0, P, 2), wv(1, D, 4)]
    plan = plan_transition(workers, [], LayoutShape.colocated(1))
    kinds = [(s.kind, s.worker) for s in plan.steps]
    assert kinds == [(StepKind.SET_ROLE, 1), (StepKind.MIGRATE, 0), (StepKind.STOP, 0)], kinds
    assert plan.steps[1].after == (0,) and plan.steps[2].after == (0, 1)
    check_plan(workers, [], LayoutShape.colocated(1), plan)


def test_tp_change_stops_then_starts_on_released_devices():
    workers = [wv(0, M, 1), wv(1, M, 0)]
    nodes = {0: 0, 1: 0}
    plan = plan_transition(workers, [], LayoutShape.colocated(1, tp=2), device_nodes=nodes)
    assert (plan.n_stops, plan.n_starts) == (2, 1)
    start = plan.steps[-1]
    assert start.kind is StepKind.START and start.devices == (0, 1)
    stops = {i for i, s in enumerate(plan.steps) if s.kind is StepKind.STOP}
    assert set(start.after) == stops
    check_plan(workers, [], LayoutShape.colocated(1, tp=2), plan)
    # without node information the two devices cannot be grouped
    with pytest.raises(InfeasiblePlan, match="only 0 can be placed"):
        plan_transition(workers, [], LayoutShape.colocated(1, tp=2))


def test_tp2_starts_group_devices_on_one_node():
    free = [dv(10, node=0), dv(11, node=1), dv(12, node=0), dv(13, node=1)]
    plan = plan_transition([], free, LayoutShape.disaggregated(1, 1, tp=2))
    assert sorted(s.devices for s in plan.steps) == [(10, 12), (11, 13)]
    assert plan.cost_s == pytest.approx(2 * 2 * C.start_s)


def test_not_enough_devices_names_the_numbers():
    with pytest.raises(ValueError, match=r"needs 5 devices .* workers hold 2 and 2 are free \(4 in all\)"):
        plan_transition([wv(0, M), wv(1, M)], [dv(10), dv(11)], LayoutShape.colocated(5))


def test_bad_inputs():
    with pytest.raises(ValueError, match="device 0 appears twice"):
        plan_transition([wv(0, M)], [dv(0)], LayoutShape.colocated(1))
    with pytest.raises(ValueError, match="worker ids"):
        plan_transition([wv(0, M, devices=(0,)), wv(0, M, devices=(1,))], [], LayoutShape.colocated(1))


def test_no_change_and_empty():
    workers = [wv(0, P), wv(1, D), wv(2, D)]
    plan = plan_transition(workers, [dv(10)], LayoutShape.disaggregated(1, 2))
    assert plan.steps == () and plan.cost_s == 0 and plan.makespan_s == 0
    assert plan_transition([], [], LayoutShape.colocated(0)).steps == ()


def test_full_restart_stops_everything_first():
    workers = [wv(0, M, 2), wv(1, M, 0)]
    plan = plan_full_restart(workers, [], LayoutShape.colocated(2))
    assert (plan.n_stops, plan.n_starts, plan.n_migrated) == (2, 2, 2)
    for s in plan.steps:
        if s.kind is StepKind.START:
            assert any(plan.steps[j].kind is StepKind.STOP for j in s.after)
    assert plan.makespan_s == pytest.approx(2 * C.migrate_request_s + C.stop_s + C.start_s)
    assert plan_transition(workers, [], LayoutShape.colocated(2)).steps == ()


def test_decision_modules_import_no_runtime():
    # The controller's pure core gets time as data: no torch, Ray, asyncio or `time` (architecture.md).
    import ast
    import importlib

    for name in ("pearl.control.planner", "pearl.control.switching", "pearl.control.borrowing"):
        tree = ast.parse(open(importlib.import_module(name).__file__).read())
        mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not mods & {"torch", "ray", "asyncio", "time"}, (name, mods)


def test_duplicate_device_is_caught_before_grouping():
    # a worker whose tp differs from the target's releases its devices into the grouping
    with pytest.raises(ValueError, match="device 1 appears twice"):
        plan_transition([wv(0, M, devices=(0, 1))], [dv(1)], LayoutShape.colocated(1))
    with pytest.raises(ValueError, match="device 1 appears twice"):
        plan_full_restart([wv(0, M, devices=(1,))], [dv(1)], LayoutShape.colocated(1))


@st.composite
def tp_cases(draw):
    nodes: dict[int, int] = {}
    workers, dev = [], 0
    for i in range(draw(st.integers(0, 4))):
        tp, node = draw(st.sampled_from([1, 2])), draw(st.integers(0, 1))
        devs = tuple(range(dev, dev + tp))
        nodes.update({d: node for d in devs})
        dev += tp
        workers.append(wv(i, draw(st.sampled_from([M, P, D])), draw(st.integers(0, 3)),
                          draw(st.booleans()), devices=devs))
    free = [dv(100 + j, draw(st.booleans()), node=draw(st.integers(0, 1))) for j in range(draw(st.integers(0, 4)))]
    tp = draw(st.sampled_from([1, 2]))
    n_t = draw(st.integers(0, 5))
    p = draw(st.integers(0, n_t))
    target = LayoutShape.colocated(n_t, tp) if draw(st.booleans()) else LayoutShape.disaggregated(p, n_t - p, tp)
    return workers, free, target, nodes


@settings(max_examples=200, deadline=None)
@given(tp_cases())
def test_tp_changes_are_well_formed(case):
    workers, free, target, nodes = case
    nodes = {**nodes, **{d.id: d.node for d in free}}
    for planner in (plan_transition, plan_full_restart):
        try:
            plan = planner(workers, free, target, device_nodes=nodes)
        except InfeasiblePlan:
            continue
        if planner is plan_transition:
            # landing, devices and make-before-break (stops and lossy flips after their replacements)
            check_plan(workers, free, target, plan)
            # never more changes than the restart
            assert plan.n_changes <= plan_full_restart(workers, free, target, device_nodes=nodes).n_changes
        layout = apply_plan(workers, plan)
        assert sorted(r.value for _, _, r in layout) == sorted(r.value for r in target.roles())
        used = [d for _, devs, _ in layout for d in devs]
        assert len(used) == len(set(used))
        stopped = {s.worker: i for i, s in enumerate(plan.steps) if s.kind is StepKind.STOP}
        owner = {d: w.id for w in workers for d in w.devices}
        for i, s in enumerate(plan.steps):
            assert all(j < i for j in s.after)
            if s.kind is StepKind.START:
                assert len(s.devices) == target.tp and len({nodes[d] for d in s.devices}) == 1
                # break-before-make only where a device is reused: after its old worker's stop
                assert {stopped[owner[d]] for d in s.devices if d in owner} <= set(s.after)
