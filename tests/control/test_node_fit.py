"""A layout whose workers cannot each sit on one node is not a choice: the controller picks the best
shape that fits the devices node by node, instead of naming an infeasible one and leaving free
devices idle."""
from __future__ import annotations


import pytest

from pearl.config import EngineConfig, PolicyConfig
from pearl.control.controller import ControlSetting
from pearl.control.estimate import WorkloadStats
from pearl.control.observation import DeviceObs, Observation, Redecide, Start, TrainerObs, WorkerObs
from pearl.control.policies import make_controller
from pearl.perf.models import get_model
from pearl.types import DeviceStatus, LayoutShape, Mode, Pool, Role, WorkerPhase
from pearl.workloads import TrajectorySpec
from tests.helpers import tiny_perf_for


@pytest.mark.parametrize("shape, sizes, fits", [
    (LayoutShape.colocated(2, 2), [2, 1, 1], False),
    (LayoutShape.colocated(2, 2), [2, 2], True),
    (LayoutShape.colocated(4, 1), [2, 1, 1], True),
    (LayoutShape.disaggregated(1, 2, 1, 2), [2, 1, 1], True),  # the tp-2 prefill worker on the node of two
    (LayoutShape.disaggregated(2, 1, 1, 2), [2, 1, 1], False),
    (LayoutShape.colocated(1, 8), [4, 4], False),
    (LayoutShape.disaggregated(1, 4, 1, 4), [8], True),
])
def test_a_shape_fits_when_each_worker_has_its_tp_devices_on_one_node(shape, sizes, fits):
    assert shape.fits(sizes) is fits


def _controller(tp2_eff: float = 3.0):
    """Four rollout devices, two per node at most; a tp-2 worker computes `tp2_eff` times as
    efficiently per device as a tp-1 worker."""
    perf_for, shape = tiny_perf_for(tp2_eff), get_model("tiny")
    spec = TrajectorySpec(0, 0, 200, (64,) * 2, (50,), (0.0, 0.0))
    setting = ControlSetting(perf_for=perf_for, engine=EngineConfig(tp=1, max_num_seqs=16, max_batched_tokens=512),
                             stats=WorkloadStats.from_samples([spec]), batch_size=16, staleness=0, devices_per_node=2,
                             num_kv_heads=shape.num_kv_heads, group_size=4)
    return make_controller(PolicyConfig(name="pearl", tps=[1, 2]), setting)


def _obs(nodes: tuple[int, ...]) -> Observation:
    """Device i on node nodes[i]; a tp-1 worker serves on device 0, the others are free."""
    devices = tuple(DeviceObs(i, Pool.ROLLOUT, n, DeviceStatus.SERVING if i == 0 else DeviceStatus.FREE)
                    for i, n in enumerate(nodes))
    worker = WorkerObs(0, (0,), Role.MIXED, WorkerPhase.SERVING, True, 16, 2000)
    return Observation(5.0, devices, (worker,), LayoutShape.colocated(1, 1), TrainerObs(False, 0, 4), in_flight=16)


def _decide(nodes: tuple[int, ...], tp2_eff: float = 3.0):
    eff = _controller(tp2_eff).on_event(Redecide("devices"), _obs(nodes))
    (d,) = eff.decisions
    assert d.switch and not d.reason.startswith("infeasible"), d.reason
    return d, {dev for a in eff.actions if isinstance(a, Start) for dev in a.devices}


def test_the_best_layout_that_fits_the_nodes_is_chosen():
    # Two nodes of two: two tp-2 workers fit, and are the best.
    d, _ = _decide((0, 0, 1, 1))
    assert d.chosen == str(LayoutShape.colocated(2, 2)), d.reason
    # Three nodes (two, one, one): a second tp-2 worker has no node. One tp-2 worker on the node of two
    # (three times as efficient per device) beats four tp-1 workers, and with two tp-1 workers beside
    # it on the single devices (side workers) beats both: the tp-1 worker on the node of two moves.
    d, used = _decide((0, 0, 1, 2))
    shown = [c[0] for c in d.candidates]
    assert str(LayoutShape.colocated(2, 2)) not in shown, shown
    side = LayoutShape(Mode.COLOCATED, n_mixed=1, tp=2, n_side=2, tp_side=1)
    assert d.chosen == str(side) and str(LayoutShape.colocated(4, 1)) in shown, d.reason
    assert str(LayoutShape.colocated(1, 2)) in shown, shown
    assert used == {0, 1, 2, 3}, used


@pytest.mark.parametrize("tp2_eff, best", [
    (1.2, LayoutShape(Mode.COLOCATED, n_mixed=1, tp=2, n_side=2, tp_side=1)),  # 2.4 + 2 devices' worth > 4
    (0.5, LayoutShape.colocated(4, 1)),  # 1 + 2 < 4: a tp-2 worker is no faster than a tp-1 one
])
def test_devices_a_wider_worker_cannot_use_serve_when_that_is_faster(tp2_eff, best):
    """One tp-2 worker alone (2.4 or 1 devices' worth) loses to four tp-1 workers; beside two tp-1
    workers it wins where a tp-2 worker computes more per device. No device is left idle either way."""
    d, used = _decide((0, 0, 1, 2), tp2_eff=tp2_eff)
    assert d.chosen == str(best), d.reason
    assert used >= {1, 2, 3}, used
