"""Per-role tensor parallelism (issue 9, item 4): a disaggregated layout whose prefill workers have a
tp of their own. The shape's arithmetic, the predictor's timing hand-checked against the roofline,
the selector's enumeration (only when the policy allows it), the planner's per-tp placement, and the
simulator starting such a layout with each worker at its own tp."""
from __future__ import annotations

import pytest

from pearl.config import EngineConfig, ScenarioConfig, WorkloadConfig, parse_config
from pearl.control.planner import DeviceView, InfeasiblePlan, StepKind, WorkerView, plan_transition
from pearl.control.restart import plan_full_restart
from pearl.control.predictor import BatchState, WorkloadStats, predict_many
from pearl.control.selector import candidates, select
from pearl.errors import ConfigError
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.runtime.sim import Simulator
from pearl.types import LayoutShape, Pool, Role
from pearl.workloads import TrajectorySpec, Workload
from tests.control.test_planner import apply_plan

PM1 = PerfModel(get_model("qwen3-8b"), get_hardware("h100"), tp=1)
PM4 = PM1.with_tp(4)
P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED


def test_shape_counts_and_names_each_side():
    s = LayoutShape.disaggregated(1, 4, tp=1, tp_prefill=4)
    assert str(s) == "1P@tp4:4D@tp1" and s.n_devices == 8 and s.n_workers == 5
    assert s.tp_of(P) == 4 and s.tp_of(D) == 1 and s.per_role_tp
    # the default, and a prefill tp equal to tp, are the shape every existing result names
    same = LayoutShape.disaggregated(2, 2, tp=2, tp_prefill=2)
    assert same == LayoutShape.disaggregated(2, 2, 2) and str(same) == "2P:2D@tp2" and not same.per_role_tp
    assert hash(same) == hash(LayoutShape.disaggregated(2, 2, 2))
    assert LayoutShape.colocated(2, 4) == LayoutShape(LayoutShape.colocated(2, 4).mode, n_mixed=2, tp=4, tp_prefill=1)
    assert sorted([s, LayoutShape.disaggregated(1, 4)]) == [LayoutShape.disaggregated(1, 4), s]


def test_prefill_and_decode_times_match_the_roofline():
    """One trajectory, one turn: a 4096-token prompt prefilled, one decode step. Moving the prefill
    worker from tp1 to tp4 (decode stays at tp1) saves exactly the roofline's prefill difference, and
    the whole prediction is the tp4 prefill + the KV hand-off (at the tp1 side's links) + the tp1
    decode step at context 4096 + half a decode step to join the decode worker's batch."""
    batch = BatchState.from_specs([TrajectorySpec(0, 0, 4096, (2,), (), (0.0,))])
    split, both1 = LayoutShape.disaggregated(1, 1, 1, 4), LayoutShape.disaggregated(1, 1, 1)
    got = predict_many([split, both1], [PM1, PM1], EngineConfig(), None, batch)
    pre1, pre4 = PM1.prefill_time(4096), PM4.prefill_time(4096)
    assert pre4 < pre1 / 2  # compute-bound: tp4 cuts the prefill's time
    assert got[1].completion_s - got[0].completion_s == pytest.approx(pre1 - pre4, rel=1e-9)
    hand = pre4 + PM1.kv_transfer_time(4096, True) + PM1.step_time(1, 4096) + PM1.step_time(1, 0) / 2
    assert got[0].completion_s == pytest.approx(hand, rel=1e-4)
    # the prefill model may be given explicitly: the same answer
    again = predict_many([split], [PM1], EngineConfig(), None, batch, prefill_perfs=[PM4])[0]
    assert again.completion_s == pytest.approx(got[0].completion_s, rel=1e-12)


def test_candidates_fill_the_budget_exactly():
    c = candidates(8, (1, 2, 4), per_role=True)
    pairs = [s for s in c if s.per_role_tp]
    assert all(s.n_devices == 8 for s in c) and len(c) == len(set(c))
    assert LayoutShape.disaggregated(1, 4, 1, 4) in pairs and LayoutShape.disaggregated(4, 1, 4, 1) in pairs
    assert LayoutShape.disaggregated(2, 3, 2, 1) in pairs  # 2 × tp1 prefill + 3 × tp2 decode
    assert not any(s.per_role_tp for s in candidates(8, (1, 2, 4)))
    assert not any(s.per_role_tp for s in candidates(8, (2,), per_role=True))  # one tp: nothing to pair


def test_selector_ranks_pairs_only_when_allowed():
    stats = WorkloadStats.from_workload(Workload(WorkloadConfig(profile="swe"), 0), 256)
    perfs = {tp: PM1.with_tp(tp) for tp in (1, 2, 4)}
    off = select(8, perfs, EngineConfig(), stats, BatchState.fresh(256))
    on = select(8, perfs, EngineConfig(), stats, BatchState.fresh(256), per_role=True)
    assert not any(s.per_role_tp for s, *_ in off.ranked)
    ranked_on = {s for s, *_ in on.ranked}
    assert {s for s in candidates(8, (1, 2, 4), per_role=True) if s.per_role_tp} <= ranked_on
    assert on.ranked[0][3] <= off.ranked[0][3] * (1 + 1e-9)  # a wider space never ranks worse
    assert all(s.n_devices == 8 for s in ranked_on)


@pytest.mark.parametrize("profile,n", [("web", 64), ("swe", 32)])
def test_coarse_search_with_pairs_finds_the_exhaustive_best(profile, n):
    stats = WorkloadStats.from_workload(Workload(WorkloadConfig(profile=profile), 0), 256)
    perfs = {tp: PM1.with_tp(tp) for tp in (1, 2, 4)}
    fast = select(n, perfs, EngineConfig(), stats, BatchState.fresh(512), per_role=True)
    full = select(n, perfs, EngineConfig(), stats, BatchState.fresh(512), shapes=candidates(n, (1, 2, 4), per_role=True))
    assert fast.evaluated < full.evaluated
    assert fast.ranked[0][3] <= full.ranked[0][3] * 1.01


@pytest.mark.parametrize("planner", [plan_transition, plan_full_restart])
def test_planner_gives_each_role_its_tp_on_one_node(planner):
    """8 tp1 mixed workers on two nodes of 4 → 1P@tp4:4D@tp1: the prefill worker gets 4 devices of
    one node (released by the tp1 workers that stop), 4 tp1 workers end as decode."""
    workers = [WorkerView(i, (i,), M, False, 2, 200) for i in range(8)]
    nodes = {i: i // 4 for i in range(8)}
    target = LayoutShape.disaggregated(1, 4, 1, 4)
    plan = planner(workers, [], target, device_nodes=nodes)
    after = [(d, r) for _, d, r in apply_plan(workers, plan)]
    assert sorted((len(d), r.value) for d, r in after) == [(1, "decode")] * 4 + [(4, "prefill")]
    prefill = next(d for d, r in after if r is P)
    assert len({nodes[d] for d in prefill}) == 1
    used = [d for devs, _ in after for d in devs]
    assert len(used) == len(set(used)) == 8
    if planner is plan_transition:
        assert plan.n_starts == 1 and plan.n_stops == 4 and plan.n_flips == 4
        start = next(i for i, s in enumerate(plan.steps) if s.kind is StepKind.START)
        stops = {i for i, s in enumerate(plan.steps) if s.kind is StepKind.STOP}
        assert stops <= set(plan.steps[start].after)  # its devices are released first


def test_planner_keeps_workers_of_each_size_and_refuses_what_cannot_be_placed():
    # 1 tp4 prefill + 4 tp1 decode already there: nothing to do
    workers = [WorkerView(0, (0, 1, 2, 3), P, False, 0, 0)] + [WorkerView(i, (i + 3,), D, False, 0, 0) for i in (1, 2, 3, 4)]
    target = LayoutShape.disaggregated(1, 4, 1, 4)
    assert plan_transition(workers, [], target).n_changes == 0
    # a tp4 prefill worker needs 4 devices of one node: 8 free devices on 4 nodes of 2 cannot host it
    two_nodes = [DeviceView(i, Pool.ROLLOUT, i // 2, False) for i in range(8)]
    with pytest.raises(InfeasiblePlan, match="workers of tp 4"):
        plan_transition([], two_nodes, target)


def _scenario(**over) -> ScenarioConfig:
    base = {"duration_s": 120.0, "cluster": {"hardware": "h800", "rollout_devices": 8, "train_devices": 8},
            "workload": {"profile": "search"}, "rl": {"prompts_per_batch": 4, "group_size": 4}}
    for k, v in over.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return parse_config(base, ScenarioConfig)


def test_simulator_starts_each_role_at_its_own_tp():
    cfg = _scenario(policy={"name": "static-pd"},
                    layout={"mode": "disaggregated", "prefill": 1, "decode": 4, "prefill_tp": 4})
    sim = Simulator(cfg)
    sim.run()
    live = [w for w in sim.state.workers.values() if w.devices]
    assert sorted((len(w.devices), w.role.value) for w in live) == [(1, "decode")] * 4 + [(4, "prefill")]
    assert str(sim.state.shape()) == "1P@tp4:4D@tp1"
    pre = next(e for e in sim.engines.values() if e.role is P)
    assert sim.perf_for(len(pre.devices)).tp == 4 and sim.state.check_invariants() is None


def test_layout_prefill_tp_is_checked():
    with pytest.raises(ConfigError, match=r"layout 1P@tp4:3D@tp1 needs 7 devices but cluster.rollout_devices is 8"):
        _scenario(layout={"mode": "disaggregated", "prefill": 1, "decode": 3, "prefill_tp": 4})
    with pytest.raises(ConfigError, match="needs mode: disaggregated"):
        _scenario(layout={"mode": "colocated", "prefill_tp": 4})
    with pytest.raises(ConfigError, match=r"layout.prefill_tp \(16\) is larger than cluster.devices_per_node \(8\)"):
        _scenario(cluster={"rollout_devices": 20}, layout={"mode": "disaggregated", "prefill": 1, "decode": 4,
                                                           "prefill_tp": 16})


def test_tuner_gives_static_pd_and_bound_the_same_knob_when_pearl_has_it():
    from pearl.runtime.tuning import Knobs, bound_candidates, candidates, configure, pair_ratios

    off = _scenario()
    on = _scenario(policy={"name": "pearl", "per_role_tp": True})
    assert not any(k.prefill_tp for k in candidates(off, "static-pd"))
    pd = candidates(on, "static-pd")
    pairs = [k for k in pd if k.prefill_tp is not None]
    assert pairs and all(k.prefill * k.prefill_tp + k.decode * k.tp == 8 and k.prefill_tp != k.tp for k in pairs)
    assert Knobs(1, None, 1, 4, 4) in pairs and Knobs(4, None, 4, 1, 1) in pairs
    assert not any(k.prefill_tp for k in candidates(on, "fixed"))  # colocated baselines: nothing to split
    assert any(k.prefill_tp for k, _ in bound_candidates(on, 8.0))
    assert pair_ratios(8, 4, 1) == [1] and pair_ratios(8, 1, 2) == [2, 4]
    c = configure(on, Knobs(1, None, 1, 4, 4).overrides())
    assert str(c.layout.shape(8, c.engine.tp)) == "1P@tp4:4D@tp1"
    assert configure(c, Knobs(2).overrides()).layout.prefill_tp is None  # a colocated knob clears it


def test_pearl_switches_into_a_per_role_layout_in_the_simulator():
    """A prefill-heavy workload (8 turns of ~6k-token observations, ~100-token answers) on 8 devices,
    tp 1 or 4: PEARL with the knob ranks per-role shapes, switches into one, and the simulator runs
    its workers at their own sizes (tp1 prefill workers beside a tp4 decode worker). 4×8 trajectories,
    whose contexts the decode worker's KV holds: with 16×8 of 48k-token contexts the cache thrashes, a
    turn's context waiting for a prefill worker is evicted before the pull, and PEARL rightly stays
    colocated (colocated×2@tp4); the in-flight cap stays off: this test is about the knob."""
    ln = lambda m, p, cap, lo=1.0: dict(kind="lognormal", median=m, p90=p, cap=cap, min=lo)  # noqa: E731
    wl = dict(profile="search", turns=dict(kind="constant", value=8), observation_tokens=ln(6000, 10000, 16000),
              response_tokens=ln(100, 200, 400), env_latency_s=ln(0.1, 0.3, 2, 0.01), max_context=131072)
    cfg = _scenario(duration_s=300.0, workload=wl, rl={"prompts_per_batch": 4, "group_size": 8},
                    policy={"name": "pearl", "per_role_tp": True, "tps": [1, 4], "adapt_cap": False})
    sim = Simulator(cfg)
    res = sim.run()
    into = [d for d in res["decisions"] if d["switch"] and "P@tp" in d.get("chosen", "")]
    assert into, [(d.get("chosen"), d["reason"][:60]) for d in res["decisions"]]
    t = into[0]["t"]
    started = [e for e in sim.state.timeline() if e["kind"] == "worker_started" and e["t"] >= t]
    assert any(e["role"] == "decode" and len(e["devices"]) == 4 for e in started)
    # (tp1 workers became its prefill workers in place; the tp4 decode worker was started)
    sizes = {(e.role.value, len(e.devices)) for e in sim.engines.values() if e.devices and e.devices[0] < 8}
    assert sizes == {("prefill", 1), ("decode", 4)}, sizes
    sim.state.check_invariants()
