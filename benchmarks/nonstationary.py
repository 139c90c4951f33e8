"""Non-stationary workloads: does runtime adaptation beat the static layout `pearl plan` picks at the
start? Runs every `scenarios/ns-*.yaml` (each trains a fixed number of steps, so every policy trains
the same trajectories) with `fixed`, `plan-static`, `pearl` and `pearl` without borrowing (so the
ratio to `plan-static`, which never borrows, also shows what adaptation alone does), over seeds.

Usage: python benchmarks/nonstationary.py [--seeds 3] [--scenario scenarios/ns-...yaml ...] [--stationary]
(--stationary: the same scenarios with the schedule removed, the control for the comparison.)
Prints per scenario the mean steady-state trajectories/s of each policy (min-max over seeds) and
the ratios; last, the geometric mean over scenarios of PEARL / plan-static.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, load_config  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"fixed": {"name": "fixed"}, "plan-static": {"name": "plan-static"}, "pearl": {"name": "pearl"},
            "pearl-no-borrow": {"name": "pearl", "borrow": False}}


def run(path: Path, policy: dict, seed: int, stationary: bool = False) -> float:
    over = {"policy": policy, "seed": seed, **({"workload": {"schedule": None}} if stationary else {})}
    cfg = load_config(path, ScenarioConfig, over)
    return Simulator(cfg).run()["throughput"]["trajectories_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--scenario", type=Path, action="append")
    ap.add_argument("--stationary", action="store_true", help="drop the schedules (the control)")
    a = ap.parse_args()
    paths = a.scenario or sorted((ROOT / "scenarios").glob("ns-*.yaml"))
    ratios = []
    for path in paths:
        got = {name: [run(path, pol, s, a.stationary) for s in range(a.seeds)] for name, pol in POLICIES.items()}
        mean = {k: sum(v) / len(v) for k, v in got.items()}
        cols = "  ".join(f"{k} {mean[k]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in got.items())
        r, rnb = mean["pearl"] / mean["plan-static"], mean["pearl-no-borrow"] / mean["plan-static"]
        print(f"{path.stem}: traj/s {cols}")
        print(f"  pearl/plan-static {r:.2f}  pearl-no-borrow/plan-static {rnb:.2f}  "
              f"plan-static/fixed {mean['plan-static'] / mean['fixed']:.2f}", flush=True)
        ratios.append(r)
    kind = "stationary (schedule removed)" if a.stationary else "non-stationary"
    print(f"geometric mean pearl/plan-static over {len(ratios)} {kind} scenarios: "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
