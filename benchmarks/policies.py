"""PEARL vs the baselines on every shipped scenario, in the simulator, same seeds, same invocation.

For each scenario in scenarios/: `fixed` (ROLL-style, the layout in the file), `rlboost+`,
`roll-partial` and `pearl`; prints steady-state trajectories/s, the ratios PEARL/fixed and
PEARL/RLBoost+, the trainer's worst wait for borrowed devices, and writes docs/policies.md.
The last line is the figure: the geometric-mean and minimum PEARL/fixed ratio.

    .venv/bin/python benchmarks/policies.py [--seeds 0 1] [--jobs 2] [--only NAME]
"""
from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ["fixed", "rlboost+", "roll-partial", "pearl"]


def one(args: tuple[str, str, int]) -> tuple[str, str, int, dict, float]:
    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.sim import Simulator

    path, policy, seed = args
    over = {"seed": seed}
    if policy != "fixed":
        over["policy"] = {"name": policy}
    cfg = load_config(path, ScenarioConfig, over)
    t = time.perf_counter()
    res = Simulator(cfg).run()
    return Path(path).stem, policy, seed, res, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    files = sorted(str(p) for p in (ROOT / "scenarios").glob("*.yaml") if not a.only or a.only in p.stem)
    jobs = [(f, p, s) for f in files for p in POLICIES for s in a.seeds]
    with ProcessPoolExecutor(a.jobs) as ex:
        out = list(ex.map(one, jobs))
    thr: dict[tuple[str, str], list[float]] = {}
    extra: dict[tuple[str, str], dict] = {}
    for name, pol, _, res, wall in out:
        thr.setdefault((name, pol), []).append(res["throughput"]["trajectories_per_s"])
        e = extra.setdefault((name, pol), {"wait": 0.0, "switches": 0, "wall": 0.0, "steps": 0})
        e["wait"] = max(e["wait"], res["trainer"]["max_device_wait_s"])
        e["switches"] += res["reconfiguration"]["switches"]
        e["wall"] += wall
        e["steps"] += res["train_steps"]
    names = sorted({n for n, _ in thr})
    lines = ["# PEARL vs baselines in the simulator", "",
             f"Command: `.venv/bin/python benchmarks/policies.py --seeds {' '.join(map(str, a.seeds))}`. "
             "Steady-state trained trajectories/s (mean over seeds), from the simulator's performance model.",
             "", "| scenario | " + " | ".join(POLICIES) + " | PEARL/fixed | PEARL/RLBoost+ | PEARL max trainer wait (s) | PEARL switches |",
             "|---|" + "---|" * (len(POLICIES) + 4)]
    ratios = []
    for n in names:
        m = {p: sum(thr[(n, p)]) / len(thr[(n, p)]) for p in POLICIES}
        r_fixed = m["pearl"] / m["fixed"] if m["fixed"] else math.nan
        r_boost = m["pearl"] / m["rlboost+"] if m["rlboost+"] else math.nan
        ratios.append(r_fixed)
        e = extra[(n, "pearl")]
        lines.append(f"| {n} | " + " | ".join(f"{m[p]:.4f}" for p in POLICIES) +
                     f" | {r_fixed:.2f}× | {r_boost:.2f}× | {e['wait']:.2f} | {e['switches']} |")
    good = [r for r in ratios if r == r and r > 0]
    gmean = math.exp(sum(math.log(r) for r in good) / len(good)) if good else float("nan")
    lines += ["", f"Geometric mean PEARL/fixed: {gmean:.2f}×; minimum {min(good):.2f}×."]
    text = "\n".join(lines) + "\n"
    if not a.only:
        (ROOT / "docs" / "policies.md").write_text(text)
    print(text)
    print(f"PEARL/fixed throughput: geometric mean {gmean:.2f}x, min {min(good):.2f}x over {len(good)} scenarios")


if __name__ == "__main__":
    main()
