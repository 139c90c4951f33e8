"""Tests of pearl.control.selector: the candidate set, ranking by completion + transition cost, the
coarse-to-fine search against the exhaustive one, and the premise of PEARL: a prefill-heavy workload
and a decode-heavy one get different best shapes on the same devices, and the simulator agrees."""
from __future__ import annotations

import pytest

from pearl.config import Dist, EngineConfig, ScenarioConfig, WorkloadConfig, parse_config
from pearl.control.predictor import BatchState, WorkloadStats
from pearl.control.selector import candidates, select
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.runtime.sim import Simulator
from pearl.types import LayoutShape, Mode
from pearl.workloads import Workload

ENGINE = EngineConfig()
Q8 = PerfModel(get_model("qwen3-8b"), get_hardware("h800"))
# Long observations every turn (retrieved pages), short answers, quick tools: prefill dominates.
LN = lambda m, p, cap, lo=1.0: Dist(kind="lognormal", median=m, p90=p, cap=cap, min=lo)  # noqa: E731
PREFILL_HEAVY = WorkloadConfig(profile="search", turns=Dist(kind="constant", value=8),
                               observation_tokens=LN(6000, 10000, 16000), response_tokens=LN(100, 200, 400),
                               env_latency_s=LN(0.1, 0.3, 2, 0.01), max_context=131072)
DECODE_HEAVY = WorkloadConfig(profile="math-tool")


def stats(wl: WorkloadConfig, n: int = 512) -> WorkloadStats:
    return WorkloadStats.from_workload(Workload(wl, 0), n)


def test_candidates():
    c = candidates(8, (1, 2, 3, 16))
    assert LayoutShape.colocated(8) in c and LayoutShape.colocated(4, 2) in c
    assert all(s.n_devices == 8 for s in c) and not any(s.tp in (3, 16) for s in c)
    assert len([s for s in c if s.tp == 1]) == 8 and len([s for s in c if s.tp == 2]) == 4  # colocated + P:D
    assert len(c) == len(set(c))
    assert candidates(1, (1,)) == [LayoutShape.colocated(1)]


def test_ranks_by_completion_plus_transition_cost():
    st = stats(DECODE_HEAVY, 256)
    sel = select(8, {1: Q8, 2: Q8.with_tp(2)}, ENGINE, st, BatchState.fresh(64))
    scores = [r[3] for r in sel.ranked]
    assert scores == sorted(scores) and sel.best == sel.ranked[0][0]
    assert len(sel.ranked) == len(candidates(8, (1, 2))) == sel.evaluated
    assert all(r[3] == pytest.approx(r[1].completion_s + r[2]) for r in sel.ranked)
    assert str(sel.best) in sel.reason
    # Leaving the current layout costs more than any gain: keep it, at no cost.
    current = next(s for s, *_ in sel.ranked[1:] if s.mode is Mode.DISAGGREGATED)
    keep = select(8, {1: Q8, 2: Q8.with_tp(2)}, ENGINE, st, BatchState.fresh(64), current=current,
                  transition_cost_s=lambda s: 1e6)
    assert keep.best == current and keep.ranked[0][2] == 0.0


def test_skips_a_tp_that_does_not_fit():
    # 61 GB of weights do not fit in 70% of one 80 GiB device, but do in two.
    moe = PerfModel(get_model("qwen3-30b-a3b"), get_hardware("h800"), memory_utilization=0.7)
    sel = select(4, lambda tp: moe.with_tp(tp), ENGINE, stats(DECODE_HEAVY, 64), BatchState.fresh(16), tps=(1, 2))
    assert {s.tp for s, *_ in sel.ranked} == {2}


@pytest.mark.parametrize("wl,n,batch", [(PREFILL_HEAVY, 128, 1024), (DECODE_HEAVY, 256, 2048),
                                        (WorkloadConfig(profile="swe"), 96, 384)])
def test_coarse_to_fine_finds_the_exhaustive_best(wl, n, batch):
    perfs = {tp: Q8.with_tp(tp) for tp in (1, 2, 4)}
    st = stats(wl, 256)
    fast = select(n, perfs, ENGINE, st, BatchState.fresh(batch))
    full = select(n, perfs, ENGINE, st, BatchState.fresh(batch), shapes=candidates(n, (1, 2, 4)))
    assert fast.evaluated < len(candidates(n, (1, 2, 4))) / 2
    assert fast.ranked[0][3] <= full.ranked[0][3] * 1.01


def simulate(wl: WorkloadConfig, shape: LayoutShape, prompts: int) -> float:
    lay = (dict(mode="colocated") if shape.mode is Mode.COLOCATED else
           dict(mode="disaggregated", prefill=shape.n_prefill, decode=shape.n_decode))
    cfg = parse_config(dict(max_train_steps=1, duration_s=1e7, cluster=dict(rollout_devices=shape.n_devices),
                            layout=lay, workload=wl.model_dump(), rl=dict(staleness=0, prompts_per_batch=prompts,
                                                                          group_size=8)), ScenarioConfig)
    return Simulator(cfg).run()["per_step"][0]["t_ready"]


@pytest.mark.parametrize("wl, prompts", [
    (PREFILL_HEAVY, 8), (DECODE_HEAVY, 12),
    pytest.param(PREFILL_HEAVY, 16, marks=pytest.mark.xfail(strict=True, reason=(
        "128 trajectories of 40k-token contexts on 4 devices thrash the KV: the simulator runs colocated×4 "
        "in 348 s and the pick, 2P:2D, in 513 s (its contexts are evicted from the decode workers while "
        "their turns wait for a prefill worker: 17% of the pulls find them); the predictor says 271 s")))])
def test_the_pick_is_the_simulators_best(wl, prompts):
    """Prefill-heavy (8 turns of ~10k-token observations) and decode-heavy workloads on 4 devices.
    Until 2026-12-07 the prefill-heavy one picked a disaggregated shape, and the simulator agreed: a
    turn's context waited for its prefill worker in no one's memory. Pulled at admission from the
    decode worker that still holds it, colocated wins every shape the selector weighs here."""
    sel = select(4, {1: Q8}, ENGINE, stats(wl), BatchState.fresh(8 * prompts))
    sim = {s: simulate(wl, s, prompts) for s, *_ in sel.ranked}
    best = min(sim, key=sim.get)
    assert sim[sel.best] <= 1.05 * sim[best], (sel.best, sim)


def test_a_memo_reuses_predictions_and_ranks_the_same(monkeypatch):
    """The controller keeps the selector's predictions while its estimate and batch hold: a second
    decision (another current layout) predicts only what was not predicted yet, and ranks as a
    decision without the memo does."""
    import pearl.control.selector as selector

    perfs, st, batch = {tp: Q8.with_tp(tp) for tp in (1, 2)}, stats(DECODE_HEAVY, 256), BatchState.fresh(256)
    calls = []
    real = selector.predict_shapes
    monkeypatch.setattr(selector, "predict_shapes", lambda shapes, *a, **k: calls.append(len(shapes)) or real(shapes, *a, **k))
    memo: dict = {}
    select(16, perfs, ENGINE, st, batch, memo=memo)
    first = sum(calls)
    cur = LayoutShape.disaggregated(3, 13, 1)
    again = select(16, perfs, ENGINE, st, batch, current=cur, memo=memo)
    second = sum(calls) - first
    fresh = select(16, perfs, ENGINE, st, batch, current=cur)
    assert first > 0 and second == len(memo) - first and second < fresh.evaluated / 2
    assert [s for s, *_ in again.ranked[:5]] == [s for s, *_ in fresh.ranked[:5]]
