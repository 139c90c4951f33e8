"""Batch-completion predictor: when will the rollout batch in flight finish under a layout shape?

Job: from the roofline step times, the engine limits, the workload's statistics and the batch's
progress, predict the completion time of the whole batch under candidate `LayoutShape`s, analytically
(no event simulation) and vectorised over candidates, cheap enough to rank many shapes per decision.

Model (DESIGN.md §3.2). The batch is a set of trajectories (turns of: prefill the new tokens, decode
the response, wait on the environment), known or sampled from the workload, each standing for a share
of the batch. A turn of trajectory i takes (Dn·τ + own-context reads + env + own prefill (+ KV
hand-offs))/turns + queue wait + join at the pace of the moment, and T_i is where its turns are done.
The rates depend on who is still running, so the batch is cut into segments at the sorted T_i;
within one the alive set is fixed and, per decode-capable worker:
- decode concurrency (Little's law): B = 1 + Σ_{alive mates} p_j, p_j = j's share of life decoding
  (one waiting on its environment holds KV, not a batch slot); mates = the N/n − 1 others sharing its
  worker. A fixed point: p depends on τ, τ on B;
- colocated: the mates' prefill chunks ride in mixed steps, each lengthening one by Δ (compute beyond
  the decode step's memory time): decode stretches by 1/(1 − ν·Δ), ν = the mates' turns per second
  (the first prompts' share of Δ aside: they are prefilled in the burst at t=0, not over the lives);
- disaggregated: a turn fetches its response's KV from the decode worker, prefills on a prefill
  worker and hands the new KV back (`kv_transfer_time`, same-node share from the device order);
- the prefill queue (prefill workers, or a mixed worker's chunk budget) is a closed network with
  think time Z (Schweitzer's MVA), so saturation throttles the turns instead of diverging; a prefill
  worker serves a turn at no less than its FLOPs and all-reduces (queued prompts share a chunk), and
  the first prompts' burst is that queue's first wait, not added to it;
- KV: every alive session holds KV on its decode-capable worker (disaggregated, also while it waits
  in the prefill queue: the prefill worker pulls it at admission; never less than the decoders' own
  contexts); decoders beyond
  capacity (or beyond the engine's `max_num_seqs`) shrink the batch and wait, idle sessions beyond
  it are evicted: the next turn recomputes the whole context in the prefill queue (a mixed worker's
  chunks, or a prefill worker's queue unless that worker's own KV still holds it: then it is
  re-sent), priced at the alive contexts' mean and mean square (the attention's) and with every
  recomputed token's all-reduces at tp > 1;
- the tail: late segments hold few trajectories, so the longest finish at low concurrency.
- per-role tp (`LayoutShape.tp_prefill`): prefill work (a prefill worker's steps, the first prompts'
  burst, recomputed contexts, its KV capacity) is timed with the prefill workers' model, decode with
  the decode workers'; a hand-off between the two moves at the slower side's links.
Its turns progress at each segment's pace (long waits early, a saturated queue, crowd its turns into
the fast late segments), so its mean wait per turn is the queue's weighted by its turns, not by time
(the queue's think time Z is what the rest of its life leaves); τ_h, the harmonic mean of the step
time over [0, T_i], sets its share of life decoding. Its mates are a random draw fixed for life;
linearised, they spread T_i by σ_i.
Completion = E[max] of T_i ~ N(T_i, σ_i): known trajectories as they are, a sampled class as n_c
draws: ∫ (1 − Π Φ · Π_c F_c^n_c) dt. Never below the slowest trajectory's critical path.
Under a cap on trajectories in flight (`BatchState.queued` more wait behind the batch), the queue goes
through in steady state: every finished trajectory replaced at once, so the alive set holds each kind
in proportion to its life, at mid-life, all the time (one more fixed point, no segments); the queued
take (queued / in flight + (1 − CV²)/2) mean steady lives (renewal: the slots start together)
before the last batch's E[max].

Here: the workload's statistics, the batch state, its representatives (`prepare`) and the entry points.
The numeric core (the vectorised roofline `_Coeffs`/`_step`, the fixed point `_solve`, the spread) is
`pearl.control.predictor_core`, the geometry (with the prefill workers' model at their own tp), E[max]
and the critical trajectory `pearl.control.predictor_end`; `BatchReps`, `_Coeffs` and `_step` are
re-exported here.

What it must not do: simulate events, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from pearl.config import EngineConfig
from pearl.control.predictor_core import BatchReps, _Coeffs, _solve
from pearl.control.predictor_end import _critical_path, _expected_max, _same_node_share, _with_tp
from pearl.control.predictor_core import _step  # noqa: F401  (re-exported: tests check it against the roofline)
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode, Role
from pearl.workloads import TrajectorySpec, Workload

__all__ = ["BatchReps", "BatchState", "Prediction", "TrajectoryProgress", "WorkloadStats",
           "predict", "predict_many", "prepare"]


# ------------------------------------------------------------------ workload statistics
@dataclass(frozen=True, eq=False)
class WorkloadStats:
    """Per-turn samples of M trajectories as padded matrices (0 past a trajectory's end): prompt (M,);
    responses, observations (observations[k] follows turn k), env_latency (M, K); turns (M,)."""

    prompt: np.ndarray
    responses: np.ndarray
    observations: np.ndarray
    env_latency: np.ndarray
    turns: np.ndarray

    @staticmethod
    def from_samples(specs: Iterable[TrajectorySpec], prior: WorkloadStats | None = None,
                     prior_weight: int = 0) -> WorkloadStats:
        """Fit from observed trajectories (an online refit), blended with `prior_weight` trajectories
        of a prior: finished trajectories are biased short early in a batch."""
        specs = list(specs)
        if prior is not None and prior_weight > 0:
            idx = np.linspace(0, prior.size - 1, min(prior_weight, prior.size)).astype(int)
            specs += [prior.spec(int(i)) for i in idx]
        if not specs:
            raise ValueError("WorkloadStats.from_samples needs at least one trajectory")
        mats = [np.zeros((len(specs), max(s.turns for s in specs))) for _ in range(3)]
        for i, s in enumerate(specs):
            mats[0][i, :s.turns] = s.responses
            mats[1][i, :len(s.observations)] = s.observations
            mats[2][i, :len(s.env_latency)] = s.env_latency
        return WorkloadStats(np.array([s.prompt_tokens for s in specs], float), *mats,
                             np.array([s.turns for s in specs]))

    @staticmethod
    def from_workload(workload: Workload, samples: int = 2048, seed: int = 987_654) -> WorkloadStats:
        """Sample the profile's distributions, on a seed of their own (never the batch's trajectories)."""
        w = copy.copy(workload)
        w.seed = seed
        return WorkloadStats.from_samples(w.trajectory(i, i) for i in range(samples))

    @property
    def size(self) -> int:
        return len(self.prompt)

    @cached_property
    def work_score(self) -> np.ndarray:
        """A rough critical path per sample (env + 10 ms per response token), to order samples by."""
        return self.env_latency.sum(1) + 0.01 * self.responses.sum(1)

    @cached_property
    def work_features(self) -> np.ndarray:
        """Per sample, standardised, the sums `_work` makes of it from its first turn (turns, decode
        steps, prefill tokens, environment seconds, own-context reads): what a representative should
        match of those it stands for."""
        w = _work(self, np.arange(self.size), np.zeros(self.size, int), None)
        f = np.stack([w[k] for k in ("K", "Dn", "X", "E", "Cd")], 1)
        return (f - f.mean(0)) / np.maximum(f.std(0), 1e-12)

    @cached_property
    def _memo(self) -> dict:
        """Results computed from these samples alone, kept for later calls (`_class_work`)."""
        return {}

    def spec(self, i: int) -> TrajectorySpec:
        k = int(self.turns[i])
        return TrajectorySpec(i, i, int(self.prompt[i]), tuple(int(x) for x in self.responses[i, :k]),
                              tuple(int(x) for x in self.observations[i, :k - 1]),
                              tuple(float(x) for x in self.env_latency[i, :k]))

    def values(self, name: str) -> np.ndarray:
        """Samples of turns, prompt_tokens, response_tokens, observation_tokens or env_latency_s."""
        if name in ("turns", "prompt_tokens"):
            return (self.turns if name == "turns" else self.prompt).astype(float)
        k, last = np.arange(self.responses.shape[1]), self.turns[:, None] - (name == "observation_tokens")
        return {"response_tokens": self.responses, "env_latency_s": self.env_latency,
                "observation_tokens": self.observations}[name][k < last]

    def mean(self, name: str) -> float:
        return float(v.mean()) if (v := self.values(name)).size else 0.0

    def quantile(self, name: str, q: float) -> float:
        return float(np.quantile(v, q)) if (v := self.values(name)).size else 0.0


# ------------------------------------------------------------------ batch state and the answer
@dataclass(frozen=True)
class TrajectoryProgress:
    """One trajectory in flight: turns finished, context after the last finished response, and its
    spec when known (replays, benchmarks): the turns from `turns_done` on are what is left."""

    turns_done: int = 0
    context: int = 0
    spec: TrajectorySpec | None = None


@dataclass(frozen=True)
class BatchState:
    """What is left of the batch: `n_fresh` trajectories not started (lengths unknown) plus those in
    flight, and `queued` more admitted one as each of them finishes (a cap on trajectories in flight:
    `size` is the cap's worth, the whole batch `size + queued`). `syncs` weight pushes land while it
    runs (one per training step: η + 1 in a pipeline of (η + 1)·B), each pausing every worker for its
    own sync (`PerfModel.weight_sync_time`): the batch ends the slowest worker's syncs later."""

    n_fresh: int = 0
    trajectories: tuple[TrajectoryProgress, ...] = ()
    queued: int = 0
    syncs: int = 0

    @staticmethod
    def fresh(n: int) -> BatchState:
        return BatchState(n_fresh=n)

    @staticmethod
    def from_specs(specs: Iterable[TrajectorySpec]) -> BatchState:
        return BatchState(trajectories=tuple(TrajectoryProgress(spec=s) for s in specs))

    @property
    def size(self) -> int:
        return self.n_fresh + len(self.trajectories)


@dataclass(frozen=True)
class Prediction:
    completion_s: float
    tokens_per_s: float  # generated tokens per second over the batch
    decode_concurrency: float  # time-averaged decode batch on a trajectory's worker
    bottleneck: str  # the largest term of the critical trajectory: decode, env or prefill
    breakdown: dict = field(default_factory=dict)


# ------------------------------------------------------------------ trajectories -> work
def _work(st: WorkloadStats, rows: np.ndarray, start: np.ndarray, ctx: np.ndarray | None) -> dict:
    """Remaining work of trajectories `rows` of `st` from turn `start` on (re-anchored on context
    `ctx`, the tokens after the last finished response, when given)."""
    resp, obs, env = st.responses[rows], st.observations[rows], st.env_latency[rows]
    turns, prompt, n = st.turns[rows], st.prompt[rows], len(rows)
    k = np.arange(resp.shape[1])
    mask = (k >= start[:, None]) & (k < turns[:, None])
    zero = np.zeros((n, 1))
    c = prompt[:, None] + np.cumsum(np.concatenate([zero, resp[:, :-1] + obs[:, :-1]], 1), 1)  # turn k's context
    x = np.concatenate([prompt[:, None], obs[:, :-1] + 1], 1)  # tokens turn k prefills
    if ctx is not None:
        s = np.minimum(start, resp.shape[1] - 1)
        shift = ctx + obs[np.arange(n), np.maximum(s - 1, 0)] - c[np.arange(n), s]
        c = c + np.where(start > 0, shift, 0.0)[:, None]
    d = np.maximum(resp - 1, 0) * mask  # decode steps (a turn's first token comes with its prefill)
    first, last = np.argmax(mask, 1), np.clip(turns - 1, 0, resp.shape[1] - 1)
    ri, ki = np.nonzero(mask)
    return dict(K=mask.sum(1).astype(float), Dn=d.sum(1), E=(env * mask).sum(1),
                Cd=(d * c + d * (d + 1) / 2).sum(1), X=(x * mask).sum(1),
                F=(np.concatenate([zero, resp[:, :-1]], 1) * mask).sum(1),  # response KV fetched back
                c0=c[np.arange(n), first], cF=(c + resp)[np.arange(n), last],
                fresh=(start == 0).astype(float), prompt=np.where(start == 0, prompt, 0.0),
                ev_row=ri, ev_x=x[ri, ki], ev_attn=x[ri, ki] * (c[ri, ki] - x[ri, ki] / 2))


# ------------------------------------------------------------------ the batch as representatives
def prepare(stats: WorkloadStats, batch: BatchState, max_reps: int = 512,
            max_events: int | None = None) -> BatchReps:
    """Representatives of `batch`: known trajectories as they are; those of unknown length as up to
    `max_reps` samples of `stats` per class (fresh, or by turns done, conditioned on lasting longer).
    With `max_events`, each rep's turns are merged into at most that many (equal-count groups by
    prefill size: sums kept exactly, only the spread within a group is lost)."""
    parts = []
    known = [t for t in batch.trajectories if t.spec is not None and t.turns_done < t.spec.turns]
    if known:
        ks = WorkloadStats.from_samples(t.spec for t in known)
        parts.append((_work(ks, np.arange(len(known)), np.array([t.turns_done for t in known]),
                            np.array([float(t.context) for t in known])), np.ones(len(known)), -1, 1))
    groups: dict[int, list[TrajectoryProgress]] = {}
    for t in batch.trajectories:
        if t.spec is None:
            groups.setdefault(t.turns_done, []).append(t)
    if batch.n_fresh:
        groups[-1] = []
    sizes = {}
    for label, (done, members) in enumerate(sorted(groups.items())):
        d = max(done, 0)
        rows = np.nonzero(stats.turns > d)[0]
        if rows.size == 0:  # longer than every sample: one more turn like the longest ones
            rows, d = np.nonzero(stats.turns == stats.turns.max())[0], int(stats.turns.max()) - 1
        sizes[label] = n = batch.n_fresh if done < 0 else len(members)
        ctx = None if done < 0 else float(np.mean([t.context for t in members]))
        work, q = _class_work(stats, rows, d, max_reps, ctx)
        parts.append((work, n * q, label, q))
    if not parts:
        raise ValueError("the batch is empty: nothing to predict")
    work = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0] if k != "ev_row"}
    offs = np.cumsum([0] + [len(p[1]) for p in parts])
    row = np.concatenate([p[0]["ev_row"] + o for p, o in zip(parts, offs)])
    w = np.concatenate([p[1] for p in parts])
    work["ev_m"] = np.ones(row.size)
    if max_events:
        order = np.lexsort((work["ev_x"], row))
        row, x, a = row[order], work["ev_x"][order], work["ev_attn"][order]
        first = np.searchsorted(row, np.arange(len(w)))
        n_ev = np.diff(np.append(first, row.size))
        key = row * max_events + (np.arange(row.size) - first[row]) * max_events // n_ev[row]
        cut = np.nonzero(np.diff(key, prepend=-1))[0]
        m = np.diff(np.append(cut, row.size)).astype(float)
        work["ev_x"], work["ev_attn"] = np.add.reduceat(x, cut) / m, np.add.reduceat(a, cut) / m
        row, work["ev_m"] = row[cut], m
    work["ev_row"], work["starts"] = row, np.searchsorted(row, np.arange(len(w)))
    return BatchReps(work, w, np.concatenate([np.full(len(p[1]), p[2]) for p in parts]),
                     np.concatenate([np.broadcast_to(p[3], len(p[1])) for p in parts]).astype(float), sizes)


def _class_work(stats: WorkloadStats, rows: np.ndarray, d: int, max_reps: int,
                ctx: float | None) -> tuple[dict, np.ndarray]:
    """A class's representatives (`_thin` of `rows`, the samples past turn `d`): their work from turn `d`
    on (re-anchored on context `ctx` when given) and masses. All but `ctx` depend on `stats` alone, so
    they are kept on it (`WorkloadStats._memo`) for later batches (not to be modified)."""
    if (key := (d, max_reps, rows.size)) not in stats._memo:
        rows, q = _thin(stats, rows, max_reps)
        stats._memo[key] = (rows, q, _work(stats, rows, np.full(rows.size, d), None))
    rows, q, work = stats._memo[key]
    return (work if ctx is None else _work(stats, rows, np.full(rows.size, d), np.full(rows.size, ctx))), q


def _thin(stats: WorkloadStats, rows: np.ndarray, max_reps: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_reps` rows with probability masses: the heaviest quarter (by a rough critical
    path) one by one, since they decide the batch's end; the rest in buckets by that score, finer
    towards the top, each stood for by one member, the masses calibrated to the bucket's sums."""
    if rows.size <= max_reps:
        return rows, np.full(rows.size, 1.0 / rows.size)
    order = rows[np.argsort(stats.work_score[rows], kind="stable")]
    top = max_reps // 4
    bulk, head = order[:-top], order[-top:]
    # Buckets shrink towards the top (their size grows with the square of the rank from it): the
    # batch's end is decided there, by the ones still running late and the pace they leave each other.
    m, j = max_reps - top, np.arange(max_reps - top + 1)
    from_top = np.maximum.accumulate(np.round(bulk.size * (j / m) ** 2) - j) + j
    edges = bulk.size - np.clip(from_top, j, bulk.size - m + j).astype(int)[::-1]
    # Each bucket is stood for by its member nearest the bucket's mean work
    # (`work_features`): one drawn at random would carry its own prefill, environment and context
    # totals, and a few dozen such draws miss the batch's sums by 10-20%.
    f, n = stats.work_features[bulk], np.diff(edges)
    bucket = np.repeat(np.arange(n.size), n)
    dist = ((f - (np.add.reduceat(f, edges[:-1]) / n[:, None])[bucket]) ** 2).sum(1)
    pick = np.lexsort((dist, bucket))[edges[:-1]]
    # Then their masses are calibrated (linearly, within 1/4-4x of the bucket's) to the bulk's sums.
    x = np.concatenate([np.ones((n.size, 1)), f[pick]], 1)
    lam = np.linalg.lstsq(x.T @ (n[:, None] * x), np.concatenate([[bulk.size], f.sum(0)]) - n @ x, rcond=None)[0]
    mass = n * np.clip(1 + x @ lam, 0.25, 4.0)
    return np.concatenate([bulk[pick], head]), np.concatenate([mass * bulk.size / mass.sum(), np.ones(top)]) / rows.size


# ------------------------------------------------------------------ entry points
def predict_many(shapes: Sequence[LayoutShape], perfs: Sequence[PerfModel], engine: EngineConfig,
                 stats: WorkloadStats | None, batch: BatchState, devices_per_node: int = 8,
                 max_reps: int = 512, reps: BatchReps | None = None, tol: float = 1e-4,
                 grid_points: int = 160, prefill_perfs: Sequence[PerfModel] | None = None) -> list[Prediction]:
    """`predict` for many shapes at once (vectorised over them): `perfs[i]` is shape i's worker model
    (its decode or mixed workers'); `prefill_perfs[i]` its prefill workers' (default: `perfs[i]`, or
    `perfs[i].with_tp(tp_prefill)` for a shape with a per-role tp); `reps` (from `prepare`) skips
    rebuilding the batch's representatives; `grid_points` sets the resolution of the E[max] integral.
    With `batch.queued`, the queued trajectories go through at the in-flight count's pace in steady
    state (a second solve: `_solve(steady=True)`, each finished one replaced at once), one every mean
    steady life / `batch.size` (Little's law), then the last `batch.size` finish as predicted for a
    batch of that size; the evicted share and decode concurrency are the steady state's."""
    if len(shapes) != len(perfs) or not shapes or (prefill_perfs is not None and len(prefill_perfs) != len(perfs)):
        raise ValueError("predict_many needs one PerfModel per shape, and at least one shape")
    if reps is None:
        reps = prepare(stats, batch, max_reps)
    cf = _stacked(perfs)
    if prefill_perfs is None:
        prefill_perfs = [_with_tp(pm, s.tp_of(Role.PREFILL)) for s, pm in zip(shapes, perfs)]
    cfp = cf if all(a is b for a, b in zip(prefill_perfs, perfs)) else _stacked(prefill_perfs)
    dis = np.array([s.mode is Mode.DISAGGREGATED for s in shapes])[:, None]
    n_dw = np.array([s.n_mixed + s.n_decode for s in shapes], float)[:, None]
    n_p = np.array([s.n_prefill for s in shapes], float)[:, None]
    if (n_dw < 1).any() or (dis & (n_p < 1)).any():
        raise ValueError("every shape needs a decode-capable worker (and a prefill worker if disaggregated)")
    p_same = np.array([_same_node_share(s, devices_per_node) for s in shapes])[:, None]
    r = _solve(cf, n_dw, n_p, dis, p_same, engine, reps, tol, cfp)
    T, w = r["T"], reps.w
    comp = _expected_max(T, r["sigma"], reps, grid_points)
    gen = float((w * (reps.work["Dn"] + reps.work["K"])).sum())
    end, mean_T, run = comp, (w * T).sum(1) / w.sum(), r
    if batch.queued > 0:
        run = _solve(cf, n_dw, n_p, dis, p_same, engine, reps, tol, cfp, steady=True)
        steady_T = (w * run["T"]).sum(1) / w.sum()
        # Renewal theory: each slot's k-th replacement starts at about (k + (1 - CV²)/2) mean lives, the
        # lives' CV² (spread and mates' noise) from the steady solve (all slots start together at t=0).
        cv2 = (w * ((run["T"] - steady_T[:, None]) ** 2 + run["sigma"] ** 2)).sum(1) / w.sum() / steady_T ** 2
        comp = comp + np.maximum(batch.queued / w.sum() + (1 - cv2) / 2, 0.0) * steady_T
        gen = gen * (1 + batch.queued / w.sum())
    if batch.syncs:
        comp = comp + batch.syncs * np.maximum([pm.weight_sync_time() for pm in perfs],
                                               [pm.weight_sync_time() for pm in prefill_perfs])
    rows = np.arange(len(shapes))
    crit = np.argmin(np.abs(T - end[:, None]), axis=1)  # the critical trajectory: the one ending nearest
    cols = (x.tolist() for x in (comp, run["concurrency"], T[rows, crit], r["sigma"][rows, crit], mean_T, run["evict"]))
    iters = r["iters"] + (run["iters"] if run is not r else 0)
    return [Prediction(c, gen / c, conc, max(terms, key=terms.get),
                       dict(critical_path=terms, critical_T=ct, spread_s=sp, mean_T=mt, evicted_share=ev, iterations=iters))
            for terms, c, conc, ct, sp, mt, ev in zip(_critical_path(reps, r, rows, crit), *cols)]


_STACKS: dict[tuple[int, ...], tuple[tuple[PerfModel, ...], _Coeffs]] = {}  # (models kept: ids not reused)


def _stacked(perfs: Sequence[PerfModel]) -> _Coeffs:
    """The models' coefficients, one row per entry (few distinct models, one per tp: each stacked once);
    the stacks of the last few hundred lists are kept (a decision predicts the last one's shapes again)."""
    hit = _STACKS.get(key := tuple(map(id, perfs)))
    if hit is None:
        if len(_STACKS) >= 256:
            _STACKS.clear()
        uniq = {id(pm): pm for pm in perfs}
        pos = {k: i for i, k in enumerate(uniq)}
        cf = _Coeffs.stack([_Coeffs.of(pm) for pm in uniq.values()]).take(np.array([pos[id(pm)] for pm in perfs]))
        hit = _STACKS[key] = (tuple(perfs), cf)
    return hit[1]


def predict(shape: LayoutShape, perf: PerfModel, engine: EngineConfig, stats: WorkloadStats,
            batch: BatchState, devices_per_node: int = 8, max_reps: int = 512) -> Prediction:
    """Predicted completion of `batch` under `shape`, workers modelled by `perf` (module docstring)."""
    return predict_many([shape], [perf], engine, stats, batch, devices_per_node, max_reps)[0]
