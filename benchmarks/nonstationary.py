"""Non-stationary workloads: does runtime adaptation beat the static layout `pearl plan` picks at the
start? Runs every `scenarios/ns-*.yaml` (each trains a fixed number of steps, so every policy trains
the same trajectories) with `fixed`, `plan-static` (planned before the run from the declared
workload), `plan-warmup` (planned after the first hour from the observed workload), `pearl` and
`pearl` without borrowing (so the ratio to the static plans, which never borrow, also shows what
adaptation alone does), over seeds.

Usage: python benchmarks/nonstationary.py [--seeds 3] [--scenario scenarios/ns-...yaml ...] [--stationary]
       [--jobs 2]
(--stationary: the same scenarios with the schedule removed, the control for the comparison.)
Prints per scenario the mean steady-state trajectories/s of each policy (min-max over seeds) and
the ratios; last, the geometric mean over scenarios of PEARL / the better static plan.
"""
from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, load_config  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"fixed": {"name": "fixed"}, "plan-static": {"name": "plan-static"},
            "plan-warmup": {"name": "plan-warmup"}, "pearl": {"name": "pearl"},
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
    ap.add_argument("--jobs", type=int, default=2, help="simulations run in parallel")
    a = ap.parse_args()
    paths = a.scenario or sorted((ROOT / "scenarios").glob("ns-*.yaml"))
    ratios = []
    with ProcessPoolExecutor(a.jobs) as ex:
        futs = {(path, name, s): ex.submit(run, path, pol, s, a.stationary)
                for path in paths for name, pol in POLICIES.items() for s in range(a.seeds)}
        for path in paths:
            got = {name: [futs[(path, name, s)].result() for s in range(a.seeds)] for name in POLICIES}
            mean = {k: sum(v) / len(v) for k, v in got.items()}
            cols = "  ".join(f"{k} {mean[k]:.3f} ({min(v):.3f}-{max(v):.3f})" for k, v in got.items())
            best = max(("plan-static", "plan-warmup"), key=mean.__getitem__)
            r, rnb = mean["pearl"] / mean[best], mean["pearl-no-borrow"] / mean[best]
            print(f"{path.stem}: traj/s {cols}")
            print(f"  pearl/plan-static {mean['pearl'] / mean['plan-static']:.2f}  "
                  f"pearl/plan-warmup {mean['pearl'] / mean['plan-warmup']:.2f}  "
                  f"pearl-no-borrow/{best} {rnb:.2f}  {best}/fixed {mean[best] / mean['fixed']:.2f}", flush=True)
            ratios.append(r)
    kind = "stationary (schedule removed)" if a.stationary else "non-stationary"
    print(f"geometric mean pearl / the better static plan over {len(ratios)} {kind} scenarios: "
          f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}")


if __name__ == "__main__":
    main()
