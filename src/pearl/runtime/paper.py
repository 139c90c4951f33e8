"""The paper's experiment as a matrix of scenarios (issue 9, item 6), listed by code, not by hand.

Axes: model (Qwen3-8B at tp1, Qwen3-30B-A3B at tp2) × cluster (rollout : train devices) × elastic
pool (+0 / +8 / +16 / +32, +64 for the 30B model) × availability (`spot` trace or the `constant`
control; +0 has neither) × workload (the five profiles) × seed (0, 1, 2 by default). `cells()`
lists them as `Cell`s holding a validated `ScenarioConfig`; `smoke_cells()` is a small subset for
tests; `bottleneck()` is a quick check of whether a cell's trainer, not its rollout, sets the pace
(a ratio between policies is quoted only where it does not). `scenarios/paper/generate.py` writes
the cells as YAML files. Grounding of each number: docs/scenarios.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

import numpy as np

from pearl.config import EngineConfig, ScenarioConfig, WorkloadConfig, parse_config
from pearl.control.predictor import BatchState, WorkloadStats, predict_many, prepare
from pearl.errors import ResourceError
from pearl.perf.hardware import get_hardware
from pearl.perf.models import get_model
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape
from pearl.workloads import Z90, Workload

__all__ = ["Bottleneck", "Cell", "Cluster", "bottleneck", "cells", "smoke_cells", "spot_elastic", "spot_share"]

MODEL_TP = {"qwen3-8b": 1, "qwen3-30b-a3b": 2}
WORKLOAD_NAMES = ("swe", "search", "game", "math-tool", "web")
SEEDS = (0, 1, 2)
AVAILABILITY = ("spot", "constant")
HARDWARE = "h800"
# Virtual seconds per workload when the caller gives none: swe's rollout takes ~0.4-1.6 h per step on
# the small clusters, so an hour would hold one or two steps (measured: 0-2 in 900 s).
DURATION_S = {"swe": 4 * 3600.0}
DEFAULT_DURATION_S = 3600.0


@dataclass(frozen=True)
class Cluster:
    """A cluster set-up (WORKLOADS.md "Cluster set-ups"): the split and the RL batch it trains."""

    rollout: int
    train: int
    prompts: int  # prompts per batch
    group: int  # samples per prompt
    staleness: int
    models: tuple[str, ...]

    @property
    def tag(self) -> str:
        return f"{self.rollout}r{self.train}t"


CLUSTERS = (
    Cluster(8, 8, 32, 8, 1, ("qwen3-8b", "qwen3-30b-a3b")),  # S1: 16 GPUs, 32 x 8
    Cluster(16, 16, 64, 8, 2, ("qwen3-8b", "qwen3-30b-a3b")),  # S2: 32 GPUs, the 16 : 16 split, 64 x 8
    Cluster(24, 8, 64, 8, 2, ("qwen3-8b", "qwen3-30b-a3b")),  # S2: AReaL's 75/25 split
    Cluster(32, 32, 32, 8, 2, ("qwen3-8b", "qwen3-30b-a3b")),  # S3: 64 GPUs, 32 x 8
    Cluster(96, 32, 64, 16, 2, ("qwen3-30b-a3b",)),  # S4: 128 GPUs (verl fully-async 96 : 32), 64 x 16
)
POOLS = {"qwen3-8b": (0, 8, 16, 32), "qwen3-30b-a3b": (0, 8, 16, 32, 64)}


def spot_elastic(pool: int, availability: str) -> dict[str, Any]:
    """The elastic section for a pool of `pool` devices: GCP-Spot-like nodes of 8 (lifetimes LN(60 min,
    3 h), a 30 s notice 70% of the time, an empty node slot refilled after ~75 min on average, so a
    node is there ~54% of the time), or the same pool always there (`constant`)."""
    if pool == 0 or availability == "none":
        return {"kind": "none"}
    return {"kind": availability, "max_devices": pool, "burst": {"kind": "constant", "value": 8},
            "lifetime_s": {"kind": "lognormal", "median": 3600, "p90": 10800}, "notice_s": 30,
            "notice_probability": 0.7, "arrival_rate_per_h": 0.8}


@dataclass(frozen=True)
class Cell:
    """One scenario of the matrix (one seed)."""

    model: str
    cluster: Cluster
    pool: int
    availability: str  # "none" (pool 0), "spot" or "constant"
    workload: str
    seed: int
    config: ScenarioConfig

    @property
    def key(self) -> str:
        """The cell without its seed (seeds of one key are repeats)."""
        return self.config.name


def scenario_dict(model: str, cl: Cluster, pool: int, availability: str, workload: str, seed: int = 0,
                  duration_s: float | None = None) -> dict[str, Any]:
    """The scenario as the mapping a YAML file holds (`duration_s` None: the workload's default)."""
    duration_s = duration_s or DURATION_S.get(workload, DEFAULT_DURATION_S)
    tag = "p0" if pool == 0 else f"{availability}{pool}"
    return {
        "name": f"paper-{model}-{cl.tag}-{tag}-{workload}", "seed": seed, "model": model, "duration_s": duration_s,
        "cluster": {"hardware": HARDWARE, "rollout_devices": cl.rollout, "train_devices": cl.train,
                    "elastic": spot_elastic(pool, availability)},
        "engine": {"tp": MODEL_TP[model]}, "layout": {"mode": "colocated"}, "workload": {"profile": workload},
        "rl": {"prompts_per_batch": cl.prompts, "group_size": cl.group, "staleness": cl.staleness},
    }


def cells(models: Iterable[str] | None = None, workloads: Iterable[str] | None = None,
          pools: Iterable[int] | None = None, availability: Iterable[str] | None = None,
          clusters: Iterable[str] | None = None, seeds: Iterable[int] = SEEDS,
          duration_s: float | None = None) -> list[Cell]:
    """Every cell of the matrix, optionally filtered (`clusters` by tag, e.g. "8r8t"; `availability`
    among "none", "spot", "constant"), in a stable order."""
    ms, ws = list(models or MODEL_TP), list(workloads or WORKLOAD_NAMES)
    want_pools = None if pools is None else set(pools)
    want_av = None if availability is None else set(availability)
    want_cl = None if clusters is None else set(clusters)
    out = []
    for model in ms:
        for cl in CLUSTERS:
            if model not in cl.models or (want_cl is not None and cl.tag not in want_cl):
                continue
            for pool in POOLS[model]:
                for av in (("none",) if pool == 0 else AVAILABILITY):
                    if (want_pools is not None and pool not in want_pools) or (want_av is not None and av not in want_av):
                        continue
                    for w in ws:
                        for seed in seeds:
                            d = scenario_dict(model, cl, pool, av, w, seed, duration_s)
                            out.append(Cell(model, cl, pool, av, w, seed, parse_config(d, ScenarioConfig, d["name"])))
    return out


def smoke_cells(duration_s: float = 600.0) -> list[Cell]:
    """A small subset for tests: the smallest cluster, a fast workload, a spot pool and its control."""
    return cells(models=["qwen3-8b"], workloads=["game"], pools=[8], clusters=["8r8t"], seeds=[0],
                 duration_s=duration_s)


@dataclass(frozen=True)
class Bottleneck:
    """Predicted seconds per training step of the trainer and of the rollout (the best colocated
    layout of the rollout devices plus the pool's expected devices, in the controller's regime)."""

    train_s: float
    rollout_s: float

    @property
    def trainer_bound(self) -> bool:
        return self.train_s >= self.rollout_s


def bottleneck(cell: Cell) -> Bottleneck:
    """Quick check, no simulation: train time per step vs rollout time per step (see `Bottleneck`)."""
    c = cell.config
    el = c.cluster.elastic
    share = {"constant": 1.0, "spot": spot_share(el.lifetime_s.median or 3600, el.lifetime_s.p90 or 3600,
                                                 el.arrival_rate_per_h)}.get(el.kind, 0.0)
    n = c.cluster.rollout_devices + int(round(share * el.max_devices))
    return Bottleneck(*_bottleneck(c.model, c.cluster.hardware, c.workload.profile, n, c.cluster.train_devices,
                                   c.rl.prompts_per_batch * c.rl.group_size, c.rl.staleness, c.rl.train_mfu,
                                   c.rl.train_passes))


def spot_share(median_s: float, p90_s: float, refill_per_h: float) -> float:
    """Share of time a spot node slot is filled: mean lifetime / (mean lifetime + mean wait), for
    lognormal lifetimes LN(median, p90) (uncapped) and exponential waits."""
    if refill_per_h <= 0:
        return 1.0
    sigma = float(np.log(p90_s / median_s)) / Z90
    mean_life = median_s * float(np.exp(sigma ** 2 / 2))
    return mean_life / (mean_life + 3600.0 / refill_per_h)


@lru_cache(maxsize=512)
def _bottleneck(model: str, hardware: str, profile: str, n_rollout: int, n_train: int, batch: int,
                staleness: int, mfu: float, passes: int) -> tuple[float, float]:
    shape_m, hw = get_model(model), get_hardware(hardware)
    wl = Workload(WorkloadConfig(profile=profile))
    stats = WorkloadStats.from_workload(wl, samples=512)
    lengths = np.array([wl.trajectory(i, i).total_tokens for i in range(512)], dtype=float)
    base = PerfModel(shape_m, hw, tp=1)
    seq = float(np.sum(lengths ** 2) / np.sum(lengths))  # token-weighted mean row, as sim_trainer
    train_s = base.train_step_time(int(np.mean(lengths) * batch), n_train, mfu, seq_len=seq) * passes
    shapes, perfs = [], []
    for tp in (1, 2, 4, 8):
        if n_rollout < tp or shape_m.num_kv_heads % tp:
            continue
        try:
            pm = PerfModel(shape_m, hw, tp=tp)
            pm.kv_capacity_tokens()
        except ResourceError:
            continue
        shapes.append(LayoutShape.colocated(n_rollout // tp, tp))
        perfs.append(pm)
    inflight = (staleness + 1) * batch
    b = BatchState.fresh(inflight)
    preds = predict_many(shapes, perfs, EngineConfig(), stats, b, reps=prepare(stats, b, 32, 8),
                         tol=1e-2, grid_points=48)
    return train_s, min(p.completion_s for p in preds) / (staleness + 1)

