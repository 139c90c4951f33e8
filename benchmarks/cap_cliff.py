"""Where does the KV cache start to thrash? The predictor's answer against the simulator's, on s1-swe.

For one layout (colocated at `--tp`, the scenario's 8 rollout devices) and a sweep of caps on
trajectories in flight, prints the predictor's evicted share and trajectories/s for the scenario's
pipeline ((η + 1)·B trajectories) run at most `cap` at a time, as the controller predicts it once its
cap is `cap` (`BatchState(n_fresh=cap, queued=pipeline - cap)`: the queued ones in steady state; the
controller's own settings), and the simulated steady-state trajectories/s of the `fixed` layout run
with that cap (`rl.max_concurrent_trajectories`) and the scenario's seed, in the same invocation.
Last: the largest cap the predictor calls safe (evicted share ≤ `--safe`), the cap it predicts
fastest, the simulator's best cap, and the simulated throughput at the predictor's fastest cap over
the simulator's best. (Before the steady-state model, commit 9bd0d60, the predictor saw no eviction
up to 160 in flight at tp2, where the simulator already thrashes.)

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
    pipeline = (base.rl.staleness + 1) * base.rl.prompts_per_batch * base.rl.group_size
    rows = []
    for cap in a.caps:
        n = min(cap, pipeline)
        batch = BatchState(n_fresh=n, queued=pipeline - n)
        reps = prepare(stats, batch, k.predict_reps, k.predict_events)
        (pred,) = predict_many([shape], [sim0.perf_for(a.tp)], base.engine, stats, batch,
                               base.cluster.devices_per_node, reps=reps, tol=k.predict_tol,
                               grid_points=k.predict_grid_points)
        cfg = load_config(a.scenario, ScenarioConfig, {"policy": {"name": "fixed"}, "engine": {"tp": a.tp},
                                                      "rl": {"max_concurrent_trajectories": cap}})
        res = Simulator(cfg).run()
        tps = res["throughput"]["trajectories_per_s"]
        rows.append((cap, pred.breakdown["evicted_share"], tps, pipeline / pred.completion_s))
        print(f"cap {cap:4d}: predicted evicted share {pred.breakdown['evicted_share']:.2f}, "
              f"{pipeline / pred.completion_s:.4f} traj/s   simulated {tps:.4f} traj/s, "
              f"{res['reconfiguration']['kv_evictions']} evictions", flush=True)
    safe = max((c for c, ev, _, _ in rows if ev <= a.safe), default=min(a.caps))
    fast = max(rows, key=lambda r: r[3])
    best = max(rows, key=lambda r: r[2])
    print(f"{shape}: predictor's largest safe cap {safe}, fastest cap {fast[0]}; simulator's best cap "
          f"{best[0]}; simulated traj/s at the predictor's fastest cap / at the best: {fast[2] / best[2]:.3f}")


if __name__ == "__main__":
    main()
