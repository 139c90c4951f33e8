"""Tests of pearl.control.predictor: the vectorised step times equal the roofline's, the fixed point
converges and moves the right way (more environment latency -> lower decode concurrency; more devices
-> never slower), completion respects the slowest trajectory's critical path, count-only predictions
agree with the average over concrete batches, three small cells land within 15% of the simulator, and
a capped pipeline (trajectories queued behind a cap on those in flight) within 12%."""
from __future__ import annotations

import numpy as np
import pytest

from pearl.config import Dist, EngineConfig, ScenarioConfig, WorkloadConfig, parse_config
from pearl.control.predictor import (BatchState, TrajectoryProgress, WorkloadStats, _Coeffs, _step, predict,
                                     predict_many, prepare)
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfCoeffs, PerfModel
from pearl.runtime.sim import Simulator
from pearl.types import LayoutShape
from pearl.workloads import Workload

H800 = get_hardware("h800")
Q8 = PerfModel(get_model("qwen3-8b"), H800)
ENGINE = EngineConfig()


def stats(profile: str = "math-tool", n: int = 512, **over) -> WorkloadStats:
    return WorkloadStats.from_workload(Workload(WorkloadConfig(profile=profile, **over), 0), n)


def batch_specs(cfg: ScenarioConfig):
    """The trajectories the simulator admits at t=0 (same indices, groups and group prompts)."""
    wl, g = Workload(cfg.workload, cfg.seed), cfg.rl.group_size
    return [wl.trajectory(i * g + j, i, wl.group_prompt_tokens(i)) for i in range(cfg.rl.prompts_per_batch)
            for j in range(g)]


@pytest.mark.parametrize("model,tp,coeffs", [("qwen3-8b", 1, PerfCoeffs()), ("qwen3-8b", 2, PerfCoeffs()),
                                             ("qwen3-30b-a3b", 1, PerfCoeffs()),
                                             ("qwen3-30b-a3b", 4, PerfCoeffs(combine="sum", mfu=0.3)),
                                             # a CPU calibration's per-sequence cost (SmolLM2: ~9 ms)
                                             ("qwen3-8b", 2, PerfCoeffs(combine="sum", seq_overhead_s=0.009))])
def test_vectorised_step_equals_roofline(model, tp, coeffs):
    pm = PerfModel(get_model(model), H800, tp=tp, coeffs=coeffs)
    cf = _Coeffs.of(pm)
    rng = np.random.default_rng(0)
    for _ in range(50):
        b, ctx = int(rng.integers(1, 200)), float(rng.integers(0, 10**6))
        p, c = int(rng.integers(1, 8192)), float(rng.integers(0, 30000))
        assert float(_step(cf, b, ctx)) == pytest.approx(pm.step_time(b, ctx), rel=1e-9)
        attn = p * (c + p / 2)
        assert float(_step(cf, b, ctx, p, attn)) == pytest.approx(pm.step_time(b, ctx, p, attn), rel=1e-9)


def test_fixed_point_converges():
    st = stats("swe", 256)
    shapes = [LayoutShape.colocated(8), LayoutShape.disaggregated(2, 6), LayoutShape.disaggregated(6, 2)]
    loose = predict_many(shapes, [Q8] * 3, ENGINE, st, BatchState.fresh(64))
    tight = predict_many(shapes, [Q8] * 3, ENGINE, st, BatchState.fresh(64), tol=1e-6)
    for a, b in zip(loose, tight):
        assert a.breakdown["iterations"] < 60 and b.breakdown["iterations"] < 60
        assert a.completion_s == pytest.approx(b.completion_s, rel=2e-3)


def test_more_env_latency_lowers_decode_concurrency():
    conc = []
    for lat in (0.01, 1.0, 5.0, 20.0):
        st = stats("search", 256, env_latency_s=Dist(kind="constant", value=lat))
        conc.append(predict(LayoutShape.colocated(4), Q8, ENGINE, st, BatchState.fresh(64)).decode_concurrency)
    assert all(a > b for a, b in zip(conc, conc[1:])), conc


@pytest.mark.parametrize("profile", ["swe", "search", "game", "math-tool"])
def test_more_devices_are_never_slower_colocated(profile):
    st = stats(profile, 256)
    shapes = [LayoutShape.colocated(n) for n in (1, 2, 4, 8, 16, 32)]
    t = [p.completion_s for p in predict_many(shapes, [Q8] * len(shapes), ENGINE, st, BatchState.fresh(128))]
    assert all(b <= a * (1 + 1e-3) for a, b in zip(t, t[1:])), t


def test_completion_is_at_least_the_slowest_critical_path():
    st = stats("math-tool", 64)
    specs = [st.spec(i) for i in range(16)]
    alone = max(sum(s.env_latency) + sum((r - 1) * Q8.step_time(1, s.prompt_tokens) for r in s.responses)
                for s in specs)
    for shape in (LayoutShape.colocated(4), LayoutShape.disaggregated(1, 3)):
        assert predict(shape, Q8, ENGINE, st, BatchState.from_specs(specs)).completion_s >= alone


def context_after(spec, turns: int) -> int:
    """Tokens in context after `turns` finished turns (the next observation not yet added)."""
    return spec.prompt_tokens + sum(spec.responses[:turns]) + sum(spec.observations[:max(turns - 1, 0)])


def test_progress_shortens_the_prediction():
    st = stats("game", 512)
    specs = [s for s in (st.spec(i) for i in range(200)) if s.turns >= 4][:32]
    shape = LayoutShape.colocated(4)
    start = predict(shape, Q8, ENGINE, st, BatchState.from_specs(specs)).completion_s
    half = tuple(TrajectoryProgress(s.turns // 2, context_after(s, s.turns // 2), s) for s in specs)
    assert predict(shape, Q8, ENGINE, st, BatchState(trajectories=half)).completion_s < start
    # Lengths unknown: trajectories 5 turns in have fewer turns left than fresh ones (game: 2-10 turns).
    fresh = predict(shape, Q8, ENGINE, st, BatchState.fresh(32)).completion_s
    later = BatchState(trajectories=tuple(TrajectoryProgress(5, 1500) for _ in range(32)))
    assert predict(shape, Q8, ENGINE, st, later).completion_s < fresh


def test_count_only_agrees_with_the_average_over_concrete_batches():
    st_big, shape = stats("search", 4096), LayoutShape.colocated(4)
    wl = Workload(WorkloadConfig(profile="search"), 0)
    known = []
    for seed in range(40):
        wl.seed = seed
        specs = [wl.trajectory(i, i) for i in range(32)]
        known.append(predict(shape, Q8, ENGINE, stats("search", 64), BatchState.from_specs(specs)).completion_s)
    count = predict(shape, Q8, ENGINE, st_big, BatchState.fresh(32)).completion_s
    assert count == pytest.approx(np.mean(known), rel=0.08)


def test_kv_pressure_evicts_and_slows():
    st = stats("swe", 256)
    roomy = PerfModel(get_model("qwen3-8b"), H800, memory_utilization=0.9)
    tight = PerfModel(get_model("qwen3-8b"), H800, memory_utilization=0.3)
    a, b = (predict(LayoutShape.colocated(4), pm, ENGINE, st, BatchState.fresh(64)) for pm in (roomy, tight))
    assert b.breakdown["evicted_share"] > a.breakdown["evicted_share"]
    assert b.completion_s > a.completion_s


def test_stats_from_samples_and_prior():
    st = stats("game", 512)
    specs = [st.spec(i) for i in range(st.size)]
    again = WorkloadStats.from_samples(specs)
    for name in ("turns", "prompt_tokens", "response_tokens", "observation_tokens", "env_latency_s"):
        assert again.mean(name) == pytest.approx(st.mean(name))
    assert st.quantile("response_tokens", 0.9) > st.quantile("response_tokens", 0.5)
    short = [s for s in specs if s.turns <= 3][:20]
    blended = WorkloadStats.from_samples(short, prior=st, prior_weight=200)
    assert WorkloadStats.from_samples(short).mean("turns") < blended.mean("turns") < st.mean("turns") + 1e-9


def test_event_merging_keeps_totals():
    st = stats("swe", 64)
    full, merged = prepare(st, BatchState.fresh(32)), prepare(st, BatchState.fresh(32), max_events=4)
    for k in ("ev_x", "ev_attn"):
        assert (merged.work[k] * merged.work["ev_m"]).sum() == pytest.approx(full.work[k].sum())
    assert merged.work["ev_x"].size <= 4 * len(merged.w)


@pytest.mark.parametrize("profile,model,tp,layout", [
    ("search", "qwen3-8b", 1, dict(mode="colocated")),
    ("math-tool", "qwen3-8b", 1, dict(mode="disaggregated", prefill=1, decode=3)),
    ("game", "qwen3-30b-a3b", 2, dict(mode="colocated")),
])
def test_within_15_percent_of_the_simulator(profile, model, tp, layout):
    cfg = parse_config(dict(model=model, max_train_steps=1, duration_s=1e7, engine=dict(tp=tp),
                            cluster=dict(rollout_devices=4), layout=layout, workload=dict(profile=profile),
                            rl=dict(staleness=0, prompts_per_batch=4, group_size=8)), ScenarioConfig)
    sim = Simulator(cfg)
    truth = sim.run()["per_step"][0]["t_ready"]
    st = WorkloadStats.from_workload(Workload(cfg.workload, 0), 128)
    pred = predict(cfg.layout.shape(4, tp), sim.perf, cfg.engine, st, BatchState.from_specs(batch_specs(cfg)))
    assert pred.completion_s == pytest.approx(truth, rel=0.15)
    assert pred.bottleneck in ("decode", "env", "prefill")


@pytest.mark.parametrize("profile,shape", [("swe", LayoutShape.colocated(4, 2)),
                                           ("math-tool", LayoutShape.disaggregated(1, 3, 2))])
def test_a_capped_pipeline_within_12_percent_of_the_simulator(profile, shape):
    """512 trajectories, at most 128 in flight on 8 devices (swe: KV-bound). The 384 queued behind the
    cap go through at the steady state's pace (each finished one replaced at once); timing them from
    the lives of a batch of 128 draining down under-predicted these cells by 21% and 37%."""
    cfg = parse_config(dict(model="qwen3-8b", max_train_steps=1, duration_s=1e7, engine=dict(tp=shape.tp),
                            cluster=dict(rollout_devices=8), workload=dict(profile=profile),
                            layout=dict(mode=shape.mode.value, prefill=shape.n_prefill, decode=shape.n_decode),
                            rl=dict(staleness=0, prompts_per_batch=64, group_size=8, max_concurrent_trajectories=128)),
                       ScenarioConfig)
    sim = Simulator(cfg)
    truth = sim.run()["per_step"][0]["t_ready"]
    st = WorkloadStats.from_workload(Workload(cfg.workload, 1), 2048)
    capped = predict(shape, sim.perf, cfg.engine, st, BatchState(n_fresh=128, queued=384))
    assert capped.completion_s == pytest.approx(truth, rel=0.12)
    batch = predict(shape, sim.perf, cfg.engine, st, BatchState.fresh(128))
    # each queued one lives at least as long as a draining batch's mean (more company all its life)
    assert capped.completion_s > batch.completion_s + 3 * batch.breakdown["mean_T"]
    assert capped.tokens_per_s * capped.completion_s == pytest.approx(4 * batch.tokens_per_s * batch.completion_s)


def test_decoders_beyond_max_num_seqs_wait():
    """512 math-tool trajectories on one tp8 engine: about 490 want a decode step at first, the engine
    runs at most `max_num_seqs` and the rest wait their turn. Taking the batch as max_num_seqs with
    every decoder advancing each step under-predicted this cell by 10% at 256 (the default)."""
    shape = LayoutShape.colocated(1, 8)
    out = {}
    for seqs in (256, 96):
        cfg = parse_config(dict(model="qwen3-8b", max_train_steps=1, duration_s=1e7,
                                engine=dict(tp=8, max_num_seqs=seqs), cluster=dict(rollout_devices=8),
                                workload=dict(profile="math-tool"),
                                rl=dict(staleness=0, prompts_per_batch=64, group_size=8)), ScenarioConfig)
        sim = Simulator(cfg)
        truth = sim.run()["per_step"][0]["t_ready"]
        st = WorkloadStats.from_workload(Workload(cfg.workload, 1), 2048)
        out[seqs] = predict(shape, sim.perf, cfg.engine, st, BatchState.fresh(512)).completion_s, truth
        assert out[seqs][0] == pytest.approx(truth, rel=0.07), seqs
    assert out[96][0] > 1.15 * out[256][0]  # fewer slots: longer, as in the simulator


def test_recomputed_contexts_pay_their_all_reduces():
    """512 swe trajectories on one tp8 engine thrash its KV: most turns recompute their whole context
    (~250M prefill tokens for ~5M decoded). At tp 8 each recomputed token's all-reduces cost more than
    its FLOPs; pricing the recompute by FLOPs alone under-predicted this cell by 39%."""
    shape = LayoutShape.colocated(1, 8)
    cfg = parse_config(dict(model="qwen3-8b", max_train_steps=1, duration_s=1e7, engine=dict(tp=8),
                            cluster=dict(rollout_devices=8), workload=dict(profile="swe"),
                            rl=dict(staleness=0, prompts_per_batch=64, group_size=8)), ScenarioConfig)
    sim = Simulator(cfg)
    truth = sim.run()["per_step"][0]["t_ready"]
    st = WorkloadStats.from_workload(Workload(cfg.workload, 1), 2048)
    assert predict(shape, sim.perf, cfg.engine, st, BatchState.fresh(512)).completion_s == pytest.approx(truth, rel=0.15)


@pytest.mark.parametrize("profile", ["swe", "search", "game", "math-tool", "web"])
def test_few_representatives_keep_the_batchs_sums_and_its_late_tail(profile):
    """The controller predicts from 32 representatives of its 2048-trajectory window. They keep the
    window's mean prefill tokens, environment seconds and own-context reads (a random member per
    bucket missed them by up to 19%: search's environment, web's prefill and context reads), and the
    last 5% of the batch (those still running when it ends) is stood for by several, not one."""
    from pearl.config import ControllerConfig

    k = ControllerConfig()
    st = WorkloadStats.from_workload(Workload(WorkloadConfig(profile=profile), 999_331), 2048)
    full, few = prepare(st, BatchState.fresh(512), 4096), prepare(st, BatchState.fresh(512), k.predict_reps,
                                                                  k.predict_events)
    assert len(few.w) <= k.predict_reps
    for key in ("K", "Dn", "X", "E", "Cd"):
        mean = (full.w * full.work[key]).sum() / full.w.sum()
        assert (few.w * few.work[key]).sum() / few.w.sum() == pytest.approx(mean, rel=0.04), key
    # (a representative's score as the samples are ordered by: environment + 10 ms per response token)
    late = (few.work["E"] + 0.01 * (few.work["Dn"] + few.work["K"])) >= np.quantile(st.work_score, 0.95)
    assert late.sum() >= 8 and few.w[late].max() <= 0.03 * few.w.sum(), few.w[late] / few.w.sum()


def _one_batch(profile: str, shape: LayoutShape, cap: int | None = None, seed: int = 0):
    """512 trajectories of `profile` on 8 devices laid out as `shape`: the simulator and a predictor."""
    cfg = parse_config(dict(seed=seed, model="qwen3-8b", max_train_steps=1, duration_s=1e7, engine=dict(tp=shape.tp),
                            cluster=dict(rollout_devices=8), workload=dict(profile=profile),
                            layout=dict(mode=shape.mode.value, prefill=shape.n_prefill, decode=shape.n_decode),
                            rl=dict(staleness=0, prompts_per_batch=64, group_size=8,
                                    max_concurrent_trajectories=cap)), ScenarioConfig)
    sim = Simulator(cfg)
    truth = sim.run()["per_step"][0]["t_ready"]
    st = WorkloadStats.from_workload(Workload(cfg.workload, 1), 2048)
    return truth, lambda batch: predict(shape, sim.perf, cfg.engine, st, batch).completion_s


def test_a_saturated_prefill_worker_serves_at_its_flops_and_turns_crowd_late():
    """512 game trajectories on 1P:7D: one prefill worker busy ~80% of the batch, its queue ~0.7 s a
    turn. Its 100-token prompts alone ride a weight-read-bound step nearly free, but queued they share
    compute-bound chunks: a turn costs its FLOPs (3.6 ms, not 0.2). And with the waits long early and
    short late, a trajectory's turns crowd into the late segments. Without either this cell was
    under-predicted by 20%, with the service alone over-predicted by 19%."""
    truth, pred = _one_batch("game", LayoutShape.disaggregated(1, 7, 1))
    assert pred(BatchState.fresh(512)) == pytest.approx(truth, rel=0.12)


@pytest.mark.parametrize("profile, shape", [
    ("web", LayoutShape.disaggregated(1, 7, 1)),
    pytest.param("swe", LayoutShape.disaggregated(2, 6, 1), marks=pytest.mark.xfail(strict=True, reason=(
        "since 2026-12-07 the simulator prices a long prompt's chunks at their growing prefix "
        "(pearl.engine.chunks) and pulls a waiting turn's context at admission from the decode worker, "
        "which may have evicted it: seed 0's truth went 3068 -> 3299 -> 3725 s; the predictor, 3.0% short "
        "before, is 15.7% long (4309 s), the mean of seeds 0 and 1 9.0% long")))])
def test_a_turns_wait_is_the_queues_where_its_turns_are(profile, shape):
    """512 web trajectories on 1P:7D, and swe on 2P:6D: the prefill queue is long early and empty
    late, and a trajectory's turns crowd into the late segments. Its mean wait per turn is then the
    queue's wait weighted by its turns, not by time: averaged over time it was too long, the time
    left outside the queue (decode and environment) too short, and the closed queue too full.
    Before: web +16.6%, swe -11.2% (the think time's error fed the KV evictions)."""
    truth, pred = _one_batch(profile, shape)
    assert pred(BatchState.fresh(512)) == pytest.approx(truth, rel=0.08), profile


def test_a_capped_pipelines_slots_start_together():
    """512 game trajectories, at most 128 in flight: the 128 slots all start at t=0, so the first
    replacements come later than the steady pace (renewal: the k-th at (k + (1 - CV²)/2) mean lives,
    CV² ~ 0.23 here). Timing the queue at the steady pace from t=0 under-predicted this cell by 9%."""
    truth, pred = _one_batch("game", LayoutShape.colocated(8, 1), cap=128)
    assert pred(BatchState(n_fresh=128, queued=384)) == pytest.approx(truth, rel=0.05)


def test_the_first_prompts_load_the_burst_not_the_lives():
    """512 game trajectories on 8 devices at tp 2, 4 and 8 (one engine holds 128-512 of them): the
    first prompts (~30% of game's prefill tokens) are all prefilled in the burst at t=0. Spread over
    the lives as well, they stretched every mixed step: tp 4 and 8 over-predicted by 7.5% and 10.3%,
    so tp 2 ranked first where the simulator's best is tp 4 (s1-game's tp choice)."""
    shapes = (LayoutShape.colocated(4, 2), LayoutShape.colocated(2, 4), LayoutShape.colocated(1, 8))
    out = {}
    for shape in shapes:
        truth, pred = _one_batch("game", shape)
        out[shape.tp] = pred(BatchState.fresh(512)), truth
        assert out[shape.tp][0] == pytest.approx(truth, rel=0.05), shape
    assert min(out, key=lambda tp: out[tp][0]) == min(out, key=lambda tp: out[tp][1]) == 4


def test_a_turn_waiting_for_a_prefill_keeps_its_context_on_the_decode_worker():
    """512 swe trajectories on 2P:6D: most turns wait in the prefill queue, their contexts on the
    decode workers until the prefill worker pulls them at admission (the simulator since 2026-12-07;
    before, such a context was in no one's memory). Counted as the alive less the queued, the decode
    side's demand left them out: 3105 s predicted against 4083 s simulated (the mean of seeds 0 and 1,
    3725 and 4442 s: a saturated queue's evictions feed it, so seeds differ); counting them, 4452 s."""
    shape = LayoutShape.disaggregated(2, 6, 1)
    (t0, pred), (t1, _) = _one_batch("swe", shape), _one_batch("swe", shape, seed=1)
    assert pred(BatchState.fresh(512)) == pytest.approx((t0 + t1) / 2, rel=0.12)


def test_each_weight_push_pauses_the_batch_by_the_slowest_workers_sync():
    """A pipeline of (η+1)·B trajectories sees one weight push per batch trained, each pausing every
    worker for its own sync (the shard a rank receives: shorter at a larger tp). On game at 8 devices
    a push at tp 1 is ~5% of a batch's time (`predictor_accuracy.py --pipeline`: 6.64% -> 5.91%)."""
    st = stats("game")
    for shape in (LayoutShape.colocated(8, 1), LayoutShape.colocated(1, 8), LayoutShape.disaggregated(2, 6, 1)):
        pm = Q8.with_tp(shape.tp)
        base = predict(shape, pm, ENGINE, st, BatchState.fresh(512)).completion_s
        pushed = predict(shape, pm, ENGINE, st, BatchState(n_fresh=512, syncs=2))
        assert pushed.completion_s == pytest.approx(base + 2 * pm.weight_sync_time(), rel=1e-9), shape
        assert pushed.tokens_per_s < predict(shape, pm, ENGINE, st, BatchState.fresh(512)).tokens_per_s
    assert Q8.with_tp(8).weight_sync_time() < Q8.weight_sync_time()
