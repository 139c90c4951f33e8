"""How much faster is `pearl compare`? The old tuning (each baseline's tuner, then the bound's, one
after another, each trying every layout) vs the new (all tuners at once in threads sharing the
process pool, each coarse to fine: `pearl.runtime.tuning.search`), in the same invocation.

The scenario: one cell of the paper's matrix (`pearl.runtime.paper`; default qwen3-8b, 16 rollout +
16 train devices, no pool, `web`), shortened (`--duration`). Both paths run the same rows on the same
seeds with the same simulator, so the figure is what the tuning changes alone (the simulator's own
speed-ups apply to both). Each `compare()` starts its own process pool (no draw memo carried over).

    nice -n 10 .venv/bin/python benchmarks/compare_speed.py [--seeds 1] [--jobs 2] [--duration 900]
        [--cell qwen3-8b:16r16t:0:none:web]

Prints each path's wall and CPU seconds (this process and its pool's), its run counts (as
`compare` logs them) and the rows' throughputs; last, the speed-up ratio old / new wall time.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.runtime.compare import compare  # noqa: E402
from pearl.runtime.paper import CLUSTERS, scenario_dict  # noqa: E402


def cell(spec: str, duration: float) -> ScenarioConfig:
    model, tag, pool, availability, workload = spec.split(":")
    cl = next(c for c in CLUSTERS if c.tag == tag)
    d = scenario_dict(model, cl, int(pool), availability, workload, 0, duration)
    return parse_config(d, ScenarioConfig, d["name"])


def timed(cfg: ScenarioConfig, seeds: list[int], jobs: int, legacy: bool) -> tuple[float, float, list[str], dict]:
    """(wall s, CPU s of this process and its finished children, compare's log lines, traj/s by row)."""
    lines: list[str] = []
    t0, c0 = time.perf_counter(), os.times()
    rows = compare(cfg, seeds, jobs=jobs, log=lines.append, legacy_tuning=legacy)
    c1 = os.times()
    cpu = sum(getattr(c1, k) - getattr(c0, k) for k in ("user", "system", "children_user", "children_system"))
    return time.perf_counter() - t0, cpu, lines, {r.name: r.mean("throughput.trajectories_per_s") for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cell", default="qwen3-8b:16r16t:0:none:web", help="MODEL:CLUSTER:POOL:AVAILABILITY:WORKLOAD")
    ap.add_argument("--duration", type=float, default=900.0)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    cfg = cell(a.cell, a.duration)
    seeds = [cfg.seed + i for i in range(a.seeds)]
    print(f"{cfg.name}, {a.duration:.0f} virtual s, {a.seeds} seed(s), {a.jobs} processes", flush=True)
    out = {}
    for label, legacy in (("old: sequential exhaustive tuning", True), ("new: concurrent coarse-to-fine tuning", False)):
        wall, cpu, lines, thr = out[label] = timed(cfg, seeds, a.jobs, legacy)
        print(f"{label}: wall {wall:.0f} s, CPU {cpu:.0f} s")
        for ln in lines:
            print(f"  {ln}")
        print("  traj/s: " + ", ".join(f"{k} {v:.3f}" for k, v in thr.items()), flush=True)
    (w_old, *_), (w_new, *_) = out.values()
    print(f"speed-up (old / new wall time): {w_old / w_new:.2f}x")


if __name__ == "__main__":
    main()
