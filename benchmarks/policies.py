"""Every policy on the shipped scenarios, in the simulator, same seeds, same invocation (`pearl compare`
per scenario: baselines as configured and tuned, pearl, bound, ablations).

Prints each scenario's table, then a summary row per scenario (PEARL / best baseline, tuned or
planned, which baseline, PEARL / bound) and, LAST, the geometric mean of PEARL / best baseline over the
scenarios and the minimum PEARL / bound. `--duration` shortens every run (virtual seconds) so the
whole set fits a small machine; the figures are then those of the shortened runs. A scenario that
trains a set number of steps (`max_train_steps`: the non-stationary ones) keeps its own length, so
every policy is judged on the same steps of its schedule. `--paper
MODEL:CLUSTER:POOL:AVAILABILITY` runs the paper matrix's cells of that model, cluster, pool and
availability, one per workload (`pearl.runtime.paper.cells`), instead of the shipped scenarios; a cell
whose trainer is predicted to be the bottleneck (`paper.bottleneck`) is run and printed but left out
of the geometric mean and the minimum (its ratios say little about rollout).

    .venv/bin/python benchmarks/policies.py [--seeds 3] [--jobs 2] [--only NAME] [--duration S] [--out DIR]
        [--paper qwen3-8b:16r16t:16:spot]
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.compare import best_baseline, compare, format_table, headline, write

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="run the scenarios whose file name contains this")
    ap.add_argument("--duration", type=float, default=None, help="override duration_s of every scenario")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "policies")
    ap.add_argument("--paper", default=None, metavar="MODEL:CLUSTER:POOL:AVAILABILITY",
                    help="the paper matrix's cells (every workload) instead of the shipped scenarios")
    a = ap.parse_args()
    summary = []
    for name, cfg, tbound in _scenarios(a, load_config, ScenarioConfig):
        t0 = time.perf_counter()
        rows = compare(cfg, [cfg.seed + i for i in range(a.seeds)], jobs=a.jobs, log=lambda s: None)
        write(rows, a.out / name)
        h = headline(rows)
        best = best_baseline(rows).name
        print(f"## {name} ({a.seeds} seeds, {cfg.duration_s:.0f} virtual s, {time.perf_counter() - t0:.0f} s)"
              + (" — trainer-bound (predicted): left out of the summary figures" if tbound else ""))
        print(format_table(rows))
        print()
        summary.append((name, h["pearl_over_best_baseline"], best, h["pearl_over_bound"], tbound))
    print("| scenario | PEARL / best baseline | best baseline | PEARL / bound |")
    print("|---|---|---|---|")
    for name, r, best, b, tbound in summary:
        print(f"| {name}{' (trainer-bound)' if tbound else ''} | {r:.3f} | {best} | {b:.3f} |")
    counted = [x for x in summary if not x[4]]
    good = [r for _, r, _, _, _ in counted if r == r and r > 0]
    gmean = math.exp(sum(map(math.log, good)) / len(good)) if good else math.nan
    bmin = min((b for _, _, _, b, _ in counted if b == b), default=math.nan)
    print(f"PEARL / best baseline: geometric mean {gmean:.3f} over {len(good)} scenarios; "
          f"PEARL / bound: minimum {bmin:.3f}")


def _scenarios(a, load_config, ScenarioConfig):
    """(name, scenario, trainer-bound?) to run: the shipped scenario files, or `--paper`'s cells."""
    over = {"duration_s": a.duration} if a.duration else None
    if a.paper is None:
        for f in sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if not a.only or a.only in p.stem):
            cfg = load_config(f, ScenarioConfig)
            # A scenario that trains a set number of steps (a non-stationary schedule) is compared at
            # equal steps: cut at a virtual time, a faster policy would be judged on later, longer
            # trajectories than a slower one.
            yield f.stem, (cfg if cfg.max_train_steps else load_config(f, ScenarioConfig, over)), False
        return
    from pearl.runtime.paper import bottleneck, cells

    try:
        model, cluster, pool, availability = a.paper.split(":")
        chosen = cells(models=[model], clusters=[cluster], pools=[int(pool)], availability=[availability],
                       seeds=[0], duration_s=a.duration)
    except ValueError as err:
        raise SystemExit(f"--paper wants MODEL:CLUSTER:POOL:AVAILABILITY, e.g. qwen3-8b:16r16t:16:spot ({err})")
    if not chosen:
        raise SystemExit(f"--paper {a.paper}: no such cell in the paper matrix (see scenarios/paper/generate.py --list)")
    for c in chosen:
        if not a.only or a.only in c.key:
            yield c.key, c.config, bottleneck(c).trainer_bound


if __name__ == "__main__":
    main()
