"""Environments run off the rollout thread: a slow environment costs its own trajectories' time, not
everyone's; a hung one, one whose constructor raises, or one that returns a huge observation fails
its own trajectory with a reason while the run goes on."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest
from rich.console import Console

from pearl.envs import StepResult
from pearl.errors import PearlError
from pearl.runtime.training import run_training

pytest.importorskip("transformers")
QUIET = Console(file=open(os.devnull, "w"))
FAST = {"max_steps": 2, "prompts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 4},
        "env": {"kwargs": {}, "use_system_prompt": False, "timeout_s": 1.0}}


class Sleepy:
    """Two turns; each step sleeps `delay` s. Behaviour by group seed (kwargs are ignored)."""

    name, max_turns, allowed_actions, system_prompt = "sleepy", 2, ["U", "D"], ""
    delay = 0.1
    lock, running, most = threading.Lock(), 0, 0  # environment steps in progress at once

    def __init__(self, **kwargs):
        pass

    def reset(self, seed: int) -> str:
        self.seed, self.turn = seed, 0
        return "go"

    def step(self, text: str) -> StepResult:
        with Sleepy.lock:
            Sleepy.running += 1
            Sleepy.most = max(Sleepy.most, Sleepy.running)
        time.sleep(self.delay)
        with Sleepy.lock:
            Sleepy.running -= 1
        self.turn += 1
        return StepResult("go", 1.0 if text == "U" else 0.0, self.turn >= 2, {})


class Troubled(Sleepy):
    """Group 1 hangs, group 2 answers a 1 MB observation; the rest are instant."""

    delay = 0.0

    def step(self, text: str) -> StepResult:
        if self.seed % 100_003 == 1:
            time.sleep(30)  # hung: the step timeout (1 s) fails it
        if self.seed % 100_003 == 2:
            return StepResult("x" * 1_000_000, 0.0, False, {})
        return super().step(text)


class Unbuildable(Sleepy):
    """Every third instance cannot be built (the first one, the run's probe, can)."""

    delay, built = 0.0, 0

    def __init__(self, **kwargs):
        Unbuildable.built += 1
        if Unbuildable.built % 3 == 0:
            raise RuntimeError("no licence for this simulator")


class NeverBuilds(Sleepy):
    def __init__(self, **kwargs):
        raise RuntimeError("no licence at all")


def _run(tmp_path, name, **over):
    cfg = {**FAST, **over}
    cfg["env"] = {**FAST["env"], "name": f"{__name__}:{name}", **over.get("env", {})}
    t0 = time.perf_counter()
    s = run_training(None, cfg, tmp_path, QUIET)
    return s, time.perf_counter() - t0


def test_slow_environment_steps_overlap_on_the_pool_and_not_inline(tmp_path):
    # (the time this saves is measured by benchmarks/env_concurrency.py)
    Sleepy.most = 0
    pool, _ = _run(tmp_path / "pool", "Sleepy")
    overlapped = Sleepy.most
    while Sleepy.running:  # steps the first run left in flight end within their 0.1 s
        time.sleep(0.01)
    Sleepy.most = 0
    inline, _ = _run(tmp_path / "inline", "Sleepy", env={"workers": 0})
    assert pool["steps"] == inline["steps"] == 2
    assert overlapped >= 4 and Sleepy.most == 1, (overlapped, Sleepy.most)


def test_hung_and_oversized_environments_fail_only_their_own_trajectories(tmp_path):
    s, wall = _run(tmp_path, "Troubled", max_steps=2, staleness=0)
    reasons = " | ".join(s["failure_reasons"])
    assert s["steps"] == 2 and "timed out" in reasons and "KV capacity" in reasons, s["failure_reasons"]
    assert s["trajectories"]["failed"] == 8 and s["trajectories"]["ok"] == 8  # groups 1 and 2 failed, 0 and 3 trained
    assert wall < 60


def test_an_environment_constructor_that_raises_fails_its_trajectories_not_the_run(tmp_path):
    s, _ = _run(tmp_path, "Unbuildable", max_steps=2)
    assert s["steps"] == 2 and s["trajectories"]["failed"] > 0 and s["trajectories"]["ok"] > 0
    assert any("constructor raised RuntimeError: no licence" in r for r in s["failure_reasons"])


def test_an_environment_that_never_builds_is_a_one_line_error_at_start(tmp_path):
    from pearl.errors import ConfigError

    with pytest.raises(ConfigError, match="constructor raised RuntimeError: no licence at all") as e:
        _run(tmp_path, "NeverBuilds")
    assert "\n" not in str(e.value)


def test_two_local_engines_step_at_the_same_time():
    from pearl.real.engine import TorchEngine
    from pearl.real.models import load_model
    from pearl.real.sampling import SamplingParams
    from pearl.runtime.agent import AgentLoop

    loaded = load_model("tiny")
    spans: list[tuple[float, float]] = []

    class Timed(TorchEngine):
        def step(self):
            t0 = time.perf_counter()
            time.sleep(0.01)  # stands in for kernels that release the GIL
            out = super().step()
            spans.append((t0, time.perf_counter()))
            return out

    loop = AgentLoop([Timed(loaded, wid=0), Timed(loaded, wid=1)], "colocated", Sleepy,
                     SamplingParams(max_new_tokens=1), 4, 5.0, parallel_engines=True)
    Sleepy.delay = 0.0
    try:
        loop.start_group(0, 0)
        loop.start_group(1, 1)
        for _ in range(6):
            loop.step()
    finally:
        Sleepy.delay = 0.1
        loop.close()
    spans.sort()
    assert any(b0 < a1 for (a0, a1), (b0, b1) in zip(spans, spans[1:])), "no two engine steps overlapped"


class Overgrown(Sleepy):
    """Every step answers a 1 MB observation: no trajectory fits the engine's KV."""

    delay = 0.0

    def step(self, text: str) -> StepResult:
        return StepResult("x" * 1_000_000, 0.0, False, {})


def test_a_run_in_which_every_trajectory_fails_ends_with_an_error_naming_the_reason(tmp_path):
    with pytest.raises(PearlError, match=r"no trajectory was trained: all 16 failed, most often with: .*KV capacity"):
        _run(tmp_path, "Overgrown", max_steps=2)
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["trajectories"]["failed"] == 16 and s["trajectories"]["ok"] == 0
    # grouped by what went wrong: no request ids in the reasons
    assert all("KV capacity" in r and not r.startswith("request ") for r in s["failure_reasons"]), s["failure_reasons"]
