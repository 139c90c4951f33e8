"""`pearl plan`: given a model, hardware, a device budget and a workload, rank every PD mode and
ratio (and tensor-parallel size; with `per_role`, a prefill tp of its own) by predicted rollout-batch
completion time. Pure and fast."""
from __future__ import annotations

import time

from pearl.config import EngineConfig, WorkloadConfig
from pearl.control.predictor import BatchReps, BatchState, Prediction, WorkloadStats, predict_many, prepare
from pearl.control.predictor_mix import KindPart, predict_two_kinds
from pearl.control.selector import candidates
from pearl.errors import ConfigError, ResourceError
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Role
from pearl.workloads import Workload


def _fitting(shape_m, hardware: str, devices: int, tps: tuple[int, ...]) -> dict[int, PerfModel]:
    """The worker model at each tp in `tps` that divides `devices` and holds the model."""
    hw, perfs = get_hardware(hardware), {}
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
    return perfs


def _batch(workload: str, batch: int, max_in_flight: int | None) -> tuple[WorkloadStats, BatchState, BatchReps]:
    """The workload's statistics, the batch (`max_in_flight` at a time, the rest queued) and its
    representatives."""
    stats = WorkloadStats.from_workload(Workload(WorkloadConfig(profile=workload)))
    n = batch if max_in_flight is None else min(max_in_flight, batch)
    b = BatchState(n_fresh=n, queued=batch - n)
    return stats, b, prepare(stats, b, 64, 8)


def _predict(at: tuple[WorkloadStats, BatchState, BatchReps], shapes: list[LayoutShape],
             perfs: list[PerfModel], prefill_perfs: list[PerfModel]) -> list[Prediction]:
    stats, b, reps = at
    return predict_many(shapes, perfs, EngineConfig(), stats, b, reps=reps, tol=1e-2, grid_points=48,
                        prefill_perfs=prefill_perfs)


def advise(model: str, hardware: str, devices: int, workload: str, batch: int, tps: tuple[int, ...] = (1,),
           per_role: bool = False, max_in_flight: int | None = None) -> tuple[list[tuple[LayoutShape, Prediction]], float]:
    """Every candidate shape with its prediction, best first, and the seconds it took; with
    `max_in_flight`, the batch runs that many at a time (the rest queued: `BatchState.queued`)."""
    t0 = time.perf_counter()
    perfs = _fitting(get_model(model), hardware, devices, tps)
    shapes = candidates(devices, tuple(perfs), per_role)
    preds = _predict(_batch(workload, batch, max_in_flight), shapes, [perfs[s.tp] for s in shapes],
                     [perfs[s.tp_of(Role.PREFILL)] for s in shapes])
    ranked = sorted(zip(shapes, preds), key=lambda x: x[1].completion_s)
    return ranked, time.perf_counter() - t0


def advise_mix(model: str, kinds: tuple[tuple[str, int], tuple[str, int]], workload: str, batch: int,
               tps: tuple[int, ...] = (1,), max_in_flight: int | None = None, per_role: bool = False
               ) -> tuple[list[tuple[str, LayoutShape, Prediction]], float]:
    """Rollout devices of two kinds, `kinds` = ((hardware, count), (hardware, count)): every layout on
    one kind alone (the other idle); every disaggregated layout with its prefill workers on one kind
    and its decode workers on the other (each kind used whole, one tp per role; `per_role`: the
    one-kind layouts too); and, at each tp both kinds hold, the layouts whose workers span both kinds
    (`pearl.control.predictor_mix`): colocated on every device, and P prefill workers on one kind's
    first devices with decode workers on the rest of that kind and all of the other.
    Returns (where, shape, prediction), best first, and the seconds it took."""
    t0 = time.perf_counter()
    m = get_model(model)
    perfs = {h: _fitting(m, h, n, tuple(t for t in tps if n % t == 0) or tps) for h, n in kinds}
    rows: list[tuple[str, LayoutShape, PerfModel, PerfModel]] = []
    for h, n in kinds:
        for s in candidates(n, tuple(perfs[h]), per_role):
            rows.append((f"{h} only", s, perfs[h][s.tp], perfs[h][s.tp_of(Role.PREFILL)]))
    for (hp, n_p), (hd, n_d) in (kinds, kinds[::-1]):
        for tpp, pp in perfs[hp].items():
            for tpd, pd in perfs[hd].items():
                rows.append((f"P {hp}, D {hd}",
                             LayoutShape.disaggregated(n_p // tpp, n_d // tpd, tpd, tpp), pd, pp))
    at = _batch(workload, batch, max_in_flight)
    preds = _predict(at, [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])
    out = [(r[0], r[1], p) for r, p in zip(rows, preds)] + _both_kinds(perfs, kinds, at)
    return sorted(out, key=lambda x: x[2].completion_s), time.perf_counter() - t0


def _both_kinds(perfs: dict[str, dict[int, PerfModel]], kinds: tuple[tuple[str, int], tuple[str, int]],
                at: tuple[WorkloadStats, BatchState, BatchReps]) -> list[tuple[str, LayoutShape, Prediction]]:
    """The layouts whose decode-capable workers span both kinds, one tp on all (as a scenario's
    `cluster.rollout_mix` runs them: the first kind's devices first, prefill workers on the first)."""
    stats, b, reps = at
    out: list[tuple[str, LayoutShape, Prediction]] = []
    for tp in sorted(set(perfs[kinds[0][0]]) & set(perfs[kinds[1][0]])):
        w = [c // tp for _, c in kinds]
        parts = [KindPart(w[k], perfs[h][tp]) for k, (h, _) in enumerate(kinds)]
        out.append(("both", LayoutShape.colocated(sum(w), tp),
                    predict_two_kinds(parts, EngineConfig(), stats, b, reps=reps)))
        for k, (h, _) in enumerate(kinds):  # prefill on kind k's first workers, decode on all the rest
            other = KindPart(w[1 - k], perfs[kinds[1 - k][0]][tp])
            for n_p in range(1, w[k]):
                mine = KindPart(w[k] - n_p, perfs[h][tp], with_prefill=True)
                out.append((f"P {h}, D both", LayoutShape.disaggregated(n_p, sum(w) - n_p, tp),
                            predict_two_kinds([mine, other], EngineConfig(), stats, b, prefill=(n_p, perfs[h][tp]),
                                              reps=reps)))
    return out
