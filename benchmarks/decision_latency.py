"""How long does one layout decision take? Predict every candidate PEARL considers for a large budget
and pick the best: `select` over 1024 devices with tp in (1, 2, 4, 8) (colocated and every P:D ratio
per tp; the ratio grid is searched coarse-to-fine), for a batch known only by its size.

The workload statistics are built once (as the controller keeps them between decisions); each timed
decision is one full `select` call, including the batch's representatives. Median over `--runs`.

Usage: python benchmarks/decision_latency.py [--runs 50] [--profile swe] [--model qwen3-8b]
The figure (the median) is printed last. Target: <= 10 ms.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402

from pearl.config import EngineConfig, WorkloadConfig  # noqa: E402
from pearl.control.predictor import BatchState, WorkloadStats  # noqa: E402
from pearl.control.selector import candidates, select  # noqa: E402
from pearl.perf.hardware import get_hardware  # noqa: E402
from pearl.perf.models import get_model  # noqa: E402
from pearl.perf.roofline import PerfModel  # noqa: E402
from pearl.workloads import Workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--profile", default="swe")
    ap.add_argument("--model", default="qwen3-8b")
    a = ap.parse_args()
    tps = (1, 2, 4, 8)
    base = PerfModel(get_model(a.model), get_hardware("h800"))
    perfs = {tp: base.with_tp(tp) for tp in tps}
    engine = EngineConfig()
    stats = WorkloadStats.from_workload(Workload(WorkloadConfig(profile=a.profile), 0))
    batch = BatchState.fresh(8 * a.devices)
    sel = select(a.devices, perfs, engine, stats, batch)  # warm-up (coefficient caches)
    times = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        sel = select(a.devices, perfs, engine, stats, batch)
        times.append(time.perf_counter() - t0)
    n_all = len(candidates(a.devices, tps))
    print(f"{a.devices} devices, tp {tps}: {n_all} candidate shapes, {sel.evaluated} predicted per decision")
    print(f"decision: {sel.reason}")
    print(f"p90 {1e3 * np.percentile(times, 90):.2f} ms, min {1e3 * min(times):.2f} ms over {a.runs} runs")
    print(f"median decision latency: {1e3 * float(np.median(times)):.2f} ms")


if __name__ == "__main__":
    main()
