"""A worker that joins mid-batch in the simulator takes its share of the trajectories in flight, as in
the real runtime (`Routing.rebalance`): without it, a lent trainer device sat idle until the next
admission wave. Nothing is lost or trained twice by the moves."""
from __future__ import annotations

import pytest

from pearl.runtime.sim import Simulator
from tests.control.test_policies_sim import BUSY, live_trajectories, scenario

NO_SPOT = dict(cluster=dict(elastic=dict(kind="none")))


def _run_recording_joins(policy: str):
    """Run, recording for every worker that becomes ready while others serve: (trajectories it holds
    after the rebalance, trajectories held by the workers taking turns, how many such workers)."""
    sim = Simulator(scenario(policy, **NO_SPOT, **BUSY))
    joins, orig = [], sim._rebalance

    def rebalance(new):
        moved = orig(new)
        targets = sim.serving(*{e.role for e in sim.engines.values()})
        held = [tr for tr in sim.inflight.values() if tr.home in targets]
        if len(targets) > 1:
            joins.append((sum(tr.home is new for tr in held), len(held), len(targets), moved))
        return moved

    sim._rebalance = rebalance
    return sim, sim.run(), joins


@pytest.mark.parametrize("policy", ["pearl", "rlboost+"])
def test_a_worker_that_joins_mid_batch_takes_its_share_of_the_trajectories_in_flight(policy):
    sim, res, joins = _run_recording_joins(policy)
    assert sim.rebalanced > 0 and any(moved for *_, moved in joins)
    for mine, held, n, _ in joins:  # (the trajectories of workers with less than their share stay put)
        assert mine <= -(-held // n)
    assert any(mine >= held // n > 0 for mine, held, n, _ in joins)
    # the lent workers served: the trainer's devices decoded a share of the tokens
    lent = [e for e in sim.all_engines if sim.state.devices[e.devices[0]].pool.value == "train"]
    assert lent and sum(e.tokens_decoded for e in lent) > 0.1 * sum(e.tokens_decoded for e in sim.all_engines)
    assert sim.next_traj == sim.trained_trajs + sim.discarded + len(live_trajectories(sim))  # none lost
    assert res["trainer"]["max_device_wait_s"] <= sim.cfg.policy.return_bound_s
