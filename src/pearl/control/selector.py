"""Configuration selection: under a device budget, which layout shape finishes the batch first?

Job (DESIGN.md §3.3): enumerate colocated and every disaggregated P:D ratio for each allowed tp,
predict each with `pearl.control.predictor`, add the cost of getting there from today's layout, and
rank by predicted completion + transition cost. On large budgets (a thousand devices is a thousand
ratios per tp) the ratio grid is searched coarse-to-fine: a geometric grid of prefill counts first,
then the neighbourhood of the best one per tp, shrinking until every ratio there has been scored. The
completion time is close to unimodal in the prefill count (too few prefill workers queue the turns,
too many starve decode), which is what makes the local refinement safe.

What it must not do: decide *whether* to switch (that is `pearl.control.switching`), build plans, own
time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from pearl.config import EngineConfig
from pearl.control.predictor import BatchState, Prediction, WorkloadStats, predict_many, prepare
from pearl.errors import ResourceError
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode

__all__ = ["Selection", "candidates", "select"]


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


def candidates(n_devices: int, tps: Sequence[int] = (1,)) -> list[LayoutShape]:
    """Colocated and every P:D ratio, for each tp that divides the budget."""
    out: list[LayoutShape] = []
    for tp in sorted(set(tps)):
        if tp < 1 or n_devices < tp or n_devices % tp:
            continue
        n = n_devices // tp
        out.append(LayoutShape.colocated(n, tp))
        out.extend(LayoutShape.disaggregated(p, n - p, tp) for p in range(1, n))
    return out


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
           tol: float = 1e-2) -> Selection:
    """Rank layout shapes for `n_devices` by predicted completion of `batch` + transition cost.

    `perf_for_tp(tp)` gives the worker model at that tp (a mapping's keys are the allowed tps; a tp
    whose model does not fit in memory is skipped). `shapes` restricts the choice to those shapes;
    otherwise a tp with at most `exhaustive` ratios is searched exhaustively, a larger one
    coarse-to-fine (only tps within `margin` of the best are refined). The current layout costs
    nothing to keep."""
    if tps is None:
        tps = sorted(perf_for_tp) if isinstance(perf_for_tp, Mapping) else (engine.tp,)
    perfs = _fitting_models(perf_for_tp, tps)
    scored: dict[LayoutShape, Prediction] = {}
    reps = prepare(stats, batch, max_reps, max_events)  # once: every candidate sees the same batch

    def score(batch_shapes: list[LayoutShape]) -> None:
        new = [s for s in dict.fromkeys(batch_shapes) if s not in scored and s.tp in perfs]
        if new:
            for s, p in zip(new, predict_many(new, [perfs[s.tp] for s in new], engine, stats, batch,
                                              devices_per_node, reps=reps, tol=tol, grid_points=48)):
                scored[s] = p

    if shapes is not None:
        score(list(shapes))
    else:
        grids = {tp: n_devices // tp for tp in perfs if n_devices % tp == 0 and n_devices >= tp}
        score(_first_shapes(grids, current, n_devices, exhaustive, coarse_points))
        # Refine the ratio of each tp still in contention until the neighbourhood is scored densely.
        while more := _refinements(scored, grids, margin, refine_points):
            score(more)
    return _ranked(scored, current, transition_cost_s, n_devices, tps)


def _fitting_models(perf_for_tp: Callable[[int], PerfModel] | Mapping[int, PerfModel],
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


def _first_shapes(grids: dict[int, int], current: LayoutShape | None, n_devices: int, exhaustive: int,
                  coarse_points: int) -> list[LayoutShape]:
    """The first round: per tp (`grids`: tp -> workers), colocated and every ratio (at most
    `exhaustive` of them) or a coarse grid of them; plus the current layout when it fits the budget."""
    first: list[LayoutShape] = []
    for tp, n in grids.items():
        first.append(LayoutShape.colocated(n, tp))
        ps = range(1, n) if n - 1 <= exhaustive else _coarse(n, coarse_points)
        first.extend(LayoutShape.disaggregated(p, n - p, tp) for p in ps)
    if current is not None and current.n_devices == n_devices:
        first.append(current)
    return first


def _refinements(scored: Mapping[LayoutShape, Prediction], grids: dict[int, int], margin: float,
                 refine_points: int) -> list[LayoutShape]:
    """The next round: for each tp still in contention (its best within `margin` of the overall
    best), up to about `refine_points` unscored ratios between the neighbours of its best prefill
    count; empty when there is nothing left to refine."""
    top = min(p.completion_s for p in scored.values())
    more: list[LayoutShape] = []
    for tp, n in grids.items():
        done = {s.n_prefill: p.completion_s for s, p in scored.items()
                if s.tp == tp and s.mode is Mode.DISAGGREGATED}
        if not done or len(done) >= n - 1 or min(done.values()) > top * (1 + margin):
            continue
        ps = sorted(done)
        i = ps.index(min(ps, key=done.get))
        gaps = range(ps[max(i - 1, 0)] + 1, ps[min(i + 1, len(ps) - 1)])
        gaps = [p for p in gaps if p not in done]
        step = max(1, -(-len(gaps) // refine_points))
        more.extend(LayoutShape.disaggregated(p, n - p, tp) for p in gaps[::step])
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
    ranked.sort(key=lambda r: (r[3], r[0].n_devices, r[0].tp, r[0].mode.value, r[0].n_prefill))
    return Selection(ranked[0][0], ranked, len(scored))
