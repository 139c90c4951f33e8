"""Every policy on the shipped scenarios, in the simulator, same seeds, same invocation (`pearl compare`
per scenario: baselines as configured and tuned, pearl, bound, ablations).

Prints each scenario's table, then a summary row per scenario (PEARL / best tuned baseline, which
baseline, PEARL / bound) and, LAST, the geometric mean of PEARL / best tuned baseline over the
scenarios and the minimum PEARL / bound. `--duration` shortens every run (virtual seconds) so the
whole set fits a small machine; the figures are then those of the shortened runs.

    .venv/bin/python benchmarks/policies.py [--seeds 3] [--jobs 2] [--only NAME] [--duration S] [--out DIR]
"""
from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.compare import compare, format_table, headline, write

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="run the scenarios whose file name contains this")
    ap.add_argument("--duration", type=float, default=None, help="override duration_s of every scenario")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "policies")
    a = ap.parse_args()
    files = sorted(p for p in (ROOT / "scenarios").glob("*.yaml") if not a.only or a.only in p.stem)
    summary = []
    for f in files:
        t0 = time.perf_counter()
        cfg = load_config(f, ScenarioConfig, {"duration_s": a.duration} if a.duration else None)
        rows = compare(cfg, [cfg.seed + i for i in range(a.seeds)], jobs=a.jobs, log=lambda s: None)
        write(rows, a.out / f.stem)
        h = headline(rows)
        by = {r.name: r.mean("throughput.trajectories_per_s") for r in rows}
        best = max((k for k in by if k.endswith(" tuned")), key=by.get)
        print(f"## {f.stem} ({a.seeds} seeds, {cfg.duration_s:.0f} virtual s, {time.perf_counter() - t0:.0f} s)")
        print(format_table(rows))
        print()
        summary.append((f.stem, h["pearl_over_best_tuned"], best, h["pearl_over_bound"]))
    print("| scenario | PEARL / best tuned baseline | best tuned baseline | PEARL / bound |")
    print("|---|---|---|---|")
    for name, r, best, b in summary:
        print(f"| {name} | {r:.3f} | {best} | {b:.3f} |")
    good = [r for _, r, _, _ in summary if r == r and r > 0]
    gmean = math.exp(sum(map(math.log, good)) / len(good)) if good else math.nan
    bmin = min((b for *_, b in summary if b == b), default=math.nan)
    print(f"PEARL / best tuned baseline: geometric mean {gmean:.3f} over {len(good)} scenarios; "
          f"PEARL / bound: minimum {bmin:.3f}")


if __name__ == "__main__":
    main()
