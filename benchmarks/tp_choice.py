"""Does the predictor rank the tensor-parallel sizes as the simulator does, where a workload has grown?

The decision `ns-math-tool-qwen3-8b-growing` turns on (docs/results.md, "PEARL on the growing-response
scenario"): colocated workers at tp 1, 2, 4 and 8 over the same devices, for math-tool trajectories
whose responses are `--scale` times the profile's (turns 1 + (scale - 1) / 6 times, as that
scenario's schedule ends). Per tp: the controller's prediction (`predictor_accuracy.
controller_prediction`: its settings, an estimator window of the grown workload, the cap when given)
and the simulated completion of the same (η+1)·B = 512 trajectories admitted at t=0 (mean of
`--seeds`), then each side's gap between tp2 and tp4. Last line: the predicted best tp and its
simulated regret.

Usage: PYTHONPATH=src python benchmarks/tp_choice.py [--devices 16] [--scale 4] [--cap 128] [--seeds 2]
About 10 s on two cores.
"""
from __future__ import annotations

import argparse
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from predictor_accuracy import B, ETA, GROUP, controller_prediction, scenario  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.types import LayoutShape  # noqa: E402

PROFILE = "math-tool"


def cell(args) -> tuple[LayoutShape, float, list[float]]:
    shape, devices, schedule, cap, seeds = args
    n = (ETA + 1) * B
    sims = [Simulator(scenario(PROFILE, shape, s, n, cap, devices, schedule)).run()["per_step"][0]["t_ready"]
            for s in range(seeds)]
    return shape, controller_prediction(PROFILE, shape, cap=cap, devices=devices, schedule=schedule), sims


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--devices", type=int, default=16)
    ap.add_argument("--scale", type=float, default=4.0, help="response length x the profile's")
    ap.add_argument("--cap", type=int, default=None, help="trajectories in flight at most (default: all 512)")
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args()
    if a.devices < 8 or a.devices % 8:
        ap.error(f"--devices must be a multiple of 8 (tp up to 8), got {a.devices}")
    if not a.scale > 0:
        ap.error(f"--scale must be positive, got {a.scale}")
    if a.cap is not None and a.cap < GROUP:
        ap.error(f"--cap must be at least one group ({GROUP} trajectories), got {a.cap}")
    if a.seeds < 1:
        ap.error(f"--seeds must be at least 1, got {a.seeds}")
    schedule = [dict(step=0, response=a.scale, turns=1 + (a.scale - 1) / 6)]
    jobs = [(LayoutShape.colocated(a.devices // tp, tp), a.devices, schedule, a.cap, a.seeds) for tp in (1, 2, 4, 8)]
    with Pool(2) as pool:
        rows = pool.map(cell, jobs, chunksize=1)
    print(f"{'shape':16s} {'predicted':>9s} {'simulated':>9s} {'err':>7s}")
    pred = {r[0].tp: r[1] for r in rows}
    sim = {r[0].tp: float(np.mean(r[2])) for r in rows}
    for shape, p, _ in rows:
        print(f"{str(shape):16s} {p:9.1f} {sim[shape.tp]:9.1f} {100 * (p / sim[shape.tp] - 1):+6.1f}%")
    print(f"tp4 vs tp2: predicted {100 * (pred[4] / pred[2] - 1):+.1f}%, simulated {100 * (sim[4] / sim[2] - 1):+.1f}%")
    best_p, best_s = min(pred, key=pred.get), min(sim, key=sim.get)
    print(f"predicted best tp{best_p}, simulated best tp{best_s}: regret {100 * (sim[best_p] / sim[best_s] - 1):.1f}%")


if __name__ == "__main__":
    main()
