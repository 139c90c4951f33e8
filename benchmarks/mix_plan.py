"""Rollout devices of two kinds: does `pearl plan --mix` predict what the simulator does?

Cluster: 8 H800 and 8 H20 rollout devices, Qwen3-8B, one batch of 256 trajectories admitted at t=0
(staleness 0, 32 prompts x 8), as `benchmarks/predictor_accuracy.py` does for one kind. Per profile,
nine layouts at tp 1:
- `h800 only`: colocated x8 on the H800s (the H20s idle: the baseline, one kind of device);
- `h20 only`: colocated x8 on the H20s;
- `P h800, D h20` and `P h20, D h800`: 8P:8D, prefill on one kind, decode on the other
  (`cluster.rollout_mix`; the prefill workers take the first devices);
- `both, mixed`: colocated x16 on both kinds at once;
- `2P h800, D both`, `4P h800, D both`, `2P h20, D both`: 2 or 4 prefill workers on one kind's first
  devices, decode workers on the rest of that kind and all of the other (a decode pool of two kinds).
The last four are priced by `pearl.control.predictor_mix` (the batch split between the kinds as the
router's KV pressure splits it).
The prediction is `pearl.control.advisor.advise_mix`'s (what `pearl plan --mix h20:8` prints); the truth
is the mean over `--seeds` simulations of the batch's completion (`per_step[0].t_ready`).

Usage: python benchmarks/mix_plan.py [--seeds 2] [--jobs 2] [--profiles search,swe]
Prints one row per cell, per profile the planner's pick (among these cells) against the simulator's
best, and last the MAPE of the predicted cells (and of those with a pool of both kinds) and the best
two-kind layout's speed-up over `h800 only`, both simulated.
"""
from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.control.advisor import advise_mix  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.types import LayoutShape  # noqa: E402

PROFILES = ("search", "game", "math-tool", "web", "swe")
B, GROUP, N = 256, 8, 8  # batch, group size, devices of each kind
# label -> (cluster hardware, rollout devices, rollout_mix, layout, the planner's (where, shape) or None)
CELLS = {
    "h800 only": ("h800", N, {}, {"mode": "colocated"}, ("h800 only", LayoutShape.colocated(N))),
    "h20 only": ("h20", N, {}, {"mode": "colocated"}, ("h20 only", LayoutShape.colocated(N))),
    "P h800, D h20": ("h800", 2 * N, {"h20": N}, {"mode": "disaggregated", "prefill": N, "decode": N},
                      ("P h800, D h20", LayoutShape.disaggregated(N, N))),
    "P h20, D h800": ("h20", 2 * N, {"h800": N}, {"mode": "disaggregated", "prefill": N, "decode": N},
                      ("P h20, D h800", LayoutShape.disaggregated(N, N))),
    "both, mixed": ("h800", 2 * N, {"h20": N}, {"mode": "colocated"},
                    ("both", LayoutShape.colocated(2 * N))),
    "2P h800, D both": ("h800", 2 * N, {"h20": N}, {"mode": "disaggregated", "prefill": 2, "decode": 2 * N - 2},
                        ("P h800, D both", LayoutShape.disaggregated(2, 2 * N - 2))),
    "4P h800, D both": ("h800", 2 * N, {"h20": N}, {"mode": "disaggregated", "prefill": 4, "decode": 2 * N - 4},
                        ("P h800, D both", LayoutShape.disaggregated(4, 2 * N - 4))),
    "2P h20, D both": ("h20", 2 * N, {"h800": N}, {"mode": "disaggregated", "prefill": 2, "decode": 2 * N - 2},
                       ("P h20, D both", LayoutShape.disaggregated(2, 2 * N - 2))),
}
TWO_KINDS = [k for k in CELLS if k not in ("h800 only", "h20 only")]
POOLS = [k for k in TWO_KINDS if "both" in k]  # workers of both kinds in one pool


def simulate(task: tuple[str, str, int]) -> float:
    profile, label, seed = task
    hw, n, mix, layout, _ = CELLS[label]
    cfg = parse_config(dict(seed=seed, model="qwen3-8b", duration_s=1e7, max_train_steps=1,
                            cluster=dict(hardware=hw, rollout_devices=n, rollout_mix=mix), layout=layout,
                            workload=dict(profile=profile),
                            rl=dict(staleness=0, prompts_per_batch=B // GROUP, group_size=GROUP)), ScenarioConfig)
    return Simulator(cfg).run()["per_step"][0]["t_ready"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    a = ap.parse_args()
    profiles = [p for p in a.profiles.split(",") if p]
    tasks = [(p, label, s) for p in profiles for label in CELLS for s in range(a.seeds)]
    with Pool(a.jobs) as pool:
        got = pool.map(simulate, tasks, chunksize=1)
    truth: dict[tuple[str, str], list[float]] = {}
    for (p, label, _), t in zip(tasks, got):
        truth.setdefault((p, label), []).append(t)
    errs, pool_errs, gains = [], [], []
    print(f"{'profile':<10} {'layout':<15} {'predicted s':>12} {'simulated s':>12} {'error':>8}")
    for p in profiles:
        ranked, _ = advise_mix("qwen3-8b", (("h800", N), ("h20", N)), p, B)
        pred = {(where, shape): pr.completion_s for where, shape, pr in ranked}
        sim = {label: sum(truth[(p, label)]) / a.seeds for label in CELLS}
        predicted = {}
        for label, (*_, key) in CELLS.items():
            predicted[label] = pred[key]
            errs.append(abs(pred[key] / sim[label] - 1))
            if label in POOLS:
                pool_errs.append(errs[-1])
            print(f"{p:<10} {label:<15} {pred[key]:12.1f} {sim[label]:12.1f} {pred[key] / sim[label] - 1:+8.1%}")
        pick = min(predicted, key=predicted.__getitem__)
        best = min(sim, key=sim.__getitem__)
        two = min(TWO_KINDS, key=sim.__getitem__)
        gains.append(sim["h800 only"] / sim[two])
        print(f"{p:<10} planner picks '{pick}' ({sim[pick]:.1f} s simulated); simulator's best '{best}' "
              f"({sim[best]:.1f} s): regret {sim[pick] / sim[best] - 1:+.1%}; best two-kind layout '{two}' "
              f"is {gains[-1]:.2f}x h800 only")
    print(f"mix plan: MAPE {100 * sum(errs) / len(errs):.1f}% over {len(errs)} predicted cells "
          f"({100 * sum(pool_errs) / len(pool_errs):.1f}% over the {len(pool_errs)} with a pool of both kinds); best two-kind "
          f"layout / h800 only (simulated batch time) {min(gains):.2f}-{max(gains):.2f}x")


if __name__ == "__main__":
    main()
