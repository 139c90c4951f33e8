"""Colocated layouts of two tps ("side workers"): tp 8 on whole nodes and a smaller tp on the pieces of
nodes that a tp-8 worker cannot use. The shape's arithmetic and how it is observed, the candidates a
fragmented budget offers, the plans that reach one (stopping the workers whose devices complete a
wide worker's node), their prediction, and the router weighing workers of two speeds."""
from __future__ import annotations

import random

import pytest

from pearl.config import EngineConfig, WorkloadConfig
from pearl.control.planner import DeviceView, StepKind, WorkerView, plan_transition
from pearl.control.predictor import BatchState, WorkloadStats, predict_many
from pearl.control.predictor_mix import KindPart, predict_shapes, predict_two_kinds
from pearl.control.selector import side_shapes
from pearl.engine.router import pick_decode
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode, Pool, Role
from pearl.workloads import Workload

M = Role.MIXED
Q8 = PerfModel(get_model("qwen3-8b"), get_hardware("h800"))


def side(a: int, ta: int, b: int, tb: int) -> LayoutShape:
    return LayoutShape(Mode.COLOCATED, n_mixed=a, tp=ta, n_side=b, tp_side=tb)


def test_a_side_shape_counts_both_groups():
    s = side(2, 8, 3, 2)
    assert (s.n_workers, s.n_devices, s.count(M), str(s)) == (5, 22, 5, "colocated×2@tp8+3@tp2")
    assert s.tp_groups() == [(8, [M, M]), (2, [M, M, M])]
    assert s.fits([8, 8, 6]) and not s.fits([8, 7, 7]) and not s.fits([8, 8, 5])
    assert side(2, 8, 1, 8) == LayoutShape.colocated(3, 8)  # side workers of the main tp are main workers
    assert side(2, 8, 0, 4) == LayoutShape.colocated(2, 8)
    assert side(2, 8, 1, 4) != side(2, 8, 2, 2) and sorted([side(2, 8, 2, 2), side(2, 8, 1, 4)])


@pytest.mark.parametrize("bad", [dict(mode=Mode.DISAGGREGATED, n_prefill=1, n_decode=1, n_side=1, tp_side=1),
                                 dict(mode=Mode.COLOCATED, n_mixed=1, tp=2, n_side=1, tp_side=4),
                                 dict(mode=Mode.COLOCATED, n_mixed=1, tp=2, n_side=1)])
def test_a_side_group_needs_a_colocated_layout_and_a_smaller_tp(bad):
    with pytest.raises(ValueError, match="side workers"):
        LayoutShape(**bad)


def test_the_observed_shape_of_colocated_workers_of_two_sizes_is_a_side_shape():
    assert LayoutShape.observed([(M, 8), (M, 2), (M, 8), (M, 2), (M, 2)]) == side(2, 8, 3, 2)
    assert LayoutShape.observed([(M, 4), (M, 4)]) == LayoutShape.colocated(2, 4)
    assert LayoutShape.observed([]) == LayoutShape.colocated(0)
    # disaggregated workers of two sizes keep their per-role tp
    assert LayoutShape.observed([(Role.PREFILL, 4), (Role.DECODE, 1), (Role.DECODE, 1)]) == \
        LayoutShape.disaggregated(1, 2, 1, 4)


def test_a_fragmented_budget_offers_a_wide_tp_on_whole_nodes_and_a_narrow_one_on_the_rest():
    # Beside tp 8 on the node of six: tp 4 (the largest that fits) and tp 2 (the largest that leaves
    # none of the six idle); beside tp 4 on its two left: tp 2.
    assert set(side_shapes([8, 8, 6], [1, 2, 4, 8])) == {side(2, 8, 1, 4), side(2, 8, 3, 2), side(5, 4, 1, 2)}
    assert set(side_shapes([8, 8, 5], [1, 2, 4, 8])) == {side(2, 8, 1, 4), side(2, 8, 5, 1), side(5, 4, 1, 1),
                                                         side(10, 2, 1, 1)}
    assert all(s.fits([8, 8, 5]) for s in side_shapes([8, 8, 5], [1, 2, 4, 8]))
    assert side_shapes([8, 8], [2, 4, 8]) == []  # whole nodes: nothing left over
    assert side_shapes([8, 6], [8]) == []  # one tp: nothing to put beside it


def _on(wid: int, node: int, first: int, tp: int, load: int = 10) -> WorkerView:
    return WorkerView(wid, tuple(range(first, first + tp)), M, node != 0, load, 1000 * load)


def test_the_workers_whose_devices_complete_a_wide_workers_node_stop():
    """Seen on s4 (seed 0, t = 210 s): tp 8 on node 0, two tp-4 workers on node 1, one tp-4 worker and
    two free devices on node 2 (six devices). The target, two of tp 8 and one of tp 4, is placeable
    only by stopping both tp-4 workers of node 1; the cheapest assignment (the least loaded) stops the
    one on node 2, after which the planner refused the layout."""
    workers = [_on(11, 0, 0, 8, 12), _on(9, 1, 8, 4, 21), _on(10, 1, 12, 4, 18), _on(8, 2, 16, 4, 5)]
    free = [DeviceView(20, Pool.ELASTIC, 2, True), DeviceView(21, Pool.ELASTIC, 2, True)]
    nodes = {d: (0 if d < 8 else 1 if d < 16 else 2) for d in range(22)}
    plan = plan_transition(workers, free, side(2, 8, 1, 4), device_nodes=nodes)
    stopped = {s.worker for s in plan.steps if s.kind is StepKind.STOP}
    started = [s.devices for s in plan.steps if s.kind is StepKind.START]
    assert stopped == {9, 10} and started == [tuple(range(8, 16))]


def test_a_narrow_worker_moves_off_the_node_a_wide_one_needs():
    """One tp-1 worker on a node of two, single free devices on two other nodes: the tp-2 worker needs
    the node of two, so the tp-1 worker stops and two start on the single devices."""
    workers = [WorkerView(0, (0,), M, False, 4, 400)]
    free = [DeviceView(1, Pool.ROLLOUT, 0, False), DeviceView(2, Pool.ROLLOUT, 1, False),
            DeviceView(3, Pool.ROLLOUT, 2, False)]
    plan = plan_transition(workers, free, side(1, 2, 2, 1), device_nodes={0: 0, 1: 0, 2: 1, 3: 2})
    starts = sorted(tuple(sorted(s.devices)) for s in plan.steps if s.kind is StepKind.START)
    assert starts == [(0, 1), (2,), (3,)] and plan.n_stops == 1


def test_adding_side_workers_on_new_pieces_is_a_pure_scale_out():
    workers = [_on(0, 0, 0, 8), _on(1, 1, 8, 8)]
    free = [DeviceView(d, Pool.ELASTIC, 2, True) for d in range(16, 22)]
    plan = plan_transition(workers, free, side(2, 8, 3, 2), device_nodes={d: d // 8 for d in range(22)})
    assert (plan.n_starts, plan.n_stops, plan.n_flips) == (3, 0, 0)


def test_a_side_shape_is_priced_as_two_parts_with_the_split_that_ends_the_batch_first():
    st = WorkloadStats.from_workload(Workload(WorkloadConfig(profile="math-tool"), 0), 256)
    b, e = BatchState.fresh(256), EngineConfig()
    perf = {tp: Q8.with_tp(tp) for tp in (2, 8)}
    one, two = predict_shapes([LayoutShape.colocated(2, 8), side(2, 8, 3, 2)], perf.__getitem__, e, st, b)
    assert one.completion_s == predict_many([LayoutShape.colocated(2, 8)], [perf[8]], e, st, b, tol=1e-2,
                                            grid_points=48)[0].completion_s
    best = predict_two_kinds([KindPart(2, perf[8]), KindPart(3, perf[2])], e, st, b, share="best", tol=1e-2,
                             grid_points=48)
    assert two.completion_s == best.completion_s and 0.5 < two.breakdown["share"] < 1.0
    assert two.completion_s < one.completion_s  # six more devices serve


class _Eng:
    def __init__(self, rate: float, kv: int, load: int):
        self.rate, self._kv, self._load, self.kv_capacity, self.accepting, self.role = rate, kv, load, 1000, True, M

    def kv_used(self) -> int:
        return self._kv

    def load(self) -> int:
        return self._load

    def holds(self, session: str) -> bool:
        return False


def test_the_router_counts_a_slower_worker_as_fuller():
    """Equal KV and load: the faster worker (a wider tp) takes the session; at equal rates the choice
    is by KV alone, as before."""
    fast, slow = _Eng(180.0, 200, 20), _Eng(80.0, 150, 15)
    assert pick_decode([slow, fast], "s", None, random.Random(0)) is fast
    same_a, same_b = _Eng(80.0, 200, 20), _Eng(80.0, 150, 15)
    assert pick_decode([same_a, same_b], "s", None, random.Random(0)) is same_b


def _rlboost(side_tp):
    """rlboost+ at tp 2 (its side tp `side_tp`) on nodes of two devices at most; a tp-2 worker computes
    1.5 times as efficiently per device as a tp-1 one."""
    from pearl.config import PolicyConfig
    from pearl.control.controller import ControlSetting
    from pearl.control.policies import make_controller
    from pearl.workloads import TrajectorySpec
    from tests.helpers import tiny_perf_for

    spec = TrajectorySpec(0, 0, 200, (64,) * 2, (50,), (0.0, 0.0))
    setting = ControlSetting(perf_for=tiny_perf_for(1.5), engine=EngineConfig(tp=2, max_num_seqs=16, max_batched_tokens=512),
                             stats=WorkloadStats.from_samples([spec]), batch_size=16, staleness=0, devices_per_node=2,
                             num_kv_heads=get_model("tiny").num_kv_heads, group_size=4)
    return make_controller(PolicyConfig(name="rlboost+", side_tp=side_tp), setting)


@pytest.mark.parametrize("side_tp", [None, 1])
def test_rlboost_with_a_side_tp_serves_on_single_elastic_devices(side_tp):
    """Two single elastic devices arrive beside a tp-2 worker: rlboost+ at tp 2 cannot use them; with
    its side tp 1 (the knob the tuner gives it) it starts a tp-1 worker on each."""
    from pearl.control.observation import DeviceObs, DevicesAdded, Observation, Start, TrainerObs, WorkerObs
    from pearl.types import DeviceStatus, WorkerPhase

    devices = (DeviceObs(0, Pool.ROLLOUT, 0, DeviceStatus.SERVING), DeviceObs(1, Pool.ROLLOUT, 0, DeviceStatus.SERVING),
               DeviceObs(2, Pool.ELASTIC, 1, DeviceStatus.FREE), DeviceObs(3, Pool.ELASTIC, 2, DeviceStatus.FREE))
    worker = WorkerObs(0, (0, 1), M, WorkerPhase.SERVING, True, 16, 2000)
    obs = Observation(5.0, devices, (worker,), LayoutShape.colocated(1, 2), TrainerObs(False, 0, 4), in_flight=16)
    eff = _rlboost(side_tp).on_event(DevicesAdded((2, 3)), obs)
    starts = sorted(a.devices for a in eff.actions if isinstance(a, Start))
    if side_tp is None:
        assert starts == [] and all(d.chosen == str(LayoutShape.colocated(1, 2)) for d in eff.decisions)
    else:
        (d,) = eff.decisions
        assert d.switch and d.chosen == str(side(1, 2, 2, 1)) and starts == [(2,), (3,)], d.reason
