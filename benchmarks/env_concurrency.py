"""A 3-step `pearl train` run whose environment takes 0.1 s per step, with environment calls inline
on the rollout thread (`env.workers: 0`, how pearl train ran before) and on the pool (the default).
Prints both wall times and, last, the speed-up of the pool.

    .venv/bin/python benchmarks/env_concurrency.py
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402

from pearl.envs import StepResult  # noqa: E402
from pearl.runtime.training import run_training  # noqa: E402


class SlowGrid:
    """Four turns of 0.1 s each; reward for answering "U"."""

    name, max_turns, allowed_actions, system_prompt = "slow", 4, ["U", "D"], ""

    def __init__(self, **kwargs):
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.turn = 0
        return "go"

    def step(self, text: str) -> StepResult:
        time.sleep(0.1)
        self.turn += 1
        return StepResult("go", 1.0 if text == "U" else 0.0, self.turn >= self.max_turns, {})


def run(workers: int) -> float:
    cfg = {"max_steps": 3, "env": {"name": "__main__:SlowGrid", "kwargs": {}, "use_system_prompt": False,
                                   "workers": workers}}
    with TemporaryDirectory() as d:
        t0 = time.perf_counter()
        run_training(None, cfg, Path(d) / "run", Console(file=open(os.devnull, "w")))
        return time.perf_counter() - t0


if __name__ == "__main__":
    inline = run(0)
    pool = run(8)
    print("3 steps x 2 x 16 trajectories, 4 turns of a 0.1 s environment each")
    print(f"inline (env.workers 0): {inline:6.1f} s")
    print(f"pool   (env.workers 8): {pool:6.1f} s")
    print(f"speed-up of the pool: {inline / pool:.2f}x")
