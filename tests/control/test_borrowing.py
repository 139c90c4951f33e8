"""Tests of pearl.control.borrowing: the trainer never waits for its devices beyond the bound (a
property over random idle windows, costs and early batches), and lending is refused when the window
is too short, the return too slow or the gain too small."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pearl.config import PolicyConfig
from pearl.control.borrowing import BorrowPlanner


# Most random windows are refused (the property is about the lends), so many draws are filtered out.
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(now=st.floats(0, 1e4), idle=st.floats(0, 600), n_dev=st.integers(1, 8),
       gain=st.floats(0.0, 0.5), start=st.floats(0, 60), bound=st.floats(0.5, 10),
       return_cost=st.floats(0, 12), early=st.floats(0, 1), ret_frac=st.floats(0, 1))
def test_trainer_wait_never_exceeds_the_bound(now, idle, n_dev, gain, start, bound, return_cost, early,
                                              ret_frac):
    bp = BorrowPlanner(return_bound_s=bound)
    v = bp.should_lend(now, now + idle, n_dev, gain, start, return_cost)
    assume(v.lend)
    assert v.n_devices == n_dev and v.window_s > 0 and v.gain_s > bp.min_gain_s
    assert now + start < v.return_start_at  # the lent workers start before the return is due
    # on the planned path even a return slower than estimated by the safety margin is back in time
    assert v.return_start_at + return_cost + bp.safety(return_cost) <= v.deadline + 1e-9
    # The batch is ready at some time between lending and a little after the prediction; the caller
    # starts the return at the planned time or when the trainer is ready, whichever first, and the
    # return takes at most its estimate.
    ready = now + early * (idle + 30)
    begin = min(ready, v.return_start_at)
    back = begin + ret_frac * return_cost
    assert max(0.0, back - ready) <= bound + 1e-9
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


def test_config_and_validation():
    bp = BorrowPlanner.from_policy(PolicyConfig(return_bound_s=2.0))
    assert bp.return_bound_s == 2.0
    assert bp.safety(1.0) == pytest.approx(0.25 + 0.2 * 1.0)
    assert bp.should_lend(0.0, 300.0, 2, 0.5, 10.0, return_cost_s=3.0).rule == "bound"
    with pytest.raises(ValueError, match="return_bound_s"):
        BorrowPlanner(return_bound_s=-1)
