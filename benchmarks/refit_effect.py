"""Does the throughput refit (`pearl.control.refit`) help or hurt? PEARL with its refit against PEARL
with the refit switched off (`policy.controller.refit_min_samples` so large that no shape is ever
measured), same scenarios and seeds, in one invocation.

Usage: python benchmarks/refit_effect.py [--seeds 2] [--jobs 2] [--duration 1800] [SCENARIO ...]
(default: every scenario under scenarios/ except s1-swe; the non-stationary ones run to their own
step count, the others `--duration` virtual seconds.)
Prints per run the trajectories/s and switches of both; last, how many runs differ and the
geometric mean of refit / no refit.
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
OFF = {"controller": {"refit_min_samples": 1_000_000}}


def run(path: str, off: bool, seed: int, duration: float) -> tuple[float, int]:
    over: dict = {"policy": {"name": "pearl", **(OFF if off else {})}, "seed": seed}
    if not Path(path).name.startswith("ns-"):
        over["duration_s"] = duration
    res = Simulator(load_config(Path(path), ScenarioConfig, over)).run()
    return res["throughput"]["trajectories_per_s"], res["reconfiguration"]["switches"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenarios", nargs="*")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--duration", type=float, default=1800.0)
    a = ap.parse_args()
    paths = a.scenarios or [str(p) for p in sorted((ROOT / "scenarios").glob("*.yaml")) if "swe" not in p.name]
    jobs = [(p, off, s) for p in paths for s in range(a.seeds) for off in (False, True)]
    with ProcessPoolExecutor(a.jobs) as ex:
        got = dict(zip(jobs, ex.map(run, *zip(*jobs), [a.duration] * len(jobs))))
    ratios, differ = [], 0
    for p in paths:
        for s in range(a.seeds):
            (on, sw_on), (off, sw_off) = got[(p, False, s)], got[(p, True, s)]
            ratios.append(on / off)
            differ += on != off
            print(f"{Path(p).stem} seed {s}: refit {on:.4f} traj/s ({sw_on} switches), "
                  f"no refit {off:.4f} ({sw_off}): {on / off:.3f}", flush=True)
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"runs that differ: {differ} of {len(ratios)}; geometric mean refit / no refit {gm:.3f}")


if __name__ == "__main__":
    main()
