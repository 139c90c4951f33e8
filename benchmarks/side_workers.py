"""Side workers: on devices that come in pieces, is tp 8 on whole nodes plus a smaller tp on the rest
faster than the best single tp, and does the predictor say so where the controller decides?

22 H800s in nodes of 8, 8 and 6 (Qwen3-8B), the layout held fixed, staleness 1 and 32 × 8
trajectories per batch: the pipelined regime the controller runs in (S1, s4). The trainer has 64
devices, so that rollout, not training, sets the pace on every workload. Each layout runs `--steps`
training steps in the simulator; its period is the mean time between batches after the first two. The prediction is the controller's: the completion of the (η+1)·B = 512 trajectories in
flight (`predict_shapes`, a side layout priced as two parts, `predictor_mix`), over η+1.

One-tp layouts: colocated×5@tp4 (20 devices: a tp-4 worker on the node of six leaves two idle),
colocated×2@tp8 (16: the node of six idles), colocated×11@tp2 (22). Side layouts:
colocated×2@tp8+1@tp4, colocated×2@tp8+3@tp2, colocated×5@tp4+1@tp2.

Usage: python benchmarks/side_workers.py [--profiles math-tool,search] [--steps 8] [--jobs 2]
Prints one row per layout (simulated period, predicted, error) and per profile the best side layout
over the best one-tp layout; then the mean absolute prediction error of the side layouts and of the
one-tp layouts (the same predictor's baseline); last, the geometric mean of the ratio. About ten
seconds per profile on two cores.
"""
from __future__ import annotations

import argparse
import math
import sys
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.control.predictor import BatchState, WorkloadStats  # noqa: E402
from pearl.control.predictor_mix import predict_shapes  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.types import LayoutShape, Mode  # noqa: E402
from pearl.workloads import Workload  # noqa: E402
from predictor_accuracy import batch_period  # noqa: E402 - the period's one definition

DEVICES, TRAIN, PROMPTS, GROUP, ETA = 22, 64, 32, 8, 1


def side(a: int, ta: int, b: int, tb: int) -> LayoutShape:
    return LayoutShape(Mode.COLOCATED, n_mixed=a, tp=ta, n_side=b, tp_side=tb)


ONE_TP = (LayoutShape.colocated(5, 4), LayoutShape.colocated(2, 8), LayoutShape.colocated(11, 2))
SIDE = (side(2, 8, 1, 4), side(2, 8, 3, 2), side(5, 4, 1, 2))


def config(profile: str, steps: int) -> ScenarioConfig:
    return parse_config(dict(
        model="qwen3-8b", max_train_steps=steps, duration_s=1e7,
        cluster=dict(hardware="h800", rollout_devices=DEVICES, train_devices=TRAIN, devices_per_node=8),
        workload=dict(profile=profile), rl=dict(staleness=ETA, prompts_per_batch=PROMPTS, group_size=GROUP)),
        ScenarioConfig)


def cell(args: tuple[str, LayoutShape, int]) -> tuple[str, LayoutShape, float, float]:
    """(profile, layout, simulated period s, predicted period s)."""
    profile, shape, steps = args
    cfg = config(profile, steps)
    sim = Simulator(cfg)
    sim.control.initial = shape
    period = batch_period(sim.run()["per_step"])
    stats = WorkloadStats.from_workload(Workload(cfg.workload, 0), 512)
    pred = predict_shapes([shape], sim.perf_for, cfg.engine, stats, BatchState.fresh((ETA + 1) * PROMPTS * GROUP))[0]
    return profile, shape, period, pred.completion_s / (ETA + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="math-tool,search")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    if a.steps < 4:
        ap.error("--steps must be at least 4 (the period is measured after the first two batches)")
    profiles = a.profiles.split(",")
    jobs = [(p, s, a.steps) for p in profiles for s in ONE_TP + SIDE]
    with Pool(a.jobs) as pool:
        rows = pool.map(cell, jobs)
    ratios, errs = [], {True: [], False: []}
    for p in profiles:
        mine = [r for r in rows if r[0] == p]
        for _, s, period, pred in mine:
            print(f"{p:10s} {str(s):24s} {s.n_devices:3d} devices  simulated {period:7.1f} s/batch  "
                  f"predicted {pred:7.1f}  error {pred / period - 1:+6.1%}")
            errs[bool(s.n_side)].append(abs(pred / period - 1))
        one = min(r[2] for r in mine if not r[1].n_side)
        two = min(r[2] for r in mine if r[1].n_side)
        ratios.append(one / two)
        print(f"{p:10s} best side layout vs best one-tp layout (throughput): {one / two:.3f}")
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    mape = {k: sum(v) / len(v) for k, v in errs.items()}
    print(f"mean absolute prediction error: side layouts {mape[True]:.1%}, one-tp layouts {mape[False]:.1%}")
    print(f"best side layout / best one-tp layout, geometric mean over {len(profiles)} profiles: {gm:.3f}")


if __name__ == "__main__":
    main()
