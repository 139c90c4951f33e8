"""No oracle: the controller learns the workload and elastic lifetimes from what it observes.

Before anything finished it predicts from the declared prior; the trajectories it sees finish replace
the prior; only recent ones count, so a workload that shifts moves the predictions and the layout."""
from __future__ import annotations

import pytest

from pearl.config import Dist, PolicyConfig, ScenarioConfig, WorkloadConfig, parse_config
from pearl.config_estimate import EstimateConfig
from pearl.control.controller import ControlSetting, Controller
from pearl.control.estimate import LifetimeEstimator, WorkloadEstimator, prior_stats
from pearl.control.observation import DeviceObs, Observation, TrainerObs, WorkerObs
from pearl.runtime.sim import Simulator
from pearl.types import DeviceStatus, LayoutShape, Pool, WorkerPhase
from pearl.workloads import Workload


def _specs(profile: str, n: int, start: int = 0, **over):
    wl = Workload(WorkloadConfig(profile=profile, **over), seed=5)
    return [wl.trajectory(i, i) for i in range(start, start + n)]


def test_before_any_trajectory_the_estimate_is_the_declared_prior():
    cfg = EstimateConfig(prior_response_tokens=900.0, prior_turns=6.0)
    est = WorkloadEstimator(cfg)
    assert est.stats is est.prior and est.version == 0
    assert est.stats.quantile("response_tokens", 0.5) == pytest.approx(900, rel=0.15)
    assert est.stats.quantile("turns", 0.5) == pytest.approx(6, abs=1)
    assert prior_stats(cfg).mean("response_tokens") == est.stats.mean("response_tokens")  # deterministic


def test_finished_trajectories_replace_the_prior_and_a_drift_is_tracked():
    est = WorkloadEstimator(EstimateConfig(window=128, refresh=16))
    short = _specs("web", 300)
    for i in range(0, 300, 10):  # the runtime shows its recent finished ones and a counter
        est.observe(short[max(0, i - 40):i + 10], i + 10)
    truth = sum(sum(s.responses) for s in short[-128:]) / sum(s.turns for s in short[-128:])
    assert est.stats.mean("response_tokens") == pytest.approx(truth, rel=0.02)  # the prior is gone
    # responses grow 4x during training: the estimate follows within a window
    long = _specs("web", 300, start=300, trajectory_response_scale=Dist(kind="constant", value=4))
    before = est.stats.mean("response_tokens")
    for i in range(0, 300, 10):
        est.observe(long[i:i + 10], 300 + i + 10)
    assert est.stats.mean("response_tokens") > 3.5 * before
    assert est.observe(long[-10:], 600) is False  # nothing new: no rebuild


def test_a_burst_of_elastic_devices_counts_as_one_lifetime():
    lt = LifetimeEstimator(prior_s=3600.0, prior_weight=1.0)
    assert lt.expected_stay_s(0.0) == 3600.0
    devs = [DeviceObs(i, Pool.ELASTIC, 1, DeviceStatus.FREE) for i in range(8)]
    lt.observe(0.0, devs)
    lt.observe(600.0, [])  # all eight gone at t=600
    assert lt.expected_stay_s(600.0) == pytest.approx((3600 + 600) / 2)
    # devices still alive count as exposure (censored lifetimes): a long-lived burst raises it
    lt.observe(700.0, devs[:4])
    assert lt.expected_stay_s(10_700.0) > lt.expected_stay_s(700.0)


def _controller():
    cfg = parse_config(dict(model="qwen3-8b", cluster=dict(hardware="h800", rollout_devices=8, train_devices=4),
                            engine=dict(tp=4), rl=dict(prompts_per_batch=64, group_size=8, staleness=1),
                            policy=dict(name="pearl", min_dwell_s=0)), ScenarioConfig)
    sim = Simulator(cfg)
    setting = ControlSetting(perf_for=sim.perf_for, engine=cfg.engine, stats=None, batch_size=512, staleness=1,
                             devices_per_node=8, num_kv_heads=sim.model.num_kv_heads)
    policy = parse_config(dict(name="pearl", min_dwell_s=0, controller=dict(estimate=dict(window=256))), PolicyConfig)
    return Controller(policy, setting)


def _obs(t: float, finished, count: int, shape: LayoutShape = LayoutShape.colocated(4, 2)) -> Observation:
    devs = tuple(DeviceObs(i, Pool.ROLLOUT, 0, DeviceStatus.SERVING) for i in range(8))
    tp = shape.tp
    workers = tuple(WorkerObs(w, tuple(range(tp * w, tp * w + tp)), role, WorkerPhase.SERVING, True, 10, 0)
                    for w, role in enumerate(shape.roles()))
    return Observation(t, devs, workers, shape, TrainerObs(False, 0, 64),
                       finished=tuple(finished), finished_count=count)


def test_a_workload_shift_changes_the_prediction_and_the_layout():
    """Short game-like turns: eight colocated tp1 workers are best (on the grounded perf model). The
    trajectories turn into long swe sessions (many turns, large contexts): prefill dominates, the
    prediction of the current layout rises and the controller moves to a disaggregated layout."""
    ctl = _controller()
    game, now = _specs("game", 256), LayoutShape.colocated(8, 1)
    d0 = ctl.on_tick(_obs(30.0, game, 256, now)).decisions[0]
    assert d0.rule == "keep" and d0.candidates[0][0] == "colocated×8"
    heavy = _specs("swe", 256, start=256)
    switched, preds = None, [d0.current_pred_s]
    for k in range(1, 6):
        eff = ctl.on_tick(_obs(30.0 + 30 * k, heavy, 256 * 2, now))
        d = eff.decisions[0]
        preds.append(d.current_pred_s)
        if d.switch:
            switched = d
            break
    assert preds[1] > 3 * preds[0]  # the estimate moved the prediction of the same layout
    assert switched is not None and switched.chosen.split("@")[0].count("P:") == 1, switched


def test_the_real_runtime_reports_a_finished_episode_as_it_ran():
    from pearl.rl.trajectory import Group, Trajectory
    from pearl.runtime.agent import Episode, _as_spec

    t = Trajectory(id="g0-0", group_id=0)
    t.append_prompt([1] * 7)
    t.append_model([2] * 3, [0.0] * 3, 0)
    t.append_env([3] * 5)
    t.append_model([2] * 4, [0.0] * 4, 0)
    spec = _as_spec(Episode(t, None, Group(0, 1, 0), 0, env_s=[0.5, 0.25]), 9)
    assert (spec.prompt_tokens, spec.responses, spec.observations, spec.env_latency) == (7, (3, 4), (5,), (0.5, 0.25))


def test_the_simulated_controller_is_not_handed_the_workload_and_learns_it():
    cfg = parse_config(dict(name="learn", seed=1, duration_s=120, model="qwen3-8b",
                            cluster=dict(hardware="h800", rollout_devices=4, train_devices=4),
                            workload=dict(profile="game"), rl=dict(prompts_per_batch=8, group_size=4, staleness=1),
                            policy=dict(name="pearl", decision_interval_s=10)), ScenarioConfig)
    sim = Simulator(cfg)
    res = sim.run()
    ctl = sim.driver.controller
    assert ctl.setting.stats is None  # no distribution sampled from the scenario's workload
    est = ctl.workload
    assert est.version > 0 and 0 < est.seen <= sim.finished_count and len(est.window) == est.seen
    truth = Workload(cfg.workload, cfg.seed).means()["response_tokens"]
    assert est.stats.mean("response_tokens") == pytest.approx(truth, rel=0.25)  # the game's, not the prior's 500
    assert abs(est.prior.mean("response_tokens") - truth) > 2 * abs(est.stats.mean("response_tokens") - truth)
    # every layout decision shows what the controller believed when it decided
    last = [d for d in res["decisions"] if d["kind"] == "layout"][-1]["estimate"]
    assert 0 < last["trajectories"] <= est.used
    assert last["response_tokens"] == pytest.approx(truth, rel=0.25)
