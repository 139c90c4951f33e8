"""Runs you can trust: killed at random moments (kill -9) and resumed, a run trains exactly the prompts
of an uninterrupted one, none twice; a checkpoint cut off mid-write is skipped; SIGINT and SIGTERM
leave a checkpoint and a summary; the saved policy loads in transformers and decodes like the engine;
divergence ends the run with a one-line error instead of a hang; run directories are never wiped by
accident."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from pearl.errors import ConfigError
from pearl.runtime.checkpoint import latest_checkpoint
from pearl.runtime.real import TrainingDiverged
from pearl.runtime.training import run_training

pytest.importorskip("transformers")

STEPS, P = 8, 2
SETS = [f"max_steps={STEPS}", f"prompts_per_step={P}", "group_size=8", "checkpoint_every=1", "keep_checkpoints=3"]
QUIET = Console(file=open(os.devnull, "w"))


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pearl.cli", *args]


def _sets(sets: list[str]) -> list[str]:
    return [x for s in sets for x in ("--set", s)]


def _wait_for_steps(run_dir: Path, n: int, proc: subprocess.Popen, limit_s: float = 120) -> None:
    end = time.monotonic() + limit_s
    while time.monotonic() < end and proc.poll() is None:
        m = run_dir / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)


def _trained_groups(run_dir: Path) -> Counter:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, len(lines) + 1))
    return Counter(g for m in lines for g in m["groups"])


@pytest.mark.parametrize("seed", [1, 2, *[pytest.param(k, marks=pytest.mark.slow) for k in range(3, 13)]])
def test_kill_9_at_random_moments_then_resume_trains_every_prompt_once(tmp_path, seed):
    rng, run_dir = random.Random(seed), tmp_path / "run"
    proc = subprocess.Popen(_cli("train", "--out", str(run_dir), *_sets(SETS)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    kills = 0
    while True:
        _wait_for_steps(run_dir, rng.randint(1, 3), proc)
        time.sleep(rng.uniform(0.0, 1.5))  # mid-step, mid-checkpoint, mid-anything
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        if latest_checkpoint(run_dir) is None:  # killed before the first checkpoint: start over
            proc = subprocess.Popen(_cli("train", "--out", str(run_dir), "--overwrite", *_sets(SETS)),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        else:
            proc = subprocess.Popen(_cli("train", "--resume", str(run_dir)), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE)
        if kills >= 3:
            break
    assert proc.wait(timeout=300) == 0, proc.stderr.read().decode()[-2000:]
    assert kills >= 1
    # exactly the prompts an uninterrupted run trains, each once
    assert _trained_groups(run_dir) == Counter(range(STEPS * P))
    s = json.loads((run_dir / "summary.json").read_text())
    t = s["trajectories"]
    assert s["steps"] == STEPS and t["ok"] + t["failed"] + t["stale"] + t["skipped"] + \
        s["trajectories_unfinished"] == s["trajectories_admitted"]


def test_a_checkpoint_cut_off_mid_write_is_skipped_for_the_previous_one(tmp_path):
    run_training(None, {"max_steps": 3, "checkpoint_every": 1, "keep_checkpoints": 3}, tmp_path, QUIET)
    newest = tmp_path / "ckpt-000003" / "state.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn write
    (tmp_path / ".ckpt-000004.tmp").mkdir()  # a write that never finished
    path, state = latest_checkpoint(tmp_path)
    assert path.name == "ckpt-000002" and state["step"] == 2
    s = run_training(None, {"max_steps": 4}, None, QUIET, resume=tmp_path)
    assert s["steps"] == 4 and _trained_groups(tmp_path) == Counter(range(8))


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_and_sigterm_stop_cleanly_with_a_checkpoint_and_a_summary(tmp_path, sig, code):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_cli("train", "--out", str(run_dir), *_sets(["max_steps=200", "checkpoint_every=50"])),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _wait_for_steps(run_dir, 2, proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=120) == code
    err = proc.stderr.read().decode()
    assert "Traceback" not in err and "--resume" in err
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["stopped_by"] == sig.name and 2 <= s["steps"] < 200
    path, state = latest_checkpoint(run_dir)
    assert state["step"] == s["steps"]


def test_the_saved_policy_loads_in_transformers_and_decodes_like_the_engine(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from pearl.real.engine import TorchEngine
    from pearl.real.models import load_model
    from pearl.real.sampling import SamplingParams

    run_training(None, {"max_steps": 3}, tmp_path, QUIET)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "policy").eval()
    loaded = load_model("tiny")
    engine = TorchEngine(loaded)
    engine.update_weights(hf.state_dict(), 3)
    prompts = [loaded.tokenizer.chat([{"role": "user", "content": c}]) for c in ("abc", "grid", "PEARL")]
    outs = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True))
    for p, o in zip(prompts, outs):
        ids = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert o.token_ids == ids[0, len(p):].tolist()


def test_an_exploding_learning_rate_ends_within_a_minute_with_one_line(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(TrainingDiverged) as e:
        run_training(None, {"max_steps": 200, "trainer": {"lr": 1e20}}, tmp_path, QUIET)
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert "\n" not in msg and "non-finite" in msg and "1e+20" in msg
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(m["skipped"] for m in lines) >= 3  # skipped updates are in the metrics
    assert json.loads((tmp_path / "summary.json").read_text())["trajectories"]["skipped"] > 0


def test_an_existing_run_directory_is_never_wiped_without_overwrite(tmp_path):
    run_training(None, {"max_steps": 1}, tmp_path, QUIET)
    before = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="--overwrite"):
        run_training(None, {"max_steps": 1}, tmp_path, QUIET)
    with pytest.raises(ConfigError):  # a typo does not touch the earlier run either
        run_training(None, {"max_stepz": 1}, tmp_path, QUIET)
    assert (tmp_path / "metrics.jsonl").read_text() == before
    assert (tmp_path / "config.yaml").exists()


def test_synchronous_runs_with_the_same_seed_are_identical(tmp_path):
    inline = {"max_steps": 4, "staleness": 0, "env": {"workers": 0}}
    a = run_training(None, inline, tmp_path / "a", QUIET)
    b = run_training(None, inline, tmp_path / "b", QUIET)
    la, lb = ((tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in "ab")
    keys = ("groups", "reward_mean", "loss", "grad_norm", "version")
    assert [{k: json.loads(x)[k] for k in keys} for x in la] == [{k: json.loads(x)[k] for k in keys} for x in lb]
    assert a["reward_last5"] == b["reward_last5"]


class SlowEnv:
    """Every step takes 0.5 s."""

    name, max_turns, allowed_actions, system_prompt = "slow", 4, ["U", "D"], ""

    def __init__(self, **kwargs):
        pass

    def reset(self, seed: int) -> str:
        return "go"

    def step(self, text: str):
        from pearl.envs import StepResult

        time.sleep(0.5)
        return StepResult("go", 0.0, False, {})


def test_a_rollout_that_produces_nothing_ends_the_run_with_an_error_not_a_hang(tmp_path):
    from pearl.errors import PearlError

    t0 = time.monotonic()
    with pytest.raises(PearlError, match="stall_timeout_s"):
        run_training(None, {"max_steps": 2, "stall_timeout_s": 1.0, "group_size": 2,
                            "env": {"name": f"{__name__}:SlowEnv", "kwargs": {}, "timeout_s": 60}}, tmp_path, QUIET)
    assert time.monotonic() - t0 < 30


def test_a_run_killed_after_its_last_checkpoint_resumes_to_its_summary_and_policy(tmp_path):
    run_training(None, {"max_steps": 2, "checkpoint_every": 1}, tmp_path, QUIET)
    for p in ("summary.json",):
        (tmp_path / p).unlink()
    import shutil

    shutil.rmtree(tmp_path / "policy")
    s = run_training(None, {}, None, QUIET, resume=tmp_path)
    assert s["steps"] == 2 and (tmp_path / "policy" / "config.json").exists()
    assert _trained_groups(tmp_path) == Counter(range(4))

