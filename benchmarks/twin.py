"""The digital twin: does the simulator predict a real `pearl train` run of this machine?

In one invocation:
1. calibrate (`pearl.runtime.twin_profile.calibrate`, what `pearl profile` does: the engine's steps, the
   GRPO trainer's cost and the shared-executor factors for 1 and 2 local workers), or take `--profile`;
2. run `pearl train` (the embedded default: the tiny model on the gridworld, batch 2 x 16, η = 1; policy
   `fixed` so the layout stays as set) for a colocated layout (1 rollout worker), a disaggregated one
   (1P:1D, `rollout_workers: 2`) and the colocated one at η = 0 (rollout and training take turns: the
   trainer idles), each a subprocess with its own run directory;
3. build each run's twin (`pearl.runtime.twin.build_twin`: the config, the profile, the run's records),
   simulate it, and print real and simulated trajectories/s and trainer idle share, and the relative
   throughput error; the LAST line is the worst error of the colocated and the 1P:1D runs (issue 8: must
   be <= 20 %, goal <= 10 %); the η = 0 run's error is printed in its row, not in that figure.

`--set key=value` (repeatable, as `pearl train --set`) changes the runs' config, e.g. a prefill-heavy
workload where the two layouts differ (docs/results.md, "Workload shift in a real run"):
`--set env.name=gridworld-shift --set 'env.kwargs={shift_after: 0, pad: 600}' --set engine.kv_capacity_tokens=8192`.
`--no-shared` / `--ready-order` / `--catalogue-trainer` switch parts of the twin off (the shared executor,
pearl train's batch order, the calibrated trainer) to show what each is worth.
Usage: PYTHONPATH=src python benchmarks/twin.py [--steps 20] [--profile P] [--out runs/bench-twin]
About 1-2 minutes on two cores.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.perf.profile import load_profile  # noqa: E402
from pearl.runtime.train_config import load_train_config  # noqa: E402
from pearl.runtime.twin import build_twin, read_run, real_figures, sim_figures, simulate_twin  # noqa: E402

LAYOUTS = {"colocated": ["layout=colocated", "rollout_workers=1"], "1P:1D": ["layout=1P:1D", "rollout_workers=2"],
           # η = 0: rollout and training take turns, so the trainer idles while a batch rolls out
           "coloc-eta0": ["layout=colocated", "rollout_workers=1", "staleness=0"]}
REQUIRED = ("colocated", "1P:1D")  # the last line's figure (issue 8); coloc-eta0 is printed beside it


def train(out: Path, sets: list[str]) -> float:
    """`pearl train` in a subprocess (as a user runs it); its wall seconds."""
    args = [sys.executable, "-c", "from pearl.cli import main; main()", "train", "--out", str(out), "--overwrite"]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    t0 = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"pearl train failed ({r.returncode}): {r.stderr.strip()[-600:]}")
    return time.perf_counter() - t0


def twin_variant(scn, args):
    tw = scn.twin
    upd = {}
    if args.no_shared:
        upd["shared"] = None
    if args.ready_order:
        upd["batch_order"] = "ready"
    if args.catalogue_trainer:
        upd["trainer"] = None
    return scn.model_copy(update={"twin": tw.model_copy(update=upd)}) if upd else scn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", type=Path, default=None, help="a saved pearl profile (with its trainer section)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-twin"))
    ap.add_argument("--no-shared", action="store_true")
    ap.add_argument("--ready-order", action="store_true")
    ap.add_argument("--catalogue-trainer", action="store_true")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="a pearl train --set override")
    args = ap.parse_args()
    from pearl.cli import _parse_sets

    base = _parse_sets(args.sets)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile is None:
        from pearl.runtime.twin_profile import calibrate

        t0 = time.perf_counter()
        prof = calibrate(load_train_config(None, {**base, "rollout_workers": 2}), args.out / "profile.json")
        print(f"calibrated in {time.perf_counter() - t0:.1f} s -> {args.out / 'profile.json'}")
    else:
        prof = load_profile(args.profile)
    tr = prof.trainer
    print(f"trainer: {tr.fixed_s * 1e3:.1f} ms + {tr.per_token_s * 1e6:.2f} us/token + {tr.per_pair_s * 1e9:.2f} ns/pair (+ log {tr.log_s * 1e3:.1f} ms, "
          f"checkpoint {tr.checkpoint_s * 1e3:.0f} ms); shared (workers, engine x, trainer x together, engine x, "
          f"trainer x alone): {list(tr.shared)}")
    worst = 0.0
    rows = []
    for name, sets in LAYOUTS.items():
        d = args.out / name.replace(":", "")
        wall = train(d, [*args.sets, f"max_steps={args.steps}", "policy.name=fixed", *sets])
        run = read_run(d)
        real = real_figures(run)
        sim = sim_figures(simulate_twin(twin_variant(build_twin(run.config, prof, run), args)))
        err = sim["trajectories_per_s"] / real["trajectories_per_s"] - 1
        if name in REQUIRED:
            worst = max(worst, abs(err))
        rows.append((name, real, sim, err, wall, run.summary))
    print(f"{'layout':<10} {'real traj/s':>11} {'sim traj/s':>10} {'error':>7} {'real idle':>9} {'sim idle':>8}")
    for name, real, sim, err, wall, s in rows:
        print(f"{name:<10} {real['trajectories_per_s']:>11.1f} {sim['trajectories_per_s']:>10.1f} {err:>+7.1%} "
              f"{real['trainer_idle']:>9.1%} {sim['trainer_idle']:>8.1%}   (run {wall:.0f} s; its wall / thread-CPU "
              f"seconds: engine steps x{s['engine_busy_s'] / max(s['engine_cpu_s'], 1e-9):.2f}, "
              f"trainer steps x{s['trainer_busy_s'] / max(s['trainer_cpu_s'], 1e-9):.2f})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"worst relative throughput error (colocated, 1P:1D): {worst:.1%}")


if __name__ == "__main__":
    main()
