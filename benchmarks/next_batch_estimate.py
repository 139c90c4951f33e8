"""How well does the controller know when the trainer's next batch is ready, at the moments it asks?

Every lend decision rests on `pearl.control.lending.next_batch_at`: a lend is approved if the window
until that time pays for it. This benchmark runs PEARL in the simulator on a few scenarios and, at
every call the controller makes, records the shipped estimate and the one it replaced (a batch
overdue by the last intervals assumed one whole mean interval from now, which is also what a
runtime reporting no group count gets), then compares both with the time the batch really became
ready. Errors are split by whether the batch was overdue by the intervals (where the two differ).

Usage: python benchmarks/next_batch_estimate.py [--jobs 2] [--seed 0]
Prints one row per scenario and case, and last, for the overdue cases, the geometric mean over the
scenarios of (shipped median absolute error / replaced median absolute error). About 80 s on two cores.
"""
from __future__ import annotations

import argparse
import bisect
import sys
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402

SCENARIOS = ("scenarios/s1-game-qwen3-8b.yaml", "scenarios/s1-swe-qwen3-8b.yaml",
             "paper:qwen3-30b-a3b:8r8t:16:spot:web", "paper:qwen3-8b:32r32t:32:spot:search")


def _config(name: str, seed: int):
    from pearl.config import ScenarioConfig, load_config, parse_config
    from pearl.runtime.paper import cells

    if name.startswith("paper:"):
        _, model, cluster, pool, av, wl = name.split(":")
        cfg = cells(models=[model], clusters=[cluster], pools=[int(pool)], availability=[av], workloads=[wl],
                    seeds=[seed])[0].config
    else:
        cfg = load_config(ROOT / name, ScenarioConfig)
    d = cfg.model_dump(mode="json")
    d.update(seed=seed, policy={**d["policy"], "name": "pearl"})
    return parse_config(d, ScenarioConfig, cfg.name)


def measure(args) -> tuple[str, np.ndarray]:
    """(scenario, rows of [actual wait, shipped estimate, replaced estimate, overdue?, share of the
    batch's groups in]) at every call."""
    name, seed = args
    from dataclasses import replace

    import pearl.control.lending as lending
    from pearl.runtime.sim import Simulator

    shipped, calls = lending.next_batch_at, []

    def recorded(tr, t):
        got = shipped(tr, t)
        old = shipped(replace(tr, groups_ready=0, groups_needed=0), t)  # no group count
        calls.append((t, got[0], old[0], old[1].startswith("overdue"), tr.groups_ready / max(tr.groups_needed, 1)))
        return got

    lending.next_batch_at = recorded
    sim = Simulator(_config(name, seed))
    sim.run()
    ready = sorted(sim.batch_ready_t)
    rows = []
    for t, new, old, late, share in calls:
        i = bisect.bisect_right(ready, t)
        if t > 0 and i < len(ready):
            rows.append((ready[i] - t, new - t, old - t, late, share))
    return name, np.array(rows, float).reshape(-1, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    with Pool(a.jobs) as pool:
        results = pool.map(measure, [(s, a.seed) for s in SCENARIOS])
    print("| scenario | case | calls | groups in, median | actual wait, median s | shipped: median abs error s, "
          "over-estimated | replaced: median abs error s, over-estimated |")
    print("|---|---|---|---|---|---|---|")
    ratios = []
    for name, R in results:
        for case, m in (("overdue", R[:, 3] == 1), ("on time", R[:, 3] == 0)):
            if not m.any():
                continue
            act, new, old = R[m, 0], R[m, 1], R[m, 2]
            if case == "overdue":
                ratios.append(np.median(np.abs(new - act)) / np.median(np.abs(old - act)))
            print(f"| {Path(name).stem} | {case} | {int(m.sum())} | {np.median(R[m, 4]):.0%} | {np.median(act):.2f} | "
                  f"{np.median(np.abs(new - act)):.2f}, {np.mean(new > act):.0%} | "
                  f"{np.median(np.abs(old - act)):.2f}, {np.mean(old > act):.0%} |")
    print(f"overdue batches: median absolute error of the next-batch estimate, shipped / replaced, geometric "
          f"mean over {len(ratios)} scenarios: {float(np.exp(np.mean(np.log(ratios)))):.3f}")


if __name__ == "__main__":
    main()
