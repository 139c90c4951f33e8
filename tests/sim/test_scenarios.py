"""The paper's experiment as scenarios: spot traces, non-stationary workloads, the matrix, and the
plan-tuned static baseline (docs/scenarios.md)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pearl.config import ElasticConfig, ScenarioConfig, WorkloadConfig, load_config, parse_config
from pearl.config_schedule import SchedulePoint, factors
from pearl.runtime.elastic import trace
from pearl.runtime.paper import CLUSTERS, POOLS, bottleneck, cells, smoke_cells, spot_elastic, spot_share
from pearl.runtime.sim import Simulator
from pearl.runtime.sim_records import SimTrajectory
from pearl.workloads import Workload

ROOT = Path(__file__).resolve().parents[2]
HOURS = 3600.0


# ------------------------------------------------------------------ spot traces
def _spot(pool: int = 32, **over) -> ElasticConfig:
    return ElasticConfig(**{**spot_elastic(pool, "spot"), **over})


def test_spot_lifetimes_notices_and_availability_follow_the_config():
    cfg = _spot(32)
    bursts = trace(cfg, 3000 * HOURS, seed=0)
    born = [b for b in bursts if b.t_add > cfg.start_s]  # not cut at the start
    life = np.array([b.t_remove - b.t_add for b in born])
    assert len(life) > 3000
    assert np.median(life) == pytest.approx(3600, rel=0.06)  # median 60 min
    assert np.quantile(life, 0.9) == pytest.approx(10800, rel=0.08)  # p90 3 h
    assert np.mean([b.notice_s == 30 for b in bursts]) == pytest.approx(0.7, abs=0.03)
    assert all(b.notice_s in (None, 30) for b in bursts)
    assert {b.count for b in bursts} == {8}  # whole nodes arrive and leave
    horizon = 3000 * HOURS
    up = sum(min(b.t_remove, horizon) - b.t_add for b in bursts) / (horizon * 32 / 8)
    assert up == pytest.approx(spot_share(3600, 10800, 0.8), abs=0.03)


def test_spot_pool_never_exceeds_its_size_and_is_seeded():
    cfg = _spot(16)
    bursts = trace(cfg, 200 * HOURS, seed=3)
    events = sorted([(b.t_add, b.count) for b in bursts] + [(b.t_remove, -b.count) for b in bursts],
                    key=lambda e: (e[0], e[1]))
    level = np.cumsum([c for _, c in events])
    assert level.max() <= 16 and level.min() >= 0
    assert trace(cfg, 200 * HOURS, seed=3) == bursts
    assert trace(cfg, 200 * HOURS, seed=4) != bursts


def test_constant_control_is_the_whole_pool_for_the_whole_run():
    bursts = trace(ElasticConfig(**spot_elastic(32, "constant")), 10 * HOURS, seed=0)
    assert sum(b.count for b in bursts) == 32
    assert all(b.t_add == 0 and math.isinf(b.t_remove) and b.notice_s is None for b in bursts)


def _elastic_run(kind: str, policy: str = "pearl") -> Simulator:
    el = {**spot_elastic(16, kind), "lifetime_s": {"kind": "lognormal", "median": 300, "p90": 900},
          "arrival_rate_per_h": 12.0}
    cfg = parse_config(dict(name="spot-sim", duration_s=1800, cluster=dict(rollout_devices=8, train_devices=8,
                                                                               elastic=el),
                            workload=dict(profile="game"), rl=dict(prompts_per_batch=8, group_size=8),
                            policy=dict(name=policy)), ScenarioConfig)
    sim = Simulator(cfg)
    sim.run()
    return sim


def test_a_spot_trace_reaches_the_controller_and_the_devices_serve():
    sim = _elastic_run("spot")
    elastic = [d for d, (a, b) in sim.device_time.items()]
    gone = [d for d, (a, b) in sim.device_time.items() if b is not None]
    assert elastic and gone  # nodes arrived and left in half an hour of short lifetimes
    triggers = [d["trigger"] for d in sim.driver.decisions]
    assert any("elastic devices arrived" in t for t in triggers)
    assert any("elastic devices gone" in t for t in triggers)
    assert any("revocation notice" in t for t in triggers)
    assert any(e.devices[0] in elastic for e in sim.all_engines)  # PEARL ran workers on them
    nodes = {sim.state.devices[d].node for d in elastic}
    assert all(sum(sim.state.devices[d].node == n for d in elastic) <= 8 for n in nodes)


# ------------------------------------------------------------------ non-stationary workloads
def test_schedule_factors_interpolate_and_hold_outside():
    pts = [SchedulePoint(step=0), SchedulePoint(step=10, response=4.0, turns=2.0),
           SchedulePoint(step=20, response=4.0, env_latency=0.5)]
    assert factors(None, 7) == dict(response=1.0, turns=1.0, observation=1.0, env_latency=1.0)
    assert factors(pts, 5)["response"] == pytest.approx(2.5)
    assert factors(pts, 5)["turns"] == pytest.approx(1.5)
    assert factors(pts, 15)["turns"] == pytest.approx(1.5)
    assert factors(pts, 1000) == dict(response=4.0, turns=1.0, observation=1.0, env_latency=0.5)


def _means(wl: Workload, step: int) -> dict[str, float]:
    specs = [wl.trajectory(i, i, step=step) for i in range(800)]
    return dict(turns=np.mean([s.turns for s in specs]), response=np.mean([r for s in specs for r in s.responses]),
                observation=np.mean([o for s in specs for o in s.observations]),
                env=np.mean([e for s in specs for e in s.env_latency]))


def test_the_sampler_follows_the_schedule():
    # per-turn quantities: the same draws, scaled (turns unchanged, so each trajectory draws the same)
    wl = Workload(WorkloadConfig(profile="search", max_context=10**6, schedule=[
        {"step": 0}, {"step": 10, "response": 4.0, "observation": 2.0, "env_latency": 3.0}]), seed=1)
    m0, m5, m10 = _means(wl, 0), _means(wl, 5), _means(wl, 10)
    assert m10["response"] / m0["response"] == pytest.approx(4.0, rel=0.01)
    assert m5["response"] / m0["response"] == pytest.approx(2.5, rel=0.01)
    assert m10["observation"] / m0["observation"] == pytest.approx(2.0, rel=0.01)
    assert m10["env"] / m0["env"] == pytest.approx(3.0, rel=0.01)
    assert m10["turns"] == m0["turns"]
    assert wl.trajectory(3, 3) == wl.trajectory(3, 3, step=0)  # no step: the schedule's start
    # turns: the draw scaled, then rounded
    more = Workload(WorkloadConfig(profile="search", max_context=10**6,
                                   schedule=[{"step": 0}, {"step": 10, "turns": 3.0}]), seed=1)
    assert _means(more, 10)["turns"] / _means(more, 0)["turns"] == pytest.approx(3.0, rel=0.05)


def test_a_non_stationary_simulation_trains_longer_trajectories_later():
    cfg = load_config(ROOT / "scenarios" / "ns-math-tool-qwen3-8b-growing.yaml", ScenarioConfig,
                      {"max_train_steps": 6, "workload": {"schedule": [{"step": 0}, {"step": 4, "response": 4.0}]}})
    res = Simulator(cfg).run()
    per_traj = [s["tokens"] / s["trajectories"] for s in res["per_step"]]
    assert len(per_traj) == 6
    assert per_traj[-1] > 2.5 * per_traj[0]
    same = load_config(ROOT / "scenarios" / "ns-math-tool-qwen3-8b-growing.yaml", ScenarioConfig,
                       {"max_train_steps": 6, "workload": {"schedule": None}})
    flat = [s["tokens"] / s["trajectories"] for s in Simulator(same).run()["per_step"]]
    assert max(flat) < 1.6 * min(flat)


# ------------------------------------------------------------------ the matrix
def test_the_matrix_lists_every_cell_once():
    cs = cells()
    keys = [(c.key, c.seed) for c in cs]
    assert len(set(keys)) == len(keys)
    per_model = {m: sum(1 + 2 * (len(POOLS[m]) - 1) for cl in CLUSTERS if m in cl.models) for m in POOLS}
    assert per_model == {"qwen3-8b": 4 * 7, "qwen3-30b-a3b": 5 * 9}
    assert len(cs) == sum(per_model.values()) * 5 * 3
    assert {c.workload for c in cs} == {"swe", "search", "game", "math-tool", "web"}
    assert {c.seed for c in cs} == {0, 1, 2}
    splits = {(c.model, c.config.cluster.rollout_devices, c.config.cluster.train_devices) for c in cs}
    assert ("qwen3-30b-a3b", 96, 32) in splits and ("qwen3-8b", 96, 32) not in splits
    assert {(r, t) for _, r, t in splits} == {(8, 8), (16, 16), (24, 8), (32, 32), (96, 32)}
    for c in cs:
        el = c.config.cluster.elastic
        assert (el.kind, el.max_devices if el.kind != "none" else 0) == (c.availability if c.pool else "none", c.pool)
    assert {c.pool for c in cs if c.model == "qwen3-30b-a3b"} == {0, 8, 16, 32, 64}
    assert {c.pool for c in cs if c.model == "qwen3-8b"} == {0, 8, 16, 32}
    assert {c.config.engine.tp for c in cs if c.model == "qwen3-30b-a3b"} == {2}
    assert len(cells(models=["qwen3-8b"], workloads=["web"], pools=[16], seeds=[0])) == 4 * 2
    assert {c.config.duration_s for c in cs if c.workload == "swe"} == {4 * 3600.0}  # enough swe steps
    assert {c.config.duration_s for c in cs if c.workload != "swe"} == {3600.0}


def test_the_bottleneck_check_marks_trainer_bound_cells():
    (web,) = cells(models=["qwen3-8b"], workloads=["web"], clusters=["16r16t"], pools=[0], seeds=[0])
    (math_tool,) = cells(models=["qwen3-8b"], workloads=["math-tool"], clusters=["8r8t"], pools=[0], seeds=[0])
    assert bottleneck(web).trainer_bound  # as measured: s2-web's fixed layout is paced by its trainer
    assert not bottleneck(math_tool).trainer_bound
    (more,) = cells(models=["qwen3-8b"], workloads=["math-tool"], clusters=["8r8t"], pools=[32],
                    availability=["constant"], seeds=[0])
    assert bottleneck(more).rollout_s < bottleneck(math_tool).rollout_s  # more devices, faster rollout
    assert bottleneck(more).train_s == bottleneck(math_tool).train_s


def test_the_simulated_trainer_prices_attention_by_row_length():
    """A GRPO step over long rows costs more than the same tokens in short rows: causal attention grows
    with the square of a row's length (sum L^2 / sum L, the token-weighted mean row, as the real
    trainer's profile counts pairs)."""
    sim = Simulator(load_config(ROOT / "scenarios" / "s1-swe-qwen3-8b.yaml", ScenarioConfig))
    wl = sim.workload
    rows = [wl.trajectory(i, i) for i in range(64)]
    tokens = sum(r.total_tokens for r in rows)
    seq = sum(r.total_tokens ** 2 for r in rows) / tokens
    assert seq > 20_000  # swe rows are long
    trajs = [SimTrajectory(spec=r, id=str(i), t_start=0.0) for i, r in enumerate(rows)]
    long_s = sim.train_time(trajs, tokens, 8)
    flat_s = sim.perf.train_step_time(tokens, 8, sim.cfg.rl.train_mfu)  # what it cost before: no attention
    assert long_s == pytest.approx(sim.perf.train_step_time(tokens, 8, sim.cfg.rl.train_mfu, seq_len=seq))
    assert long_s > 1.5 * flat_s  # +103% at swe's 45.8k-token mean row (docs/results.md)


def test_a_smoke_paper_cell_simulates():
    spot, const = smoke_cells(duration_s=300)
    assert (spot.availability, const.availability) == ("spot", "constant")
    res = Simulator(const.config.model_copy(update={"policy": const.config.policy.model_copy(
        update={"name": "pearl"})})).run()
    assert res["train_steps"] >= 1
    assert res["utilisation"]["by_pool"]["elastic"] > 0  # the constant pool is used from the start
    assert Simulator(spot.config).run()["train_steps"] >= 1


def test_the_generator_writes_loadable_scenarios(tmp_path):
    import runpy
    import sys
    argv = sys.argv
    sys.argv = ["generate.py", "--smoke", "--out", str(tmp_path)]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(ROOT / "scenarios" / "paper" / "generate.py"), run_name="__main__")
    finally:
        sys.argv = argv
    assert e.value.code == 0
    files = sorted(tmp_path.glob("*.yaml"))
    assert [f.name for f in files] == sorted(f"{c.key}-s0.yaml" for c in smoke_cells())
    for f, c in zip(files, sorted(smoke_cells(), key=lambda c: f"{c.key}-s0.yaml")):
        assert load_config(f, ScenarioConfig) == c.config


# ------------------------------------------------------------------ plan-static
def _cfg(policy: str, **over) -> ScenarioConfig:
    return load_config(ROOT / "scenarios" / "s1-math-tool-qwen3-8b.yaml", ScenarioConfig,
                       {"duration_s": 900, "policy": {"name": policy}, **over})


def test_plan_static_starts_in_the_planned_layout_and_never_changes():
    sim = Simulator(_cfg("plan-static"))
    res = sim.run()
    (d,) = sim.driver.decisions  # one decision, at t = 0
    assert d["t"] == 0 and not d["switch"] and d["rule"] == "keep"
    assert d["chosen"] == d["candidates"][0][0]  # the best-ranked shape, as `pearl plan` ranks them
    assert res["layout_final"] == d["chosen"] != "colocated×8"  # not the configured layout
    assert res["reconfiguration"]["switches"] == 0
    assert all(e.started_t == 0 for e in sim.all_engines)


def test_plan_static_uses_neither_elastic_nor_the_trainers_devices():
    (cell,) = cells(models=["qwen3-8b"], workloads=["math-tool"], clusters=["8r8t"], pools=[8],
                    availability=["constant"], seeds=[0], duration_s=600)
    cfg = cell.config.model_copy(update={"policy": cell.config.policy.model_copy(update={"name": "plan-static"})})
    sim = Simulator(cfg)
    res = sim.run()
    assert res["utilisation"]["by_pool"]["elastic"] == 0
    assert all(sim.state.devices[d].pool.value == "rollout" for e in sim.all_engines for d in e.devices)


def test_plan_static_switches_once_when_the_runtime_started_the_configured_layout(monkeypatch):
    from pearl.runtime.sim_control import SimControl
    configured = SimControl._initial_layout
    monkeypatch.setattr(SimControl, "_initial_layout", lambda self, shape: configured(self, None))
    sim = Simulator(_cfg("plan-static"))
    res = sim.run()
    (d,) = sim.driver.decisions
    assert d["t"] == 0 and d["switch"] and d["current"] == "colocated×8"
    assert res["layout_final"] == d["chosen"] == d["candidates"][0][0]
    assert res["reconfiguration"]["switches"] >= 1


def test_plan_static_loses_no_trajectory():
    from tests.control.test_policies_sim import live_trajectories, run, scenario
    sim, res = run(scenario("plan-static"))
    assert res["train_steps"] >= 2
    assert sim.next_traj == sim.trained_trajs + sim.discarded + len(live_trajectories(sim))


def test_plan_warmup_runs_the_configured_layout_then_plans_once_from_what_it_observed():
    cfg = load_config(ROOT / "scenarios" / "s1-math-tool-qwen3-8b.yaml", ScenarioConfig,
                      {"duration_s": 900, "policy": {"name": "plan-warmup", "plan_after_s": 300}})
    sim = Simulator(cfg)
    res = sim.run()
    (d,) = sim.driver.decisions  # one decision, at plan_after_s
    assert d["t"] == 300 and d["current"] == "colocated×8"  # the configured layout ran until then
    assert d["estimate"]["trajectories"] > 0  # planned from trajectories it saw finish, not told
    assert d["switch"] and d["chosen"] == d["candidates"][0][0] == res["layout_final"]
    assert res["reconfiguration"]["switches"] == 1
    assert all(sim.state.devices[dev].pool.value == "rollout" for e in sim.all_engines for dev in e.devices)


def test_plan_warmup_is_not_given_the_declared_workload():
    from pearl.control.policies import given_declared_workload
    assert given_declared_workload("plan-static") and not given_declared_workload("plan-warmup")
