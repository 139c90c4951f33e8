"""The workload estimate early in a run: trajectories still running are censored observations."""
import numpy as np
import pytest

from pearl.config import WorkloadConfig
from pearl.config_estimate import EstimateConfig
from pearl.control.censored import complete
from pearl.control.estimate import WorkloadEstimator
from pearl.workloads import TrajectorySpec, Workload

SPECS = [Workload(WorkloadConfig(profile="math-tool"), 3).trajectory(i, i // 8) for i in range(512)]


def at(t: int):
    """Every trajectory decoding one token per unit of time from 0 (no environment time): the
    finished ones at `t`, and the others as far as they ran (the turn in progress with its tokens)."""
    finished, running = [], []
    for s in SPECS:
        done = 0
        for k, r in enumerate(s.responses):
            if done + r > t:
                resp = s.responses[:k] + ((t - done,) if t > done else ())
                running.append((TrajectorySpec(s.index, s.group, s.prompt_tokens, resp,
                                               s.observations[:len(resp) - 1], (0.0,) * len(resp)), t > done))
                break
            done += r
        else:
            finished.append(s)
    return finished, running


def mean_tokens(specs) -> float:
    return float(np.mean([sum(s.responses) for s in specs]))


@pytest.mark.parametrize("t, within", [(3000, 0.45), (8000, 0.15)])
def test_trajectories_in_flight_pull_an_early_estimate_toward_the_truth(t, within):
    finished, running = at(t)
    truth, alone = mean_tokens(SPECS), mean_tokens(finished)
    both = finished + complete(finished, running)
    assert alone < 0.45 * truth  # the finished ones are the short ones
    assert abs(mean_tokens(both) / truth - 1) < within and mean_tokens(both) > 2 * alone
    assert abs(np.mean([s.turns for s in both]) / np.mean([s.turns for s in SPECS]) - 1) < 0.1


def test_a_completed_trajectory_keeps_what_it_ran_and_the_answer_is_reproducible():
    finished, running = at(3000)
    out = complete(finished, running)
    assert out == complete(finished, running)
    for (r, partial), c in zip(running, out):
        assert c.turns >= r.turns and c.responses[:r.turns - 1] == r.responses[:-1]
        assert c.responses[r.turns - 1] >= r.responses[-1] if partial else c.responses[r.turns - 1] == r.responses[-1]
        assert c.observations[:len(r.observations)] == r.observations
        assert len(c.observations) == c.turns - 1 and len(c.env_latency) == c.turns


def test_with_nothing_finished_yet_the_running_ones_are_lower_bounds():
    _, running = at(500)
    out = complete([], running)
    assert len(out) == len(running)
    assert all(sum(c.responses) >= sum(r.responses) for (r, _), c in zip(running, out))


def test_the_estimator_counts_the_running_ones_until_its_window_is_full():
    finished, running = at(3000)
    with_running = WorkloadEstimator(EstimateConfig(window=2048, prior_weight=0))
    without = WorkloadEstimator(EstimateConfig(window=2048, prior_weight=0))
    assert with_running.observe(finished, len(finished), running)
    assert without.observe(finished, len(finished))
    s = with_running.summary()
    assert s["in_flight"] == len(running) and s["trajectories"] == len(SPECS)
    assert s["response_tokens"] * s["turns"] > 2 * without.summary()["response_tokens"] * without.summary()["turns"]
    full = WorkloadEstimator(EstimateConfig(window=len(finished), prior_weight=0))
    assert full.observe(finished, len(finished), running) and full.summary()["in_flight"] == 0


def test_a_simulated_run_decides_on_the_trajectories_in_flight_too(monkeypatch):
    from pearl.config import ScenarioConfig, parse_config
    from pearl.runtime import sim_control
    from pearl.runtime.sim import Simulator

    cfg = parse_config(dict(model="qwen3-8b", duration_s=60, cluster=dict(hardware="h800", rollout_devices=8),
                            workload=dict(profile="math-tool"), policy=dict(name="pearl"),
                            rl=dict(prompts_per_batch=32, group_size=8, staleness=1)), ScenarioConfig)

    def first_estimate() -> dict:
        r = Simulator(cfg).run()
        return next(d for d in r["decisions"] if d["kind"] == "layout" and d["estimate"]["trajectories"])["estimate"]

    seen = first_estimate()
    monkeypatch.setattr(sim_control.SimControl, "_running", lambda self: ())
    finished_only = first_estimate()
    assert seen["in_flight"] > 0 and finished_only["in_flight"] == 0
    tokens = lambda e: e["turns"] * e["response_tokens"]  # noqa: E731
    truth = 3.0 * 2466  # math-tool: 3 turns of ~2466 tokens on average (its profile, 1024 draws)
    assert abs(tokens(seen) - truth) < abs(tokens(finished_only) - truth)
