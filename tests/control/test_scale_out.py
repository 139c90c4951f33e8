"""A pure scale-out (new workers on free devices, no running worker stopped or flipped) is judged by
what it adds: the current layout serves on while the new workers start, so their start is not lost
work twice over; what it costs is their stops once the devices go."""
from __future__ import annotations

import pytest

from pearl.config import EngineConfig, PolicyConfig
from pearl.control.controller import ControlSetting
from pearl.control.estimate import WorkloadStats
from pearl.control.observation import DeviceObs, DevicesAdded, Observation, Start, TrainerObs, WorkerObs
from pearl.control.policies import make_controller
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import DeviceStatus, LayoutShape, Pool, Role, WorkerPhase
from pearl.workloads import TrajectorySpec

HORIZON = 600.0


def _added(cold_start_s: float, horizon_s: float = HORIZON):
    """Three tp-1 workers on the rollout devices 0-2; elastic device 3 has just arrived."""
    perf = PerfModel(get_model("tiny"), get_hardware("cpu")).with_kv_capacity(65536)
    spec = TrajectorySpec(0, 0, 200, (64,) * 2, (50,), (0.0, 0.0))
    setting = ControlSetting(perf_for=lambda tp: perf, engine=EngineConfig(tp=1, max_num_seqs=16, max_batched_tokens=512),
                             stats=WorkloadStats.from_samples([spec]), batch_size=48, staleness=0, devices_per_node=1,
                             num_kv_heads=0, group_size=4, cold_start_s=cold_start_s)
    ctl = make_controller(PolicyConfig(name="pearl", tps=[1], horizon_s=horizon_s), setting)
    devices = tuple(DeviceObs(i, Pool.ROLLOUT, i, DeviceStatus.SERVING) for i in range(3)) + (
        DeviceObs(3, Pool.ELASTIC, 3, DeviceStatus.FREE),)
    workers = tuple(WorkerObs(i, (i,), Role.MIXED, WorkerPhase.SERVING, True, 16, 2000) for i in range(3))
    obs = Observation(5.0, devices, workers, LayoutShape.colocated(3, 1), TrainerObs(False, 0, 12), in_flight=48)
    eff = ctl.on_event(DevicesAdded((3,)), obs)
    (d,) = [d for d in eff.decisions if d.kind == "layout"]
    return d, [a for a in eff.actions if isinstance(a, Start)]


def test_a_scale_out_whose_start_costs_more_than_a_third_of_its_gain_is_still_taken():
    d, _ = _added(cold_start_s=0.0)
    assert d.chosen == str(LayoutShape.colocated(4, 1)), d.reason
    r = d.chosen_pred_s / d.current_pred_s
    assert r < 0.97 and d.plan["makespan_s"] < HORIZON * (1 - r) / 1.5, (r, d.plan)
    # A start of two thirds of what the fourth worker saves over the horizon: counted as lost work
    # and again as a cost (gain - m > 1.1 m), it would be declined.
    m = HORIZON * (1 - r) / 1.5
    d, starts = _added(cold_start_s=m)
    assert d.switch and d.rule == "switch", d.reason
    assert [a.devices for a in starts] == [(3,)]
    assert d.plan["makespan_s"] == pytest.approx(m, abs=1e-3)
    assert d.gain_s == pytest.approx((HORIZON - m) * (1 - r), rel=1e-3), d.reason
    assert d.cost_s == pytest.approx(0.5)  # one stop, once its device goes (policy.controller.stop_s)


def test_a_scale_out_that_starts_after_its_horizon_is_declined():
    d, starts = _added(cold_start_s=2 * HORIZON)
    assert not d.switch and d.rule == "no-gain" and not starts, d.reason
