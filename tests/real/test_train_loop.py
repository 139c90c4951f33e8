"""The real training loop (`pearl.runtime.real.run_training`): completes, respects η, contains
environment failures, rejects bad configs with one-line errors, and (slow) learns."""
import json

import pytest
from rich.console import Console

from pearl.envs import BaseEnv, StepResult
from pearl.errors import ConfigError, ResourceError, UnknownNameError
from pearl.runtime.real_layout import check_memory
from pearl.runtime.training import run_training

pytest.importorskip("transformers")

FAST = {"max_steps": 3, "prompts_per_step": 2, "group_size": 4}


class FlakyEnv(BaseEnv):
    """Raises on every step of odd-seeded episodes; even seeds end after one step with reward 1."""

    name = "flaky"
    max_turns = 2
    allowed_actions = ["U", "D"]

    def __init__(self, **kwargs):  # the default config's env kwargs merge in; ignore them
        pass

    def reset(self, seed: int) -> str:
        self.seed = seed
        return "go"

    def step(self, model_text: str) -> StepResult:
        if self.seed % 2:
            raise RuntimeError("simulated crash")
        return StepResult(None, 1.0 if model_text == "U" else 0.0, True, {})


def _run(tmp_path, **over):
    return run_training(None, {**FAST, **over}, tmp_path, Console(file=open("/dev/null", "w")))


def test_three_steps_complete_and_write_metrics(tmp_path):
    s = _run(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["reward_mean"] is not None for m in lines)
    assert s["final_version"] == 3 and s["trajectories"]["ok"] >= 24  # 3 steps x 2 groups x 4 trained
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("eta", [0, 1])
def test_trained_trajectories_respect_eta(tmp_path, eta):
    s = _run(tmp_path, staleness=eta, max_steps=4)
    assert s["staleness_max"] <= eta
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(m.get("staleness_max", 0) <= eta for m in lines)


def test_broken_env_fails_trajectories_with_reason_and_run_completes(tmp_path):
    s = _run(tmp_path, env={"name": f"{__name__}:FlakyEnv", "kwargs": {}, "use_system_prompt": False})
    assert s["steps"] == 3
    assert s["trajectories"]["failed"] > 0 and s["trajectories"]["ok"] > 0
    assert any("simulated crash" in r for r in s["failure_reasons"])


def test_unknown_env_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        _run(tmp_path, env={"name": "no-such-env"})
    assert "no-such-env" in str(e.value) and "\n" not in str(e.value)


def test_unknown_model_and_bad_field(tmp_path):
    with pytest.raises(UnknownNameError):
        _run(tmp_path, model="gpt-99")
    with pytest.raises(ConfigError, match="group_size"):
        _run(tmp_path, group_size=0)
    with pytest.raises(ConfigError, match="1P:1D"):
        _run(tmp_path, layout="1P:1D")


def test_model_too_large_is_a_resource_error():
    with pytest.raises(ResourceError, match="GiB"):
        check_memory("smollm2-135m", 1, available=1 << 20)


def test_pd_layout_runs(tmp_path):
    s = _run(tmp_path, rollout_workers=2, layout="1P:1D", max_steps=2)
    assert s["steps"] == 2 and "prefill+decode" in s["layout"]


@pytest.mark.slow
def test_default_config_reward_rises(tmp_path):
    s = run_training(None, {}, tmp_path, Console(file=open("/dev/null", "w")))
    assert s["reward_last5"] > s["reward_first5"] + 0.2, s
