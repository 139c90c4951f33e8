"""Borrowing for real: the same `pearl train` run (SmolLM2-135M on the calculator task, one rollout
worker, 2 CPU cores) with the trainer's core never lent (`policy.borrow: false`, the fixed baseline)
and with PEARL lending it while the trainer waits for its batch: as a second intra-op thread of the
rollout worker or to an extra worker, whichever the controller's models (calibrated at start-up at 1
and 2 threads) predict faster; each lend's reason in summary.json says which.

Each trajectory samples from its own seed (`pearl.runtime.agent_routing.Routing.params_for`), so both
arms roll out the same trajectories and train the same batches (up to rare float differences between
batch shapes): the comparison is paired. Each run prints its rollout and training seconds and its
rewards per step (the trainer computes only when a group's rewards differ: a step with signal costs
~10 s on one core, one without ~0).

Repeat i runs both arms with `seed: i` (other prompts, other samples). With one seed for every
repeat the fixed arm is one draw, run three times: its runs are identical, while PEARL's runs differ
from it and from each other wherever a float difference flips a token, and so in which steps have
training signal; the 2026-12-04 run drew 2-3 s of training for fixed against 26-30 s for all three
PEARL runs. With a seed per repeat both arms draw their training signal from the same distribution.
Runs alternate (fixed, pearl, fixed, pearl, ...) so drift in the machine's load hits both; each
run's throughput is over its steady state (trajectories of steps 2..N over the time from the end of
step 1 to the end of step N: model loading and calibration excluded). Prints every run, each seed's
paired ratio, the trainer's worst wait for its device, and, last, the ratio of the medians.

With `--backend ray` the worker is a Ray actor on the local Ray instance each run starts; the lent
core can only be its second torch thread there (an actor takes seconds to start).

    .venv/bin/python benchmarks/real_borrow.py [--steps 4] [--staleness 0] [--repeats 3] [--first-seed 0] [--prompts 2]
                                               [--backend local|ray]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[1]


def run(borrow: bool, steps: int, staleness: int, seed: int, prompts: int = 2, backend: str = "local") -> dict:
    """One `pearl train` in its own process (as a user runs it: nothing carried over between runs)."""
    with TemporaryDirectory() as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "pearl.cli", "train", str(ROOT / "configs" / "smollm2-calculator.yaml"),
               "--set", f"max_steps={steps}", "--set", f"staleness={staleness}", "--set", f"seed={seed}",
               "--set", f"prompts_per_step={prompts}",
               "--set", f"policy.borrow={'true' if borrow else 'false'}", "--set", f"backend={backend}",
               "--out", str(out)]
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        s = json.loads((out / "summary.json").read_text())
        lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trajs = sum(m["trained"] + m["failed"] + m["stale"] for m in lines[1:])
    s["per_s"] = trajs / max(lines[-1]["elapsed_s"] - lines[0]["elapsed_s"], 1e-9)
    s["rollout_s"] = sum(m["wait_for_batch_s"] for m in lines[1:])  # the trainer waiting for its batch
    s["train_s"] = sum(m["step_s"] - m["wait_for_batch_s"] for m in lines[1:])
    s["rewards"] = [round(m["reward_mean"] or 0.0, 4) for m in lines]
    s["lends"] = sum(1 for x in s["decisions"] if x.get("rule") == "lend")
    return s


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--staleness", type=int, default=0, help="η (0: synchronous, the trainer idles most)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per arm; repeat i uses seed first_seed + i")
    ap.add_argument("--first-seed", type=int, default=0, help="the seed of the first repeat")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (x 4 trajectories each)")
    ap.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="ray: the worker is a Ray actor (local instance), lent the core as a second thread")
    a = ap.parse_args()
    runs: dict[str, list[dict]] = {"fixed": [], "pearl": []}
    print(f"smollm2-135m calculator, {a.steps} steps x {a.prompts} x 4 trajectories, η={a.staleness}, "
          f"1 rollout worker ({a.backend}), 2 cores, {a.repeats} runs each (seeds {a.first_seed}..{a.first_seed + a.repeats - 1}), alternating", flush=True)
    for i in range(a.first_seed, a.first_seed + a.repeats):
        for name in ("fixed", "pearl"):
            r = run(name == "pearl", a.steps, a.staleness, seed=i, prompts=a.prompts, backend=a.backend)
            runs[name].append(r)
            print(f"  {name} seed {i}: {r['per_s']:.3f} trajectories/s (steady state), {r['lends']} lends, "
                  f"rollout {r['rollout_s']:.1f} s + training {r['train_s']:.1f} s, rewards {r['rewards']}, "
                  f"worst trainer wait {r['trainer_device_wait_max_s']:.3f} s", flush=True)
    paired = [p["per_s"] / f["per_s"] for f, p in zip(runs["fixed"], runs["pearl"])]
    print("paired ratios (pearl / fixed, same seed): " + ", ".join(f"{x:.2f}" for x in paired))
    med = {k: statistics.median(r["per_s"] for r in v) for k, v in runs.items()}
    roll = {k: statistics.median(r["rollout_s"] for r in v) for k, v in runs.items()}
    print(f"median rollout seconds (steps 2..N): fixed {roll['fixed']:.1f}, pearl {roll['pearl']:.1f} "
          f"({roll['fixed'] / roll['pearl']:.2f}x faster rollout while lending)")
    print(f"median: fixed {med['fixed']:.3f}, pearl {med['pearl']:.3f} trajectories/s; worst trainer wait for its "
          f"device {max(r['trainer_device_wait_max_s'] for r in runs['pearl']):.3f} s (bound 5 s)")
    print(f"pearl vs fixed: {med['pearl'] / med['fixed']:.2f}x")
