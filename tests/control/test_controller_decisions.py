"""Decisions of the controller a user would notice, each with its reason: the trainer's devices are
lent before the first batch too (and come back within the bound), a losing exploration is undone,
and a return of lent devices does not flap the layout."""
from __future__ import annotations

import pytest

from pearl.control.lending import next_batch_at
from pearl.control.observation import TrainerObs
from tests.control.test_policies_sim import BUSY, live_trajectories, run, scenario

NO_SPOT = dict(cluster=dict(elastic=dict(kind="none")))


def test_the_next_batch_is_estimated_from_the_last_intervals_or_as_long_again_before_the_first():
    assert next_batch_at(TrainerObs(False, 0, 8), 40.0)[0] == 80.0  # no batch yet: at 2·t
    assert next_batch_at(TrainerObs(False, 0, 8, (100.0,)), 130.0)[0] == 200.0  # start → 100: 100 again
    assert next_batch_at(TrainerObs(False, 0, 8, (100.0, 160.0, 200.0)), 210.0)[0] == 250.0  # mean of 60, 40


@pytest.mark.parametrize("policy", ["pearl", "rlboost+", "roll-partial"])
def test_the_trainers_devices_are_lent_before_the_first_batch_and_come_back_within_the_bound(policy):
    # Every policy that borrows gets it (it is not PEARL's own mechanism): no batch interval is known
    # yet, so the first batch is assumed ready at 2·t, and the return path covers an early batch.
    sim, res = run(scenario(policy, **NO_SPOT, **BUSY))
    first = sim.batch_ready_t[0]
    lent = [e.t for e in sim.state.events if e.kind == "lent"]
    assert lent and lent[0] < first, f"nothing lent before the first batch at {first:.0f} s"
    if policy == "pearl":  # PEARL says why (the baselines lend with no cost model, so no verdict)
        early = [d for d in res["decisions"] if d["kind"] == "borrow" and d["borrow"] and d["t"] < first]
        assert early and "no batch yet" in early[0]["reason"] and early[0]["rule"] == "lend"
    assert res["trainer"]["max_device_wait_s"] <= sim.cfg.policy.return_bound_s
    assert sim.next_traj == sim.trained_trajs + sim.discarded + len(live_trajectories(sim))  # none lost


def _controller_at_start(policy: str = "pearl", **over):
    """The controller of a simulator set up to its initial layout, and an observation of it."""
    from pearl.runtime.sim import Simulator

    sim = Simulator(scenario(policy, **NO_SPOT, **BUSY, **over))
    driver = sim.control.setup()
    return driver.controller, sim.control.observe(True)


def _measure(ctl, shape, slower: float) -> float:
    """Record measurements of `shape` at 1/`slower` of its predicted throughput; its corrected
    batch time."""
    pred = ctl._predict([shape])[0]
    for _ in range(ctl.refit.min_samples):
        ctl.refit.observe(shape, pred.tokens_per_s * 100.0 / slower, 100.0, pred.tokens_per_s)
    return ctl.refit.corrected(shape, pred.completion_s)


def _explored(ctl, obs, slower_than_left: float, t: float):
    """The controller explored the live layout from another one at t − 100 s; the live layout is
    then measured `slower_than_left` times slower than that one (both relative to prediction)."""
    from dataclasses import replace

    from pearl.types import LayoutShape

    cur = obs.shape
    left = LayoutShape.disaggregated(1, cur.n_workers - 1, cur.tp)
    ctl._trial, ctl.explored, ctl.last_switch = (left, cur), {cur}, t - 100.0
    _measure(ctl, left, 1.0)
    _measure(ctl, cur, slower_than_left * ctl._predict([left])[0].completion_s / ctl._predict([cur])[0].completion_s)
    ctl._mark = None  # (this tick measures nothing more)
    return left, replace(obs, t=t)


def test_a_losing_exploration_is_undone_once_measured_and_never_tried_again():
    ctl, obs = _controller_at_start()
    left, obs = _explored(ctl, obs, slower_than_left=1.03, t=400.0)  # 3 %: within the switching band
    eff = ctl.on_tick(obs)
    d = next(d for d in eff.decisions if d.kind == "layout")
    assert d.switch and d.rule == "undo" and d.chosen == str(left), d.reason
    assert "slower than" in d.reason and "not explored again" in d.reason
    assert eff.actions  # the plan back is carried out
    assert obs.shape in ctl.explored and ctl._trial is None  # never explored again


def test_an_undo_waits_for_the_dwell_and_a_winning_exploration_stays():
    ctl, obs = _controller_at_start()
    left, obs = _explored(ctl, obs, slower_than_left=1.03, t=400.0)
    ctl.last_switch = obs.t - 1.0  # just switched: the dwell applies to an undo too
    d = next(d for d in ctl.on_tick(obs).decisions if d.kind == "layout")
    assert not d.switch and d.rule == "dwell" and "undoing" in d.reason
    ctl, obs = _controller_at_start()
    _, obs = _explored(ctl, obs, slower_than_left=0.97, t=400.0)  # the explored layout won
    d = next(d for d in ctl.on_tick(obs).decisions if d.kind == "layout")
    assert d.rule != "undo" and ctl._trial is None
