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
