"""What does coarse-to-fine tuning lose? The exhaustive search's winner vs the pruned search's.

For a few shipped scenarios (scenarios/*.yaml) and the policies whose search is pruned (`static-pd`,
with and without per-role tp, and `bound` at a budget of the rollout devices plus half the trainer's),
runs the exhaustive search (`tune(..., prune=False)`: every layout, then the caps) and the pruned one
(`pearl.runtime.tuning.search`: one layout per tp, every layout of the 2 best tps, the caps). Every
short run is deterministic (held-out seed), so a run both searches try is run once and its figure
shared. (`fixed`, `rlboost+`, `roll-partial` have one layout per tp: nothing is pruned for them.)

    nice -n 10 .venv/bin/python benchmarks/tuning_pruning.py [--duration 600] [--jobs 2] [--scenarios a,b]
        [--searches 'static-pd,static-pd per-role tp,bound']

Prints per (scenario, policy) both winners, their short-run throughputs and run counts; last, the
worst relative loss of the pruned winner's throughput and the ratio of the run counts (all searches).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pearl.config import ScenarioConfig, deep_merge, load_config  # noqa: E402
from pearl.runtime import tuning  # noqa: E402

SCENARIOS = ("s1-search-qwen3-8b", "s1-game-qwen3-8b", "s2-web-qwen3-8b-elastic")
_CACHE: dict[str, float] = {}


def cached_trials(cfg, base, cands, ex):
    """`tuning._trials` with every short run's figure kept: a run already done is not run again."""
    by_label = {k.label() + (f" on {n}" if n is not None else ""): (k, n) for k, n in cands}
    data = {lab: tuning.configure(cfg, deep_merge(base, k.overrides(n))).model_dump(mode="json")
            for lab, (k, n) in by_label.items()}
    keys = {lab: _key(d) for lab, d in data.items()}
    todo = [(data[lab], keys[lab]) for lab in by_label if keys[lab] not in _CACHE]
    _CACHE.update(ex.map(tuning._trial, todo) if ex is not None else map(tuning._trial, todo))
    return sorted(((lab, _CACHE[keys[lab]], by_label[lab]) for lab in by_label), key=lambda x: -x[1])


def _key(data: dict) -> str:
    return json.dumps({k: v for k, v in data.items() if k != "name"}, sort_keys=True)


def one(cfg: ScenarioConfig, policy: str, prune: bool, ex) -> tuple[str, float, int]:
    """(winner's label, its short-run trajectories/s, runs tried)."""
    if policy == "bound":
        b = tuning.tune_bound(cfg, cfg.cluster.rollout_devices + cfg.cluster.train_devices / 2, pool=ex, prune=prune)
        short = min(cfg.duration_s, max(tuning.TUNE_MIN_S, tuning.TUNE_SHARE * cfg.duration_s))
        trial = {"seed": tuning.TUNE_SEED, "duration_s": short}  # each side's short run, already done
        thr = sum(w * _CACHE[_key(tuning.configure(c, trial).model_dump(mode="json"))] for c, w in b.sides)
        return b.label, thr, len(b.trials)
    t = tuning.tune(cfg, policy, extra={"policy": {"name": policy}}, pool=ex, prune=prune)
    return t.knobs.label(), t.trials[0][1], len(t.trials)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=600.0, help="scenario duration_s (tuning runs: max(600, 1/4))")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--searches", default="static-pd,static-pd per-role tp,bound", help="a subset of the three")
    a = ap.parse_args()
    tuning._trials = cached_trials  # type: ignore[assignment]
    worst, runs_full, runs_pruned = 0.0, 0, 0
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.jobs) as ex:
        for name in a.scenarios.split(","):
            base = load_config(ROOT / "scenarios" / f"{name}.yaml", ScenarioConfig, {"duration_s": a.duration})
            for policy, per_role in (("static-pd", False), ("static-pd", True), ("bound", False)):
                if f"{policy}{' per-role tp' if per_role else ''}" not in a.searches.split(","):
                    continue
                cfg = tuning.configure(base, {"policy": {"per_role_tp": per_role}})
                (fl, ft, fn), (pl, pt, pn) = (one(cfg, policy, prune, ex) for prune in (False, True))
                loss = 1 - pt / ft if ft else 0.0
                worst, runs_full, runs_pruned = max(worst, loss), runs_full + fn, runs_pruned + pn
                tag = f"{policy}{' per-role tp' if per_role else ''}"
                print(f"{name:26s} {tag:22s} exhaustive {fl} {ft:.4f} traj/s ({fn} runs) | pruned {pl} "
                      f"{pt:.4f} traj/s ({pn} runs) | loss {loss:.1%}", flush=True)
    print(f"({len(_CACHE)} distinct short runs, {time.perf_counter() - t0:.0f} s)")
    print(f"worst loss of the pruned winner: {worst:.1%}; runs pruned / exhaustive: {runs_pruned} / {runs_full} "
          f"= {runs_pruned / max(runs_full, 1):.2f}")


if __name__ == "__main__":
    main()
