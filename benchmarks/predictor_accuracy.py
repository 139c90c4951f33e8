"""How close is the batch-completion predictor to the simulator, in the controller's own regime?

The controller predicts the completion of the (η+1)·B trajectories in flight (`Controller.batch`),
for every candidate shape, with its own settings (`ControllerConfig.predict_*`) and the workload
statistics its estimator holds (`control.estimate`: the last `window` finished trajectories; here
the window is filled from a seed the simulation does not use, as in a run's steady state). This
benchmark asks exactly that prediction, through `Controller._predict`, and compares it with the
simulated completion of the same number of trajectories admitted at t=0 (staleness 0, one batch of
(η+1)·B = 512 trajectories: 64 per device on 8 devices, so KV-bound cells are included: swe with few
prefill workers evicts most idle contexts).

Grid: qwen3-8b on h800, 8 rollout devices; five profiles (swe, search, game, math-tool, web); shapes
colocated×8, 1P:7D, 2P:6D, 4P:4D at tp 1, colocated×4, 1P:3D at tp 2, colocated×2 at tp 4 and
colocated×1 at tp 8 (the tp choices the controller weighs: a single engine holds all 512). The truth is the mean of
`--seeds` simulations (`per_step[0].t_ready`); a single seed's maximum of a heavy-tailed batch varies
by several percent, and the prediction is an expectation.

With `--cap C` the same cells run with at most C trajectories in flight (`rl.max_concurrent_trajectories`;
the simulated batch is admitted C at a time) and the controller predicts as it does once its in-flight
cap is C (`Controller._recap`): the regime PEARL's KV-bound cells are decided in.

With `--devices N` (a multiple of 8) every shape's worker counts are scaled by N / 8; the batch stays
(η+1)·B = 512.

With `--pipeline` the truth is a running pipeline instead of one batch admitted at once: staleness 1,
B = 256, the layout held fixed for `--steps` training steps, a 64-device trainer so that rollout sets
the pace; the simulated time per (η+1)·B trajectories is (η+1) × the mean time between batches after
the first two. The staleness gate admits a batch at a time, so the 512 in flight are of two ages; the
controller still predicts them as 512 fresh ones (uncapped), which is what this mode tests.

Usage: python benchmarks/predictor_accuracy.py [--seeds 2] [--jobs 2] [--profiles swe,game] [--cap 128]
       [--devices 16] [--pipeline [--steps 8]]
Prints one row per cell (predicted, simulated, error), the selector's regret among the shapes tried
per profile, and the MAPE last. About two minutes on two cores.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from multiprocessing import Pool
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from pearl.config import ScenarioConfig, parse_config  # noqa: E402
from pearl.control.controller import ControlSetting, Controller  # noqa: E402
from pearl.control.observation import Observation, TrainerObs  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.types import LayoutShape  # noqa: E402
from pearl.workloads import Workload  # noqa: E402

PROFILES = ("swe", "search", "game", "math-tool", "web")
DEVICES, B, ETA, GROUP = 8, 256, 1, 8
SHAPES = (LayoutShape.colocated(8, 1), LayoutShape.disaggregated(1, 7, 1), LayoutShape.disaggregated(2, 6, 1),
          LayoutShape.disaggregated(4, 4, 1), LayoutShape.colocated(4, 2), LayoutShape.disaggregated(1, 3, 2),
          LayoutShape.colocated(2, 4), LayoutShape.colocated(1, 8))


def shapes(devices: int = DEVICES) -> tuple[LayoutShape, ...]:
    """SHAPES on `devices` (a multiple of 8): every worker count times devices / 8."""
    k = devices // DEVICES
    return tuple(replace(s, n_mixed=s.n_mixed * k, n_prefill=s.n_prefill * k, n_decode=s.n_decode * k)
                 for s in SHAPES)


WINDOW_SEED = 999_331  # the estimator's window: trajectories of a seed no simulation uses


def scenario(profile: str, shape: LayoutShape, seed: int, n: int, cap: int | None = None,
             devices: int = DEVICES, schedule: list | None = None) -> ScenarioConfig:
    """One batch of `n` trajectories admitted at t=0 on `shape` (`schedule`: the workload's, held
    from step 0 on, e.g. responses 4x longer)."""
    mode = shape.mode.value
    return parse_config(dict(
        seed=seed, model="qwen3-8b", duration_s=1e7, max_train_steps=1,
        cluster=dict(hardware="h800", rollout_devices=devices), engine=dict(tp=shape.tp),
        layout=dict(mode=mode, prefill=shape.n_prefill, decode=shape.n_decode),
        workload=_workload(profile, schedule), rl=dict(staleness=0, prompts_per_batch=n // GROUP, group_size=GROUP,
                                                max_concurrent_trajectories=cap)),
        ScenarioConfig)


def pipelined(profile: str, shape: LayoutShape, seed: int, steps: int, cap: int | None = None,
              devices: int = DEVICES) -> float:
    """Seconds per (η+1)·B trajectories of `shape` held fixed in a running pipeline (see --pipeline)."""
    cfg = parse_config(dict(
        seed=seed, model="qwen3-8b", duration_s=1e7, max_train_steps=steps,
        cluster=dict(hardware="h800", rollout_devices=devices, train_devices=64), engine=dict(tp=shape.tp),
        layout=dict(mode=shape.mode.value, prefill=shape.n_prefill, decode=shape.n_decode), workload=dict(profile=profile),
        rl=dict(staleness=ETA, prompts_per_batch=B // GROUP, group_size=GROUP, max_concurrent_trajectories=cap)),
        ScenarioConfig)
    return (ETA + 1) * batch_period(Simulator(cfg).run()["per_step"])


def batch_period(per_step: list[dict]) -> float:
    """The mean time between batches after the first two (the pipeline's start-up left out)."""
    t = [s["t_ready"] for s in per_step]
    return (t[-1] - t[2]) / (len(t) - 3)


def _workload(profile: str, schedule: list | None) -> dict:
    return dict(profile=profile) if not schedule else dict(profile=profile, schedule=schedule)


def controller_prediction(profile: str, shape: LayoutShape, window: int | None = None, cap: int | None = None,
                          devices: int = DEVICES, schedule: list | None = None) -> float:
    """What the controller predicts for `shape`: its ControlSetting (η, B), its estimator holding a
    full window of finished trajectories, its own predictor settings."""
    cfg = parse_config(dict(model="qwen3-8b", cluster=dict(hardware="h800", rollout_devices=devices),
                            workload=_workload(profile, schedule), policy=dict(name="pearl", controller=dict(
                                estimate=dict(window=window) if window else {})),
                            rl=dict(staleness=ETA, prompts_per_batch=B // GROUP, group_size=GROUP)), ScenarioConfig)
    sim = Simulator(cfg)
    setting = ControlSetting(perf_for=sim.perf_for, engine=cfg.engine, stats=None, batch_size=B, staleness=ETA,
                             devices_per_node=cfg.cluster.devices_per_node, num_kv_heads=sim.model.num_kv_heads)
    ctl = Controller(cfg.policy, setting)
    wl = Workload(cfg.workload, WINDOW_SEED)
    window = tuple(wl.trajectory(i, i) for i in range(ctl.k.estimate.window))
    ctl._estimate(Observation(0.0, (), (), shape, TrainerObs(False, 0, 0), finished=window,
                              finished_count=len(window)))
    if cap is not None:
        ctl._recap(cap)  # as when its admission control (or the configuration) sets the cap
    return ctl._predict([shape])[0].completion_s


def run_cell(args) -> dict:
    profile, shape, seeds, window, cap, steps, dev = args
    n = (ETA + 1) * B
    if steps:
        sims = [pipelined(profile, shape, s, steps, cap, dev) for s in seeds]
    else:
        sims = [Simulator(scenario(profile, shape, s, n, cap, dev)).run()["per_step"][0]["t_ready"] for s in seeds]
    return dict(profile=profile, shape=shape, sim=sims, pred=controller_prediction(profile, shape, window, cap, dev))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--profiles", default=",".join(PROFILES))
    ap.add_argument("--window", type=int, default=None, help="the estimator's window (default: the controller's)")
    ap.add_argument("--cap", type=int, default=None, help="trajectories in flight at most (default: all 512)")
    ap.add_argument("--pipeline", action="store_true", help="the truth is a running pipeline, not one batch at once")
    ap.add_argument("--steps", type=int, default=8, help="with --pipeline: training steps per run (at least 4)")
    ap.add_argument("--devices", type=int, default=DEVICES, help="rollout devices, a multiple of 8 (the shapes scale)")
    a = ap.parse_args()
    if a.cap is not None and a.cap < GROUP:
        ap.error(f"--cap must be at least one group ({GROUP} trajectories), got {a.cap}")
    if a.pipeline and a.steps < 4:
        ap.error(f"--steps must be at least 4 (the period is measured after the first two batches), got {a.steps}")
    if a.devices < DEVICES or a.devices % DEVICES:
        ap.error(f"--devices must be a multiple of {DEVICES}, got {a.devices}")
    steps = a.steps if a.pipeline else 0
    jobs = [(p, s, tuple(range(a.seeds)), a.window, a.cap, steps, a.devices)
            for p in a.profiles.split(",") for s in shapes(a.devices)]
    with Pool(a.jobs) as pool:
        rows = pool.map(run_cell, jobs, chunksize=1)
    print(f"{'profile':9s} {'shape':16s} {'predicted':>9s} {'simulated':>9s} {'spread':>6s} {'err':>7s}")
    errs = []
    for r in rows:
        sim = np.array(r["sim"])
        err = r["pred"] / sim.mean() - 1
        errs.append(abs(err))
        spread = (sim.max() - sim.min()) / sim.mean() if len(sim) > 1 else 0.0
        print(f"{r['profile']:9s} {str(r['shape']):16s} {r['pred']:9.1f} {sim.mean():9.1f} {100 * spread:5.1f}%"
              f" {100 * err:+6.1f}%")
    # The selector's choice among the shapes tried: the predicted best, judged by simulated time.
    hits, profiles = 0, list(dict.fromkeys(r["profile"] for r in rows))
    for p in profiles:
        rs = [r for r in rows if r["profile"] == p]
        sims = [float(np.mean(r["sim"])) for r in rs]
        pick = min(range(len(rs)), key=lambda i: rs[i]["pred"])
        hits += sims[pick] <= 1.05 * min(sims)
        print(f"  {p:9s}: predicted best {str(rs[pick]['shape']):16s} simulated best "
              f"{str(rs[int(np.argmin(sims))]['shape']):16s} regret {100 * (sims[pick] / min(sims) - 1):4.1f}%")
    print(f"selector within 5% of the best simulated shape: {hits}/{len(profiles)}")
    worst = max(range(len(rows)), key=lambda i: errs[i])
    flight = f"{(ETA + 1) * B}" if a.cap is None else f"{(ETA + 1) * B} (at most {a.cap} at once)"
    flight += " as a running pipeline" if a.pipeline else " admitted at once"
    print(f"cells: {len(rows)}, {flight} trajectories in flight on {a.devices} devices (η={ETA}, B={B}), "
          f"simulated mean of {a.seeds} seeds; worst {rows[worst]['profile']} {rows[worst]['shape']}: "
          f"{100 * errs[worst]:.1f}%")
    print(f"MAPE (controller's regime): {100 * np.mean(errs):.2f}%")


if __name__ == "__main__":
    main()
