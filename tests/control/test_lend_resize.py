"""Lending a device to a live worker (`Resize`, where the runtime can change a worker's size without
a restart: `pearl train`'s local engines, a device being a core): the controller weighs it against
a new worker on the lent device by prediction, says which it chose and why, and on the return the
worker gives the device back instead of being stopped."""
from __future__ import annotations


import pytest

from pearl.config import EngineConfig, PolicyConfig
from pearl.control.controller import ControlSetting
from pearl.control.estimate import WorkloadStats
from pearl.control.observation import (DeviceObs, Lend, Observation, Reclaim, Resize, Start, TrainerIdle,
                                       TrainerNeedsDevices, TrainerObs, WorkerObs)
from pearl.control.policies import make_controller
from pearl.perf.models import get_model
from pearl.types import DeviceStatus, LayoutShape, Pool, Role, WorkerPhase
from pearl.workloads import TrajectorySpec
from tests.helpers import tiny_perf_for

ROLL, TRAIN = 0, 1


def _controller(tp2_eff: float, live_resize: bool = True, lend_starts: bool = True):
    """A controller for one rollout worker (device 0) and the trainer's device (1); the tp-2 model
    (two cores) computes at `tp2_eff` of the tp-1 model's efficiency per core."""
    perf_for, shape = tiny_perf_for(tp2_eff), get_model("tiny")
    spec = TrajectorySpec(0, 0, 200, (64,) * 2, (50,), (0.0, 0.0))
    setting = ControlSetting(perf_for=perf_for, engine=EngineConfig(tp=1, max_num_seqs=16, max_batched_tokens=512),
                             stats=WorkloadStats.from_samples([spec]), batch_size=8, staleness=0, devices_per_node=1,
                             num_kv_heads=shape.num_kv_heads, group_size=4, live_resize=live_resize,
                             lend_starts=lend_starts)
    policy = PolicyConfig(name="pearl", borrow=True, controller={"lend_gain_factor": 0.0})
    return make_controller(policy, setting)


def _obs(t: float, worker_devices: tuple[int, ...], lent: bool) -> Observation:
    train = DeviceObs(TRAIN, Pool.TRAIN, 0, DeviceStatus.SERVING if TRAIN in worker_devices else
                      (DeviceStatus.FREE if lent else DeviceStatus.TRAINING), None, 60.0 if lent else None)
    devices = (DeviceObs(ROLL, Pool.ROLLOUT, 0, DeviceStatus.SERVING), train)
    worker = WorkerObs(0, worker_devices, Role.MIXED, WorkerPhase.SERVING, True, 8, 2000)
    return Observation(t, devices, (worker,), LayoutShape.colocated(1, len(worker_devices)),
                       TrainerObs(False, 0, 2, (), (TRAIN,)), in_flight=8)


def test_a_lent_device_joins_the_live_worker_when_that_is_predicted_faster_and_leaves_it_on_return():
    ctl = _controller(tp2_eff=3.0)
    eff = ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False))
    (d,) = [d for d in eff.decisions if d.kind == "borrow"]
    assert d.borrow and "as colocated×1@tp2 (" in d.reason and "not colocated×2 (" in d.reason, d.reason
    assert [type(a) for a in eff.actions] == [Lend, Resize]
    assert eff.actions[1] == Resize(0, (ROLL, TRAIN))
    # The batch is ready: the worker gives the core back (no stop, nothing migrates), then the reclaim.
    eff = ctl.on_event(TrainerNeedsDevices(), _obs(12.0, (ROLL, TRAIN), lent=True))
    assert eff.actions == [Resize(0, (ROLL,))] and isinstance(eff.then, TrainerNeedsDevices)
    eff = ctl.on_event(TrainerNeedsDevices(), _obs(12.0, (ROLL,), lent=True))
    assert eff.actions == [Reclaim((TRAIN,))]


@pytest.mark.parametrize("tp2_eff, live_resize", [(0.5, True), (3.0, False)])
def test_a_new_worker_takes_the_lent_device_when_a_wider_one_is_not_faster_or_not_possible(tp2_eff, live_resize):
    ctl = _controller(tp2_eff, live_resize)  # (at half the efficiency per core, two cores are one)
    eff = ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False))
    (d,) = [d for d in eff.decisions if d.kind == "borrow"]
    assert d.borrow and ("as colocated×2 (" in d.reason and "not colocated×1@tp2 (" in d.reason) == live_resize, \
        d.reason
    assert [type(a) for a in eff.actions] == [Lend, Start] and eff.actions[1].devices == (TRAIN,)


# (0.4: two cores slower than one; at 0.5 they tie on compute and the wider worker's shorter weight
# sync, half the shard per core, decides)
@pytest.mark.parametrize("tp2_eff, live_resize, rule", [(3.0, True, "lend"), (0.4, True, "no-gain"),
                                                        (3.0, False, "no-start")])
def test_where_no_worker_may_start_on_a_lent_device_only_a_live_worker_takes_it(tp2_eff, live_resize, rule):
    """`lend_starts` off (the Ray backend: an actor takes seconds to start, a lend lasts less): the lent
    device joins the live worker if that is predicted faster; otherwise nothing is lent, and the
    decision says why. Never a Start."""
    ctl = _controller(tp2_eff, live_resize, lend_starts=False)
    eff = ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False))
    (d,) = [d for d in eff.decisions if d.kind == "borrow"]
    assert d.rule == rule and d.borrow == (rule == "lend"), d.reason
    assert [type(a) for a in eff.actions] == ([Lend, Resize] if rule == "lend" else [])
    if rule == "no-start":
        assert "starts no worker on one" in d.reason


@pytest.mark.parametrize("lend_starts", [True, False])
def test_a_lent_device_whose_worker_died_hosts_a_new_worker_only_where_lend_starts(lend_starts):
    """The worker holding the lent device died (both its devices are free): the re-decision starts a
    worker on the rollout device, and on the lent one only where a start there is allowed."""
    from pearl.control.observation import Redecide

    ctl = _controller(3.0, lend_starts=lend_starts)
    ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False))  # lent to worker 0
    train = DeviceObs(TRAIN, Pool.TRAIN, 0, DeviceStatus.FREE, None, 60.0)
    obs = Observation(11.0, (DeviceObs(ROLL, Pool.ROLLOUT, 0, DeviceStatus.FREE), train), (),
                      LayoutShape.colocated(0, 1), TrainerObs(False, 0, 2, (), (TRAIN,)), in_flight=8)
    eff = ctl.on_event(Redecide("rollout worker 0 died"), obs)
    used = {d for a in eff.actions if isinstance(a, Start) for d in a.devices}
    assert ROLL in used, [d.reason for d in eff.decisions]
    assert (TRAIN in used) == lend_starts, eff.actions


def test_a_live_worker_taking_the_lent_device_only_because_none_may_start_says_so():
    ctl = _controller(0.7, lend_starts=False)  # (a new worker would be faster, but none may start on it)
    eff = ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False))
    (d,) = [d for d in eff.decisions if d.kind == "borrow"]
    assert "not colocated×2 (" in d.reason and "(no worker starts on a lent device here)" in d.reason, d.reason
    ctl = _controller(0.7)
    (d,) = [d for d in ctl.on_event(TrainerIdle(), _obs(10.0, (ROLL,), lent=False)).decisions if d.kind == "borrow"]
    assert "no worker starts" not in d.reason, d.reason
