"""PEARL vs the baselines on every shipped scenario, in the simulator, same seeds, same invocation.

For each scenario in scenarios/: `fixed` (ROLL-style, the layout in the file), `fixed, best tp` (the
same colocated layout at the best static tensor-parallel size, found by trying each: a tuned
baseline, since PEARL also picks the tp), `rlboost+`, `roll-partial` and `pearl`; prints steady-state
trajectories/s, the ratios, the trainer's worst wait for borrowed devices, and writes docs/policies.md.
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
    over: dict = {"seed": seed}
    if policy.startswith("fixed@tp"):
        over["engine"] = {"tp": int(policy.removeprefix("fixed@tp"))}
    elif policy != "fixed":
        over["policy"] = {"name": policy}
    cfg = load_config(path, ScenarioConfig, over)
    t = time.perf_counter()
    res = Simulator(cfg).run()
    return Path(path).stem, policy, seed, res, time.perf_counter() - t


def tp_variants(path: str) -> list[str]:
    """Static tp sizes to try for the tuned fixed baseline (colocated layouts only)."""
    from pearl.config import ScenarioConfig, load_config

    cfg = load_config(path, ScenarioConfig)
    if cfg.layout.mode.value != "colocated":
        return []
    n = cfg.cluster.rollout_devices
    return [f"fixed@tp{tp}" for tp in (1, 2, 4, 8)
            if tp != cfg.engine.tp and n % tp == 0 and tp <= cfg.cluster.devices_per_node]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    files = sorted(str(p) for p in (ROOT / "scenarios").glob("*.yaml") if not a.only or a.only in p.stem)
    jobs = [(f, p, s) for f in files for p in POLICIES + tp_variants(f) for s in a.seeds]
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
             "", "| scenario | " + " | ".join(POLICIES) + " | fixed, best tp | PEARL/fixed | PEARL/fixed best tp "
             "| PEARL/RLBoost+ | PEARL max trainer wait (s) | PEARL switches |",
             "|---|" + "---|" * (len(POLICIES) + 6)]
    ratios, tuned_ratios = [], []
    for n in names:
        m = {p: sum(thr[(n, p)]) / len(thr[(n, p)]) for p in POLICIES}
        tuned = {p: sum(v) / len(v) for (n2, p), v in thr.items() if n2 == n and p.startswith("fixed")}
        best_tp = max(tuned, key=tuned.get)
        r_tuned = m["pearl"] / tuned[best_tp] if tuned[best_tp] else math.nan
        tuned_txt = f"{tuned[best_tp]:.4f} ({best_tp.removeprefix('fixed@') if '@' in best_tp else 'as configured'})"
        r_fixed = m["pearl"] / m["fixed"] if m["fixed"] else math.nan
        r_boost = m["pearl"] / m["rlboost+"] if m["rlboost+"] else math.nan
        ratios.append(r_fixed)
        tuned_ratios.append(r_tuned)
        e = extra[(n, "pearl")]
        lines.append(f"| {n} | " + " | ".join(f"{m[p]:.4f}" for p in POLICIES) +
                     f" | {tuned_txt} | {r_fixed:.2f}× | {r_tuned:.2f}× | {r_boost:.2f}× | {e['wait']:.2f} | {e['switches']} |")
    good = [r for r in ratios if r == r and r > 0]
    gmean = math.exp(sum(math.log(r) for r in good) / len(good)) if good else float("nan")
    tg = [r for r in tuned_ratios if r == r and r > 0]
    tgmean = math.exp(sum(math.log(r) for r in tg) / len(tg)) if tg else float("nan")
    lines += ["", f"Geometric mean PEARL/fixed: {gmean:.2f}×; minimum {min(good):.2f}×. "
                  f"Against the fixed layout at its best static tp: {tgmean:.2f}×; minimum {min(tg):.2f}×."]
    text = "\n".join(lines) + "\n"
    if not a.only:
        (ROOT / "docs" / "policies.md").write_text(text)
    print(text)
    print(f"PEARL/fixed throughput: geometric mean {gmean:.2f}x, min {min(good):.2f}x over {len(good)} scenarios; "
          f"vs fixed at its best static tp: {tgmean:.2f}x, min {min(tg):.2f}x")


if __name__ == "__main__":
    main()
