"""Borrowing for real: the same `pearl train` run (SmolLM2-135M on the calculator task, one rollout
worker, 2 CPU cores) with the trainer's core never lent (`policy.borrow: false`, the fixed baseline)
and with PEARL lending it to an extra rollout worker while the trainer waits for its batch. Prints
trained trajectories/s for both, the trainer's worst wait for its device, and, last, the ratio.

    .venv/bin/python benchmarks/real_borrow.py [--steps 6]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from rich.console import Console  # noqa: E402

from pearl.runtime.training import run_training  # noqa: E402


def run(borrow: bool, steps: int, staleness: int) -> dict:
    with TemporaryDirectory() as d:
        s = run_training(ROOT / "configs" / "smollm2-calculator.yaml",
                         {"max_steps": steps, "staleness": staleness, "policy": {"borrow": borrow}}, Path(d) / "run",
                         Console(file=open(os.devnull, "w")))
    t = s["trajectories"]
    s["trained_per_s"] = (t["ok"] + t["failed"] + t["stale"] + t["skipped"]) / s["wall_s"]
    s["lends"] = sum(1 for x in s["decisions"] if x.get("rule") == "lend")
    return s


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--staleness", type=int, default=1, help="η (0: synchronous, the trainer idles most)")
    a = ap.parse_args()
    fixed = run(False, a.steps, a.staleness)
    pearl = run(True, a.steps, a.staleness)
    print(f"smollm2-135m calculator, {a.steps} steps x 2 x 4 trajectories, η={a.staleness}, 1 rollout worker, 2 cores")
    print(f"fixed (trainer's core never lent): {fixed['trained_per_s']:.3f} trajectories/s ({fixed['wall_s']:.0f} s)")
    print(f"pearl (lent while the trainer waits): {pearl['trained_per_s']:.3f} trajectories/s "
          f"({pearl['wall_s']:.0f} s, {pearl['lends']} lends, worst trainer wait for its device "
          f"{pearl['trainer_device_wait_max_s']:.3f} s, bound 5 s)")
    print(f"pearl vs fixed: {pearl['trained_per_s'] / fixed['trained_per_s']:.2f}x")
