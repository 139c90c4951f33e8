"""Batch completion on rollout workers of two kinds of device (e.g. H800s and H20s serving together).

A layout whose decode-capable workers (mixed, or decode behind shared prefill workers) run on two
kinds of device is priced as two parts, one per kind. A trajectory's KV lives on one worker, so the
batch splits: a share α of it on the first kind's workers, the rest on the second's. Every quantity
of the one-kind model (`pearl.control.predictor`) that involves other trajectories is per worker (its
decode batch, its KV, its chunk queue) or per prefill worker (its queue, its KV), so the part serving
α·N trajectories on n workers is the one-kind model of all N on n/α workers with the prefill workers
unchanged (each part sends them its share of the turns): one vectorised solve prices every part at
every α. The batch ends when both parts have: P(max ≤ t) = Π_parts Π_c F_c,part(t)^(share·n_c).

α is what the router makes of it (`pearl.engine.router.kv_pressure`): a worker takes new sessions
while its pressure p / speed^(1-p) is the lowest (p its KV fullness, speed its decode speed relative
to the fastest kind's), so at equilibrium the pressures are equal: far from full each kind holds KV in
proportion to its speed, near full in proportion to its memory. The fullness is set by the KV the
batch holds: the alive trajectories' mean context, from the one-kind solve (`share="router"`).
`share="best"` instead takes the α that ends the batch first (a router that balances perfectly);
a number fixes α.

Known trajectories (a batch in progress) are not supported: the planner's question is a fresh batch.
Pure: no clocks, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import brentq

from pearl.config import EngineConfig
from pearl.control.predictor import (BatchState, Prediction, WorkloadStats, _critical_path, _stacked, predict_many,
                                     prepare)
from pearl.control.predictor_core import BatchReps, _solve
from pearl.control.predictor_end import _expected_max, _same_node_share
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Role

_GRID = np.linspace(0.04, 0.96, 12)  # the shares α priced at once (then refined around the pick, _FINE of them)
_FINE, _STEP = 7, float(_GRID[1] - _GRID[0])


@dataclass(frozen=True)
class KindPart:
    """The decode-capable workers on one kind of device: how many, their model (its tp and hardware),
    and whether they share a node with the prefill workers (disaggregated layouts)."""

    workers: int
    perf: PerfModel
    with_prefill: bool = False


def router_share(parts: Sequence[KindPart], held_tokens: float) -> float:
    """The share of sessions on the first part's workers once the router's pressures are equal, with
    `held_tokens` of KV held in all (the level sets whether speed or memory decides)."""
    cap = [p.workers * p.perf.kv_capacity_tokens() for p in parts]
    top = max(p.perf.decode_speed() for p in parts)
    sp = [p.perf.decode_speed() / top for p in parts]

    def fullness(pressure: float, k: int) -> float:  # the p with p / sp^(1-p) = pressure (increasing in p)
        return brentq(lambda p: p / sp[k] ** (1.0 - p) - pressure, 0.0, 1.0) if pressure < 1.0 else 1.0

    total = sum(cap)
    if held_tokens >= total:
        return cap[0] / total
    level = brentq(lambda x: sum(fullness(x, k) * cap[k] for k in range(2)) - held_tokens, 1e-12, 1.0)
    held = [fullness(level, k) * cap[k] for k in range(2)]
    return held[0] / sum(held)


def _combined(reps: BatchReps, shares: Sequence[float]) -> BatchReps:
    """The batch's representatives once per part, each class `share` of its size (for `_expected_max`)."""
    n_lab = max(reps.sizes) + 1
    label = np.concatenate([reps.label + k * n_lab for k in range(len(shares))])
    sizes = {c + k * n_lab: n * a for k, a in enumerate(shares) for c, n in reps.sizes.items()}
    return BatchReps({}, np.tile(reps.w, len(shares)), label, np.tile(reps.q, len(shares)), sizes)


def predict_two_kinds(parts: Sequence[KindPart], engine: EngineConfig, stats: WorkloadStats, batch: BatchState,
                      prefill: tuple[int, PerfModel] | None = None, share: str | float = "router",
                      devices_per_node: int = 8, reps: BatchReps | None = None, tol: float = 1e-3,
                      grid_points: int = 48, near: float | None = None) -> Prediction:
    """The batch's completion with its decode-capable workers in two `parts` (mixed workers, or with
    `prefill` = (workers, model), decode workers behind those prefill workers); see the module
    docstring for `share`. `breakdown["share"]` is the α used. `near`: with `share="best"`, where the
    best share was last time (it moves little between calls): searched around first."""
    if len(parts) != 2 or min(p.workers for p in parts) < 1:
        raise ValueError("predict_two_kinds needs two parts with at least one worker each")
    if any(t.spec is not None for t in batch.trajectories):
        raise ValueError("predict_two_kinds prices a batch not yet started (no known trajectories)")
    reps = reps if reps is not None else prepare(stats, batch, 64, 8)
    dis = prefill is not None
    n_p, pre = (prefill if dis else (0, None))

    def solve(alphas: np.ndarray, steady: bool = False) -> dict:
        rows = [(k, a if k == 0 else 1.0 - a) for a in alphas for k in range(2)]
        cf = _stacked([parts[k].perf for k, _ in rows])
        cfp = _stacked([pre if dis else parts[k].perf for k, _ in rows])
        n_dw = np.array([[parts[k].workers / a] for k, a in rows])
        p_same = np.array([[_pair_share(parts[k], n_p, devices_per_node) if dis else 1.0] for k, _ in rows])
        flags = np.full((len(rows), 1), dis)
        return _solve(cf, n_dw, np.full((len(rows), 1), float(n_p)), flags, p_same, engine, reps, tol, cfp, steady)

    def ends(alphas: np.ndarray, r: dict) -> np.ndarray:
        T, sig = r["T"], r["sigma"]
        return np.array([_expected_max(np.hstack([T[2 * i], T[2 * i + 1]])[None],
                                       np.hstack([sig[2 * i], sig[2 * i + 1]])[None],
                                       _combined(reps, (a, 1.0 - a)), grid_points)[0] for i, a in enumerate(alphas)])

    r = None
    if share == "best":
        alpha, r = _best_share(solve, ends, near)
    elif share == "router":
        alpha = router_share(parts, _held_tokens(reps, solve(np.array([0.5]))))
    else:
        alpha = float(share)
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"share must be in (0, 1), 'best' or 'router' (got {share!r})")
    a = np.array([alpha])
    r = solve(a) if r is None else r
    comp = float(ends(a, r)[0])
    i, j = np.unravel_index(int(np.argmin(np.abs(r["T"] - comp))), r["T"].shape)  # the critical trajectory
    terms = _critical_path(reps, r, int(i), int(j))
    w, n = reps.w, reps.w.sum()
    gen = float((w * (reps.work["Dn"] + reps.work["K"])).sum())
    if batch.queued > 0:  # the queued ones at the parts' steady pace together (Little's law per part)
        st = solve(a, steady=True)["T"]
        rate = alpha * n / ((w * st[0]).sum() / n) + (1 - alpha) * n / ((w * st[1]).sum() / n)
        comp, gen = comp + batch.queued / rate, gen * (1 + batch.queued / n)
    comp += batch.syncs * max(pm.weight_sync_time() for pm in [*(p.perf for p in parts), *([pre] if dis else [])])
    # decode concurrency per worker, over both kinds (each part's is per worker already)
    conc = float(sum(p.workers * c for p, c in zip(parts, r["concurrency"])) / sum(p.workers for p in parts))
    mean_T = [(w * r["T"][k]).sum() / n for k in range(2)]
    return Prediction(comp, gen / comp, conc, max(terms, key=terms.get),
                      dict(share=alpha, critical_path=terms, mean_T=mean_T, evicted_share=[float(x) for x in r["evict"]]))


def predict_shapes(shapes: Sequence[LayoutShape], perf_of: Callable[[int], PerfModel], engine: EngineConfig,
                   stats: WorkloadStats, batch: BatchState, devices_per_node: int = 8, reps: BatchReps | None = None,
                   tol: float = 1e-2, grid_points: int = 48, prefill_of: Callable[[int], PerfModel] | None = None,
                   shares: dict[LayoutShape, float] | None = None) -> list[Prediction]:
    """Predictions for layout shapes of every kind, in order: shapes of one tp or a prefill tp of their
    own at once (`predict_many`; `prefill_of(tp)` the prefill workers' model, default `perf_of`'s at
    that tp), a colocated shape with side workers (`LayoutShape.tp_side`) as two parts with the split
    of the batch that ends it first (`predict_two_kinds(share="best")`): in a pipeline the router
    sends each new session to the least loaded worker, which balances the parts (`benchmarks/side_workers.py`:
    as close to the simulated batch period as for one-tp layouts, docs/results.md). `shares`:
    each side shape's last split, searched around first and updated (a caller's running hint)."""
    out: list[Prediction | None] = [None] * len(shapes)
    one = [i for i, s in enumerate(shapes) if not s.n_side]
    if one:
        ss = [shapes[i] for i in one]
        got = predict_many(ss, [perf_of(s.tp) for s in ss], engine, stats, batch, devices_per_node, reps=reps,
                           tol=tol, grid_points=grid_points,
                           prefill_perfs=None if prefill_of is None else [prefill_of(s.tp_of(Role.PREFILL)) for s in ss])
        for i, p in zip(one, got):
            out[i] = p
    for i, s in enumerate(shapes):
        if s.n_side:
            parts = [KindPart(s.n_mixed, perf_of(s.tp)), KindPart(s.n_side, perf_of(s.tp_side))]
            out[i] = p = predict_two_kinds(parts, engine, stats, batch, share="best", devices_per_node=devices_per_node,
                                           reps=reps, tol=tol, grid_points=grid_points,
                                           near=None if shares is None else shares.get(s))
            if shares is not None:
                shares[s] = p.breakdown["share"]
    return out  # type: ignore[return-value]


def _best_share(solve, ends, near: float | None) -> tuple[float, dict]:
    """The share that ends the batch first, and its solve's rows: around `near` first (kept if the
    best is inside that window), else a grid over (0, 1) refined around its pick."""
    k = -1
    if near is not None:
        fine = np.linspace(max(0.02, near - 2 * _STEP), min(0.98, near + 2 * _STEP), _FINE)
        rf = solve(fine)
        k = int(np.argmin(ends(fine, rf)))
    if not 0 < k < _FINE - 1:
        comp = ends(_GRID, solve(_GRID))
        i = int(np.argmin(comp))
        fine = np.linspace(_GRID[max(i - 1, 0)], _GRID[min(i + 1, len(_GRID) - 1)], _FINE)
        rf = solve(fine)
        k = int(np.argmin(ends(fine, rf)))
    return float(fine[k]), _pair(rf, k)  # (the pick's rows: no third solve)


def _pair(r: dict, k: int) -> dict:
    """The two rows (one per part) of share `k` of a solve over several shares."""
    n = len(r["T"])
    return {key: (v[2 * k:2 * k + 2] if isinstance(v, np.ndarray) and v.ndim and len(v) == n else v)
            for key, v in r.items()}


def _pair_share(part: KindPart, n_p: int, devices_per_node: int) -> float:
    """Share of this part's (prefill, decode) pairs on one node: none unless it shares the prefill
    workers' kind (two kinds never share a node), then as a one-kind layout of its own workers."""
    if not part.with_prefill:
        return 0.0
    return _same_node_share(LayoutShape.disaggregated(n_p, part.workers, part.perf.tp), devices_per_node)


def _held_tokens(reps: BatchReps, r: dict) -> float:
    """KV the batch holds on average over its life: each trajectory holds c0 + grow·t/T_i over
    [0, T_i] (mean c0 + grow/2), time-weighted over the longest life, averaged over the solve's rows."""
    held = reps.work["c0"] + (reps.work["cF"] - reps.work["c0"]) / 2
    return float((reps.w * held * r["T"]).sum(axis=1).mean() / r["T"].max())
