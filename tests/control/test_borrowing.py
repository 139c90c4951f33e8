"""Tests of pearl.control.borrowing: the trainer never waits for its devices beyond the bound (a
property over random idle windows, costs, loads and early batches), lending is refused when the
window is too short or the return too slow, and returns drain when they can and migrate otherwise."""
from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pearl.config import PolicyConfig
from pearl.control.borrowing import (BorrowPlanner, ReturnKind, max_requests_within, must_return)

MIG, STOP = 0.03, 0.5


@settings(max_examples=400, deadline=None)
@given(now=st.floats(0, 1e4), idle=st.floats(0, 600), n_dev=st.integers(1, 8),
       gain=st.floats(0.0, 0.5), start=st.floats(0, 60), bound=st.floats(0.5, 10),
       loads=st.lists(st.integers(0, 400), min_size=1, max_size=4), drain_rate=st.floats(0.01, 100),
       early=st.floats(0, 1), ret_frac=st.floats(0, 1), capped=st.booleans())
def test_trainer_wait_never_exceeds_the_bound(now, idle, n_dev, gain, start, bound, loads, drain_rate,
                                              early, ret_frac, capped):
    bp = BorrowPlanner(return_bound_s=bound)
    # The controller's return-cost estimate bounds migrating whatever a lent worker holds; when it
    # also caps admission to lent workers, that estimate fits in the bound (else lending is refused).
    if capped:
        loads = [min(n, max_requests_within(bound, MIG, STOP)) for n in loads]
    return_cost = max(n * MIG + STOP for n in loads)
    v = bp.should_lend(now, now + idle, n_dev, gain, start, return_cost)
    assume(v.lend)
    lent = [(100 + i, i, n) for i, n in enumerate(loads)]
    # The batch is ready at some time between lending and a little after the prediction; the
    # controller starts the return at the planned time or when the trainer is ready, whichever first.
    ready = now + early * (idle + 30)
    if ready < v.return_start_at:
        assert must_return(ready, v, trainer_ready=True)
        begin, deadline = ready, ready + bound
    else:
        assert must_return(v.return_start_at, v, trainer_ready=False)
        begin, deadline = v.return_start_at, v.deadline
    acts = bp.return_plan(begin, lent, deadline, drain_rate, migrate_request_s=MIG, stop_s=STOP)
    assert {a.worker for a in acts} == set(range(len(loads)))
    back = max(a.done_by for a in acts)
    # the actual return may also run faster than estimated: never slower than the plan's done_by
    back = begin + ret_frac * (back - begin)
    wait = max(0.0, back - ready)
    assert wait <= bound + 1e-9
    if ready >= v.deadline:
        assert back <= v.deadline + 1e-9  # on the planned path the devices are back in time


def test_refuses_when_the_window_is_too_short():
    bp = BorrowPlanner(return_bound_s=5.0)  # safety = 0.25 + 0.2 * return
    v = bp.should_lend(100.0, 112.0, 4, 0.5, start_cost_s=10.0, return_cost_s=2.0)
    assert not v.lend and v.rule == "window" and v.n_devices == 0
    assert v.window_s == pytest.approx(12 - 10 - 2 - 0.65)
    v = bp.should_lend(100.0, 120.0, 4, 0.5, start_cost_s=10.0, return_cost_s=2.0)
    assert v.lend and v.n_devices == 4
    assert v.deadline == 120.0 and v.return_start_at == pytest.approx(120 - 2 - 0.65)
    assert v.window_s == pytest.approx(20 - 10 - 2 - 0.65)
    assert v.gain_s == pytest.approx(4 * 0.5 * v.window_s)
    assert not bp.should_lend(100.0, 90.0, 4, 0.5, 10.0, 2.0).lend  # the batch is already due


def test_refuses_a_return_slower_than_the_bound():
    v = BorrowPlanner(return_bound_s=5.0).should_lend(0.0, 300.0, 4, 0.5, 10.0, return_cost_s=6.0)
    assert not v.lend and v.rule == "bound"


def test_refuses_when_the_gain_does_not_pay_or_nothing_to_lend():
    bp = BorrowPlanner(return_bound_s=5.0, min_gain_s=1.0)
    assert bp.should_lend(0.0, 300.0, 4, 0.0, 10.0, 2.0).rule == "no-gain"
    assert bp.should_lend(0.0, 300.0, 4, 0.001, 10.0, 2.0).lend  # 4 × 0.001 × 287 s > 1 s
    assert bp.should_lend(0.0, 300.0, 0, 0.5, 10.0, 2.0).rule == "no-devices"


def test_return_plan_drains_when_it_fits_and_migrates_when_not():
    bp = BorrowPlanner(return_bound_s=5.0)
    lent = [(10, 1, 4), (11, 1, 4), (12, 2, 40), (13, 3, 0)]  # worker 1 spans two devices (tp 2)
    acts = {a.worker: a for a in bp.return_plan(0.0, lent, deadline=3.0, drain_rate=2.0)}
    assert acts[1].kind is ReturnKind.DRAIN and acts[1].devices == (10, 11)
    assert acts[1].done_by == pytest.approx(4 / 2.0 + 0.5)
    assert acts[2].kind is ReturnKind.MIGRATE and acts[2].n_requests == 40
    assert acts[2].done_by == pytest.approx(40 * 0.03 + 0.5) and "late" not in acts[2].reason
    assert acts[3].kind is ReturnKind.DRAIN and acts[3].done_by == pytest.approx(0.5)
    # past saving: still the fastest way out, flagged late
    (late,) = bp.return_plan(0.0, [(12, 2, 400)], deadline=3.0, drain_rate=0.0)
    assert late.kind is ReturnKind.MIGRATE and "late" in late.reason


def test_helpers_and_config():
    assert max_requests_within(5.0, 0.03, 0.5) == 150
    assert max_requests_within(0.2, 0.03, 0.5) == 0
    assert max_requests_within(5.0, 0.0, 0.5) == math.inf
    bp = BorrowPlanner.from_policy(PolicyConfig(return_bound_s=2.0))
    assert bp.return_bound_s == 2.0
    v = bp.should_lend(0.0, 300.0, 2, 0.5, 10.0, 1.0)
    assert not must_return(v.return_start_at - 1, v, trainer_ready=False)
    assert must_return(v.return_start_at, v, trainer_ready=False)
    with pytest.raises(ValueError, match="return_bound_s"):
        BorrowPlanner(return_bound_s=-1)
