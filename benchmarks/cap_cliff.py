"""Where does the KV cache start to thrash? The predictor's answer against the simulator's, on s1-swe.

For one layout (colocated at `--tp`, the scenario's 8 rollout devices) and a sweep of caps on
trajectories in flight, prints the predictor's evicted share for a pipeline of that many fresh
trajectories (`Prediction.breakdown["evicted_share"]`, the controller's own model and settings) and
the simulated steady-state trajectories/s of the `fixed` layout run with that cap
(`rl.max_concurrent_trajectories`) and the scenario's seed, in the same invocation. Last: the largest
cap the predictor calls safe (evicted share ≤ `--safe`), the simulator's best cap, and the simulated
throughput at the former over the latter. This is why `pearl.control.admission` picks the cap from the
measured eviction rate, not from the model.

Usage: python benchmarks/cap_cliff.py [--tp 2] [--safe 0.05] [--caps 96 128 160 192 256 512]
    [--scenario scenarios/s1-swe-qwen3-8b.yaml]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from pearl.config import ScenarioConfig, load_config  # noqa: E402
from pearl.control.predictor import BatchState, WorkloadStats, predict_many, prepare  # noqa: E402
from pearl.runtime.sim import Simulator  # noqa: E402
from pearl.types import LayoutShape  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "s1-swe-qwen3-8b.yaml"))
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--safe", type=float, default=0.05)
    ap.add_argument("--caps", type=int, nargs="+", default=[96, 128, 160, 192, 256, 512])
    a = ap.parse_args()
    base = load_config(a.scenario, ScenarioConfig)
    sim0 = Simulator(base)
    k = base.policy.controller
    stats = WorkloadStats.from_workload(sim0.workload)
    shape = LayoutShape.colocated(base.cluster.rollout_devices // a.tp, a.tp)
    rows = []
    for cap in a.caps:
        batch = BatchState.fresh(cap)
        reps = prepare(stats, batch, k.predict_reps, k.predict_events)
        (pred,) = predict_many([shape], [sim0.perf_for(a.tp)], base.engine, stats, batch,
                               base.cluster.devices_per_node, reps=reps, tol=k.predict_tol,
                               grid_points=k.predict_grid_points)
        cfg = load_config(a.scenario, ScenarioConfig, {"policy": {"name": "fixed"}, "engine": {"tp": a.tp},
                                                      "rl": {"max_concurrent_trajectories": cap}})
        res = Simulator(cfg).run()
        tps = res["throughput"]["trajectories_per_s"]
        rows.append((cap, pred.breakdown["evicted_share"], tps, res["reconfiguration"]["kv_evictions"]))
        print(f"cap {cap:4d}: predicted evicted share {pred.breakdown['evicted_share']:.2f}   "
              f"simulated {tps:.4f} traj/s, {res['reconfiguration']['kv_evictions']} evictions", flush=True)
    safe = max((c for c, ev, _, _ in rows if ev <= a.safe), default=min(a.caps))
    best = max(rows, key=lambda r: r[2])
    at_safe = next(r[2] for r in rows if r[0] == safe)
    print(f"{shape}: predictor's largest safe cap {safe}, simulator's best cap {best[0]}; "
          f"simulated traj/s at the predictor's cap / at the best: {at_safe / best[2]:.3f}")


if __name__ == "__main__":
    main()
