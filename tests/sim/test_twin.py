"""The digital twin (`pearl.runtime.twin`): a real run's records and a calibrated profile become the
simulator's scenario of the same set-up. Virtual time only: no wall-clock assertions."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from pearl.errors import ConfigError
from pearl.perf.profile import Profile, TrainerProfile
from pearl.perf.roofline import PerfCoeffs
from pearl.runtime.train_config import parse_train_config
from pearl.runtime.twin import build_twin, read_run, real_figures, sim_figures, simulate_twin
from pearl.types import Mode
from pearl.workloads import load_recorded

PROFILE = Profile("tiny", "cpu", 1, PerfCoeffs(combine="sum", step_overhead_s=0.002, seq_overhead_s=1e-4),
                  "2026-01-01T00:00:00+00:00", 10, 1e-4,
                  trainer=TrainerProfile(0.01, 2e-5, 4, 1e-3, micro_batch_size=32,
                                         shared=((1, 2.0, 1.5, 1.2, 1.1), (2, 3.0, 1.8, 1.3, 1.2))))


def _row(group, sample, turns, reward, env=0.004, obs=40):
    return {"step": group // 2 + 1, "group": group, "sample": sample, "ok": True, "reward": reward, "prompt": 38,
            "responses": [1] * turns, "observations": [obs] * (turns - 1), "env_s": [env] * turns}


def make_run(path, layout="colocated", workers=1, groups=8, group_size=4, slow_group=None, **cfg):
    """A run directory as `pearl train --out` leaves it (only the files the twin reads)."""
    path.mkdir(parents=True)
    conf = parse_train_config({"max_steps": groups // 2, "prompts_per_step": 2, "group_size": group_size,
                               "staleness": 1, "layout": layout, "rollout_workers": workers,
                               "policy": {"name": "fixed"}, **cfg})
    (path / "config.yaml").write_text(yaml.safe_dump(conf.model_dump(mode="json")))
    rows = [_row(g, k, 8 if g == slow_group else 1 + (g + k) % 4, float(k % 2) if g % 3 else 1.0)
            for g in range(groups) for k in range(group_size)]
    (path / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = [{"step": s, "trained": 2 * group_size, "failed": 0, "wait_for_batch_s": 0.1 * (s > 1),
                "elapsed_s": 0.5 * s} for s in range(1, groups // 2 + 1)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (path / "summary.json").write_text(json.dumps({"layout_decision": {"chosen": layout}}))
    return read_run(path)


def test_twin_carries_the_runs_batch_staleness_layout_and_profile(tmp_path):
    run = make_run(tmp_path / "r", layout="1P:1D", workers=2, group_size=4)
    scn = build_twin(run.config, PROFILE, run)
    assert (scn.rl.prompts_per_batch, scn.rl.group_size, scn.rl.staleness) == (2, 4, 1)
    assert scn.layout.mode is Mode.DISAGGREGATED and (scn.layout.prefill, scn.layout.decode) == (1, 1)
    assert scn.cluster.hardware == "cpu" and scn.cluster.rollout_devices == 2 and scn.max_train_steps == 4
    assert scn.twin.engine_coeffs["seq_overhead_s"] == 1e-4 and scn.twin.engine_coeffs["combine"] == "sum"
    assert (scn.twin.trainer.fixed_s, scn.twin.trainer.per_token_s, scn.twin.trainer.micro_batch_size) == (0.01, 2e-5, 32)
    assert scn.twin.shared_factors(2) == (3.0, 1.8, 1.3, 1.2) and scn.twin.shared_factors(1) == (2.0, 1.5, 1.2, 1.1)
    assert scn.twin.batch_order == "admission" and scn.policy.name == "fixed"
    booked = replace(PROFILE, trainer=replace(PROFILE.trainer, log_s=0.003, checkpoint_s=0.2))
    assert build_twin(run.config, booked, run).twin.trainer.fixed_s == pytest.approx(0.01 + 0.003 + 0.2 / 10)
    colo = make_run(tmp_path / "c", group_size=4)
    scn1 = build_twin(colo.config, PROFILE, colo)
    assert scn1.layout.mode is Mode.COLOCATED and scn1.cluster.rollout_devices == 1
    assert scn1.twin.shared_factors(5) == (3.0, 1.8, 1.3, 1.2)  # the nearest measured count


def test_recorded_workload_replays_the_runs_trajectories(tmp_path):
    run = make_run(tmp_path / "r", group_size=4)
    wl = load_recorded(str(run.trajectories))
    spec = wl.trajectory(4 * 2 + 3, 2)  # group 2, its 4th trajectory: 1 + (2 + 3) % 4 = 2 turns
    assert spec.turns == 2 and spec.responses == (1, 1) and spec.observations == (40,)
    assert spec.prompt_tokens == 38 and spec.env_latency == (0.004, 0.004)
    assert wl.trajectory(8 * 4 + 3, 8) == replace(wl.trajectory(3, 0), index=35, group=8)  # cycles
    # group 3 (3 % 3 == 0): every reward 1.0, advantage 0: the trainer computes none of it
    assert not any(wl.trained(wl.trajectory(3 * 4 + k, 3)) for k in range(4))
    assert all(wl.trained(wl.trajectory(2 * 4 + k, 2)) for k in range(4))


def test_twin_simulates_the_runs_steps(tmp_path):
    run = make_run(tmp_path / "r", groups=12, group_size=4)
    res = simulate_twin(build_twin(run.config, PROFILE, run))
    assert res["train_steps"] == 6
    sim = sim_figures(res)
    assert sim["trajectories_per_s"] > 0 and 0 <= sim["trainer_idle"] < 1
    real = real_figures(run)
    assert real["trajectories_per_s"] == pytest.approx(5 * 8 / 2.5) and real["trainer_idle"] == pytest.approx(0.5 / 2.5)


def test_shared_executor_and_trainer_cost_slow_the_twin(tmp_path):
    run = make_run(tmp_path / "r", groups=12, group_size=4)
    scn = build_twin(run.config, PROFILE, run)
    alone = scn.model_copy(update={"twin": scn.twin.model_copy(update={"shared": None})})
    thr = lambda s: sim_figures(simulate_twin(s))["trajectories_per_s"]  # noqa: E731
    assert thr(scn) < thr(alone)
    dear = scn.model_copy(update={"twin": scn.twin.model_copy(
        update={"trainer": scn.twin.trainer.model_copy(update={"per_token_s": 1e-3})})})
    assert thr(dear) < thr(scn)


def test_admission_order_waits_for_a_slow_group_like_pearl_train(tmp_path):
    """pearl train takes the next groups in admission order: a slow group holds the trainer up; the
    simulator's own rule would train later groups that finished first."""
    run = make_run(tmp_path / "r", groups=12, group_size=4, slow_group=0)
    scn = build_twin(run.config, replace(PROFILE, trainer=replace(PROFILE.trainer, shared=())), run)
    scn = scn.model_copy(update={"twin": scn.twin.model_copy(update={"shared": None})})
    ready = scn.model_copy(update={"twin": scn.twin.model_copy(update={"batch_order": "ready"})})
    first = lambda s: simulate_twin(s)["per_step"][0]["t_ready"]  # noqa: E731
    assert first(scn) > first(ready)


@pytest.mark.parametrize("breakage, needle", [
    (lambda d: (d / "trajectories.jsonl").unlink(), "no trajectories.jsonl"),
    (lambda d: (d / "summary.json").unlink(), "no summary.json"),
    (lambda d: (d / "summary.json").write_text("{"), "summary.json is not readable JSON"),
    (lambda d: (d / "metrics.jsonl").write_text('{"step": 1, "elapsed_s": 1}\n'), "a twin needs at least 2"),
    (lambda d: (d / "config.yaml").unlink(), "no config.yaml"),
])
def test_a_bad_run_directory_is_one_line(tmp_path, breakage, needle):
    make_run(tmp_path / "r")
    breakage(tmp_path / "r")
    with pytest.raises(ConfigError, match=needle) as e:
        read_run(tmp_path / "r")
    assert "\n" not in str(e.value)


def test_a_missing_run_directory_or_unfit_profile_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="no such directory"):
        read_run(tmp_path / "nope")
    run = make_run(tmp_path / "r")
    with pytest.raises(ConfigError, match="no trainer cost"):
        build_twin(run.config, replace(PROFILE, trainer=None), run)
    with pytest.raises(ConfigError, match="measured for model 'qwen3-8b'"):
        build_twin(run.config, replace(PROFILE, model="qwen3-8b"), run)
    with pytest.raises(ConfigError, match="'h100' at tp 1"):
        build_twin(run.config, replace(PROFILE, hardware="h100"), run)


def test_the_twins_engines_hold_the_runs_kv_pool_not_the_hosts_memory(tmp_path):
    """pearl train's engines have a configured KV pool (`engine.kv_capacity_tokens`); the twin's and the
    controller's models must hold that many tokens, not the ~30 M the host's memory would leave."""
    from pearl.runtime.real_layout import control_setting
    from pearl.runtime.sim import Simulator
    from pearl.real.models import load_model
    from pearl.control.estimate import WorkloadStats
    from pearl.workloads import TrajectorySpec

    run = make_run(tmp_path / "r", layout="1P:1D", workers=2, engine={"kv_capacity_tokens": 8192})
    scn = build_twin(run.config, PROFILE, run)
    assert scn.engine.kv_capacity_tokens == 8192
    sim = Simulator(scn)
    assert sim.perf_for(1).kv_capacity_tokens() == 8192 and sim.perf_for(2).kv_capacity_tokens() == 8192
    sim.run()
    assert {e.kv_capacity for e in sim.all_engines} == {8192}
    setting, _ = control_setting(run.config.model_copy(update={"rollout_workers": 1}), load_model("tiny"),
                                 WorkloadStats.from_samples([TrajectorySpec(0, 0, 40, (1, 1), (40,), (0.0, 0.0))]))
    assert setting.perf_for(1).kv_capacity_tokens() == 8192
    default = build_twin(make_run(tmp_path / "d").config, PROFILE, make_run(tmp_path / "d2"))
    assert Simulator(default).perf_for(1).kv_capacity_tokens() == 65536  # pearl train's default pool
