"""Configuration selection: under a device budget, which layout shape finishes the batch first?

Job (DESIGN.md §3.3): enumerate colocated and every disaggregated P:D ratio for each allowed tp
(with `per_role`, also for each pair of a prefill tp and a decode tp among them: a prefill worker of
tp 4 beside decode workers of tp 1), predict each with `pearl.control.predictor`, add the cost of
getting there from today's layout, and rank by predicted completion + transition cost. On large
budgets (a thousand devices is a thousand ratios per tp) the ratio grid is searched coarse-to-fine:
a geometric grid of prefill counts first, then the neighbourhood of the best one per tp, shrinking
until every ratio there has been scored. The completion time is close to unimodal in the prefill
count (too few prefill workers queue the turns, too many starve decode), which is what makes the
local refinement safe. A (prefill tp, decode tp) pair is one more grid: its prefill counts are those
whose decode workers fill the rest of the budget exactly.

What it must not do: decide *whether* to switch (that is `pearl.control.switching`), build plans, own
time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pearl.config import EngineConfig
from pearl.control.predictor import BatchState, Prediction, WorkloadStats, prepare
from pearl.control.predictor_mix import predict_shapes
from pearl.errors import ResourceError
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode, Role

__all__ = ["Selection", "budgets", "candidates", "fitting_models", "select", "side_shapes"]


@dataclass(frozen=True)
class Selection:
    best: LayoutShape
    # (shape, prediction, cost_s, score = completion + cost), best first
    ranked: list[tuple[LayoutShape, Prediction, float, float]] = field(default_factory=list)
    evaluated: int = 0  # shapes predicted (all of them, unless the grid was searched coarse-to-fine)

    @property
    def reason(self) -> str:
        shape, pred, cost, score = self.ranked[0]
        runner = f"; next {self.ranked[1][0]} at {self.ranked[1][3]:.1f} s" if len(self.ranked) > 1 else ""
        return (f"{shape}: predicted {pred.completion_s:.1f} s + transition {cost:.1f} s = {score:.1f} s "
                f"(bottleneck {pred.bottleneck}){runner}")


def candidates(n_devices: int, tps: Sequence[int] = (1,), per_role: bool = False) -> list[LayoutShape]:
    """Colocated and every P:D ratio, for each tp that divides the budget; with `per_role`, also every
    P:D with prefill workers of one tp and decode workers of another that use the budget exactly."""
    out: list[LayoutShape] = []
    for tp in sorted(set(tps)):
        if tp < 1 or n_devices < tp or n_devices % tp:
            continue
        n = n_devices // tp
        out.append(LayoutShape.colocated(n, tp))
        out.extend(LayoutShape.disaggregated(p, n - p, tp) for p in range(1, n))
    if per_role:
        for (tpp, tpd), ps in _pair_grids(n_devices, [t for t in sorted(set(tps)) if t >= 1], True).items():
            if tpp != tpd:
                out.extend(_shape(n_devices, tpp, tpd, p) for p in ps)
    return out


def budgets(node_sizes: Sequence[int], tps: Sequence[int]) -> dict[int, list[int]]:
    """The devices a layout of each tp can use, tp-sized groups on one node each (a node of 6 holds one
    worker of tp 4 and leaves 2 idle) -> the tps that have that budget; a tp without a worker is left out."""
    out: dict[int, list[int]] = {}
    for tp in sorted(set(tps)):
        n = sum(c - c % tp for c in node_sizes)
        if n >= tp:
            out.setdefault(n, []).append(tp)
    return out


def side_shapes(node_sizes: Sequence[int], tps: Sequence[int], main: Sequence[int] | None = None) -> list[LayoutShape]:
    """Colocated layouts of two tps: workers of a larger tp on every group of its size a node holds,
    and workers of a smaller one on what each node has left (nodes of 8, 8 and 6 with tps 8 and 2: two
    of tp 8 and three of tp 2). For each larger tp (with `main`, those in it: a baseline's own tp), two
    smaller ones at most: the largest that fits the largest piece left, and the largest that divides
    every piece (none of it idle)."""
    out = []
    for big in sorted(set(tps) if main is None else set(main)):
        rest = [c % big for c in node_sizes if c % big]
        small = [t for t in sorted(set(tps)) if t < big]
        picks = {max((t for t in small if t <= max(rest, default=0)), default=None),
                 max((t for t in small if all(r % t == 0 for r in rest)), default=None)} - {None}
        n_big = sum(c // big for c in node_sizes)
        for t in sorted(picks, reverse=True):
            if n_big and (n_small := sum(r // t for r in rest)):
                out.append(LayoutShape(Mode.COLOCATED, n_mixed=n_big, tp=big, n_side=n_small, tp_side=t))
    return out


def _pair_grids(n_devices: int, tps: Sequence[int], per_role: bool) -> dict[tuple[int, int], list[int]]:
    """(prefill tp, decode tp) -> the prefill counts whose decode workers fill `n_devices` exactly
    (at least one of each). Without `per_role`, only the pairs of one tp: every count in 1..n-1."""
    out: dict[tuple[int, int], list[int]] = {}
    for tpd in tps:
        for tpp in (tps if per_role else [tpd]):
            ps = [p for p in range(1, (n_devices - tpd) // tpp + 1) if (n_devices - p * tpp) % tpd == 0]
            if ps:
                out[(tpp, tpd)] = ps
    return out


def _shape(n_devices: int, tpp: int, tpd: int, p: int) -> LayoutShape:
    return LayoutShape.disaggregated(p, (n_devices - p * tpp) // tpd, tpd, tpp)


def _coarse(n: int, points: int) -> list[int]:
    """About `points` prefill counts in 1..n-1, denser at both ends (geometric from each side)."""
    if n - 1 <= points:
        return list(range(1, n))
    half = max(points // 2, 2)
    ps = {1, n - 1}
    for i in range(half):
        v = round((n / 2) ** (i / (half - 1)))
        ps.update((v, n - v))
    return sorted(p for p in ps if 1 <= p <= n - 1)


def select(n_devices: int, perf_for_tp: Callable[[int], PerfModel] | Mapping[int, PerfModel],
           engine: EngineConfig, stats: WorkloadStats, batch: BatchState, current: LayoutShape | None = None,
           transition_cost_s: Callable[[LayoutShape], float] = lambda shape: 0.0,
           tps: Sequence[int] | None = None, shapes: Sequence[LayoutShape] | None = None,
           devices_per_node: int = 8, max_reps: int = 32, max_events: int | None = 8,
           exhaustive: int = 48, coarse_points: int = 6, refine_points: int = 16, margin: float = 0.03,
           tol: float = 1e-2, per_role: bool = False, memo: dict | None = None,
           shares: dict[LayoutShape, float] | None = None) -> Selection:
    """Rank layout shapes for `n_devices` by predicted completion of `batch` + transition cost.

    `perf_for_tp(tp)` gives the worker model at that tp (a mapping's keys are the allowed tps; a tp
    whose model does not fit in memory is skipped). `shapes` restricts the choice to those shapes (of
    any kind: side workers too, priced with the models of their tps); otherwise a tp (with
    `per_role`, a (prefill tp, decode tp) pair) with at most `exhaustive` ratios
    is searched exhaustively, a larger one coarse-to-fine (only grids within `margin` of the best are
    refined). The current layout costs nothing to keep. `memo`: predictions of earlier calls for the
    same workload statistics and batch (the caller clears it when either changes), reused by shape and
    worker models. `shares`: side shapes' last splits (`predictor_mix.predict_shapes`)."""
    if tps is None:
        tps = sorted(perf_for_tp) if isinstance(perf_for_tp, Mapping) else (engine.tp,)
    perfs = fitting_models(perf_for_tp, tps)
    scored: dict[LayoutShape, Prediction] = {}
    reps = None

    def prepared():  # once, and only if something is predicted: every candidate sees the same batch
        nonlocal reps
        if reps is None:
            reps = prepare(stats, batch, max_reps, max_events)
        return reps

    def score(batch_shapes: list[LayoutShape]) -> None:
        new = [s for s in dict.fromkeys(batch_shapes)
               if s not in scored and all(tp in perfs for tp, _ in s.tp_groups())]
        key = {s: (s, *(id(perfs[tp]) for tp, _ in s.tp_groups())) for s in new}
        if memo is not None:
            scored.update((s, memo[key[s]]) for s in new if key[s] in memo)
            new = [s for s in new if s not in scored]
        if new:
            for s, p in zip(new, predict_shapes(new, perfs.__getitem__, engine, stats, batch, devices_per_node,
                                                reps=prepared(), tol=tol, grid_points=48,
                                                prefill_of=perfs.__getitem__, shares=shares)):
                scored[s] = p
                if memo is not None:
                    memo[key[s]] = p

    if shapes is not None:
        score(list(shapes))
    else:
        colo = [tp for tp in perfs if n_devices % tp == 0 and n_devices >= tp]
        grids = _pair_grids(n_devices, list(perfs), per_role)
        score(_first_shapes(colo, grids, current, n_devices, exhaustive, coarse_points))
        # Refine the ratio of each grid still in contention until the neighbourhood is scored densely.
        while more := _refinements(scored, grids, n_devices, margin, refine_points):
            score(more)
    return _ranked(scored, current, transition_cost_s, n_devices, tps)


def fitting_models(perf_for_tp: Callable[[int], PerfModel] | Mapping[int, PerfModel],
                   tps: Sequence[int]) -> dict[int, PerfModel]:
    """tp -> worker model, for each tp in `tps` whose model exists and fits in memory."""
    perfs: dict[int, PerfModel] = {}
    for tp in tps:
        try:
            pm = perf_for_tp[tp] if isinstance(perf_for_tp, Mapping) else perf_for_tp(tp)
            pm.kv_capacity_tokens()
        except (ResourceError, KeyError):
            continue
        perfs[tp] = pm
    return perfs


def _first_shapes(colo: Sequence[int], grids: dict[tuple[int, int], list[int]], current: LayoutShape | None,
                  n_devices: int, exhaustive: int, coarse_points: int) -> list[LayoutShape]:
    """The first round: per tp in `colo`, colocated and its P:D ratios; then the ratios of each
    (prefill tp, decode tp) pair of two tps; each grid (`grids`: pair -> prefill counts) whole if it
    has at most `exhaustive` ratios (a pair of two tps: 2 · `coarse_points`, so that the pairs add
    little to the first round; the refinement then searches the ones in contention), else a coarse
    grid of them; plus the current layout when it fits the budget."""
    first: list[LayoutShape] = []
    pairs = [(tp, tp) for tp in colo] + [k for k in grids if k[0] != k[1]]
    for tpp, tpd in pairs:
        if tpp == tpd:
            first.append(LayoutShape.colocated(n_devices // tpd, tpd))
        ps = grids.get((tpp, tpd), [])
        if len(ps) > (exhaustive if tpp == tpd else 2 * coarse_points):  # a pair of two tps: coarse sooner
            ps = [ps[v - 1] for v in _coarse(len(ps) + 1, coarse_points)]
        first.extend(_shape(n_devices, tpp, tpd, p) for p in ps)
    if current is not None and current.n_devices == n_devices:
        first.append(current)
    return first


def _refinements(scored: Mapping[LayoutShape, Prediction], grids: dict[tuple[int, int], list[int]],
                 n_devices: int, margin: float, refine_points: int) -> list[LayoutShape]:
    """The next round: for each grid still in contention (its best within `margin` of the overall
    best), up to about `refine_points` unscored ratios between the neighbours of its best prefill
    count; empty when there is nothing left to refine."""
    top = min(p.completion_s for p in scored.values())
    more: list[LayoutShape] = []
    for (tpp, tpd), valid in grids.items():
        done = {s.n_prefill: p.completion_s for s, p in scored.items()
                if s.tp == tpd and s.tp_of(Role.PREFILL) == tpp and s.mode is Mode.DISAGGREGATED}
        if not done or len(done) >= len(valid) or min(done.values()) > top * (1 + margin):
            continue
        ps = sorted(done)
        i = ps.index(min(ps, key=done.get))
        lo, hi = ps[max(i - 1, 0)], ps[min(i + 1, len(ps) - 1)]
        gaps = [p for p in valid if lo < p < hi and p not in done]
        step = max(1, -(-len(gaps) // refine_points))
        more.extend(_shape(n_devices, tpp, tpd, p) for p in gaps[::step])
    return more


def _ranked(scored: dict[LayoutShape, Prediction], current: LayoutShape | None,
            transition_cost_s: Callable[[LayoutShape], float], n_devices: int, tps: Sequence[int]) -> Selection:
    """The scored shapes ranked by completion + transition cost (keeping `current` is free)."""
    ranked = []
    for s, p in scored.items():
        cost = 0.0 if s == current else float(transition_cost_s(s))
        ranked.append((s, p, cost, p.completion_s + cost))
    if not ranked:
        raise ResourceError(f"no layout shape fits {n_devices} devices with tp in {list(tps)}")
    ranked.sort(key=lambda r: (r[3], r[0].n_devices, r[0].tp, r[0].mode.value, r[0].n_prefill,
                               r[0].tp_of(Role.PREFILL)))
    return Selection(ranked[0][0], ranked, len(scored))
