"""Rollout throughput of one vs two local rollout workers, with no trainer in the way: the agent loop
of `pearl train` rolls out the same trajectories (SmolLM2-135M, a one-turn task, 16 new tokens) with
one engine, then with two engines stepping in parallel. Prints trajectories/s for both and, last,
the ratio.

    .venv/bin/python benchmarks/rollout_workers.py [--model smollm2-135m] [--groups 4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from pearl.envs import StepResult  # noqa: E402
from pearl.real.engine import TorchEngine  # noqa: E402
from pearl.real.models import load_model  # noqa: E402
from pearl.real.sampling import SamplingParams  # noqa: E402
from pearl.runtime.agent import AgentLoop  # noqa: E402


class Sum:
    """One turn: add two numbers; reward 1 if the answer appears."""

    system_prompt = "Answer with the number only."
    allowed_actions: list[str] = []
    max_turns = 1

    def reset(self, seed: int) -> str:
        self.a, self.b = seed % 97, (seed * 7) % 89
        return f"What is {self.a} + {self.b}?"

    def step(self, text: str) -> StepResult:
        return StepResult(None, float(str(self.a + self.b) in text), True, {})


def rollout(loaded, workers: int, groups: int, group_size: int, env: type = Sum, max_new_tokens: int = 16) -> float:
    """Trajectories/s of `groups` groups of `env` on `workers` engines stepping in parallel."""
    engines = [TorchEngine(loaded, seed=i, wid=i, max_num_seqs=64) for i in range(workers)]
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, ignore_eos=True)
    loop = AgentLoop(engines, "colocated", env, params, group_size, 10.0, parallel_engines=workers > 1)
    t0, done = time.perf_counter(), 0
    for g in range(groups):
        done += len(loop.start_group(g, g))
    while done < groups:
        done += len(loop.step())
    dt = time.perf_counter() - t0
    loop.close()
    return groups * group_size / dt


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    a = ap.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(a.model)
    rollout(loaded, 1, 1, 2)  # warm-up
    one = rollout(loaded, 1, a.groups, a.group_size)
    two = rollout(loaded, 2, a.groups, a.group_size)
    print(f"{a.model}: {a.groups} x {a.group_size} one-turn trajectories, 16 new tokens each")
    print(f"1 rollout worker : {one:6.2f} trajectories/s")
    print(f"2 rollout workers: {two:6.2f} trajectories/s (stepping in parallel)")
    print(f"two workers vs one: {two / one:.2f}x")
