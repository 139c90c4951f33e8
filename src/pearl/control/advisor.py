"""`pearl plan`: given a model, hardware, a device budget and a workload, rank every PD mode and
ratio (and tensor-parallel size; with `per_role`, a prefill tp of its own) by predicted rollout-batch
completion time. Pure and fast."""
from __future__ import annotations

import time

from pearl.config import EngineConfig, WorkloadConfig
from pearl.control.predictor import BatchState, Prediction, WorkloadStats, predict_many, prepare
from pearl.control.selector import candidates
from pearl.errors import ConfigError, ResourceError
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Role
from pearl.workloads import Workload


def advise(model: str, hardware: str, devices: int, workload: str, batch: int, tps: tuple[int, ...] = (1,),
           per_role: bool = False, max_in_flight: int | None = None) -> tuple[list[tuple[LayoutShape, Prediction]], float]:
    """Every candidate shape with its prediction, best first, and the seconds it took; with
    `max_in_flight`, the batch runs that many at a time (the rest queued: `BatchState.queued`)."""
    t0 = time.perf_counter()
    shape_m, hw = get_model(model), get_hardware(hardware)
    wl = Workload(WorkloadConfig(profile=workload))
    stats = WorkloadStats.from_workload(wl)
    perfs: dict[int, PerfModel] = {}
    for tp in tps:
        if tp < 1 or devices % tp:
            raise ConfigError(f"--tp: {tp} does not divide the device budget {devices}")
        try:
            pm = PerfModel(shape_m, hw, tp=tp)
            pm.kv_capacity_tokens()
        except ResourceError:
            continue  # the model does not fit at this tp: skip it
        perfs[tp] = pm
    if not perfs:
        raise ResourceError(f"{shape_m.name} does not fit on {hw.name} at tp in {list(tps)}: try a larger --tp")
    shapes = candidates(devices, tuple(perfs), per_role)
    n = batch if max_in_flight is None else min(max_in_flight, batch)
    b = BatchState(n_fresh=n, queued=batch - n)
    preds = predict_many(shapes, [perfs[s.tp] for s in shapes], EngineConfig(), stats, b,
                         reps=prepare(stats, b, 64, 8), tol=1e-2, grid_points=48,
                         prefill_perfs=[perfs[s.tp_of(Role.PREFILL)] for s in shapes])
    ranked = sorted(zip(shapes, preds), key=lambda x: x[1].completion_s)
    return ranked, time.perf_counter() - t0
