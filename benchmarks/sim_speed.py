"""How fast is the simulator? Virtual seconds simulated per wall second, one core.

The scenario (WORKLOADS.md S2-like, scaled to 64 devices): Qwen3-8B on H800, 48 rollout devices
(colocated TP1 engines) + 16 training devices, the `swe` profile, 64 prompts x 8 samples per batch,
staleness 1, one virtual hour. The in-run baseline is the same scenario on 8 rollout devices: the
ratio shows how the cost grows with the cluster (more engines, more concurrent trajectories).

Usage: python benchmarks/sim_speed.py [--profile] [--seed 0]
`--profile` runs the 64-device scenario once more under cProfile and prints the top hot spots.
The figure ("speed: N x real time", for the 64-device run) is printed last. About 10 s.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402

HOUR = 3600.0


def scenario(rollout_devices: int, seed: int) -> ScenarioConfig:
    return parse_config({
        "name": f"swe-{rollout_devices}+16", "seed": seed, "model": "qwen3-8b", "duration_s": HOUR,
        "cluster": {"hardware": "h800", "rollout_devices": rollout_devices, "train_devices": 16},
        "engine": {"tp": 1}, "layout": {"mode": "colocated"}, "workload": {"profile": "swe"},
        "rl": {"prompts_per_batch": 64, "group_size": 8, "staleness": 1},
    }, ScenarioConfig)


def timed(cfg: ScenarioConfig) -> tuple[float, dict]:
    t0 = time.perf_counter()
    result = Simulator(cfg).run()
    return time.perf_counter() - t0, result


def line(label: str, wall: float, r: dict) -> str:
    return (f"{label:<28} wall {wall:6.2f} s  virtual {r['virtual_s']:7.0f} s  {r['virtual_s'] / wall:7.0f}x  "
            f"events {r['events']:>7}  ({r['events'] / wall / 1e3:.0f}k/s)  train steps {r['train_steps']}  "
            f"active trajectories {r['decode_concurrency']['active_trajectories']:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="cProfile the 64-device run, print the top 15")
    args = ap.parse_args()

    base_wall, base = timed(scenario(8, args.seed))
    print(line("baseline: 8 rollout + 16", base_wall, base))
    wall, r = timed(scenario(48, args.seed))
    print(line("64 devices: 48 rollout + 16", wall, r))
    print(f"64-device run costs {wall / base_wall:.1f}x the 8-rollout baseline per virtual hour")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(Simulator(scenario(48, args.seed)).run)
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    print(f"speed: {r['virtual_s'] / wall:.0f}x real time")


if __name__ == "__main__":
    main()
