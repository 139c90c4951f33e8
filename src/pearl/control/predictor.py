"""Batch-completion predictor: when will the rollout batch in flight finish under a layout shape?

Job: from the roofline step times, the engine limits, the workload's statistics and the batch's
progress, predict the completion time of the whole batch under candidate `LayoutShape`s, analytically
(no event simulation) and vectorised over candidates, cheap enough to rank many shapes per decision.

Model (DESIGN.md §3.2). The batch is a set of trajectories (turns of: prefill the new tokens, decode
the response, wait on the environment), known or sampled from the workload, each standing for a share
of the batch. Trajectory i takes T_i = env + own prefill (+ KV hand-offs) + Dn·τ_h + own-context reads
+ turns·(queue wait + join). The rates depend on who is still running, so the batch is cut into
segments at the sorted T_i; within one the alive set is fixed and, per decode-capable worker:
- decode concurrency (Little's law): B = 1 + Σ_{alive mates} p_j, p_j = j's share of life decoding
  (one waiting on its environment holds KV, not a batch slot); mates = the N/n − 1 others sharing its
  worker. A fixed point: p depends on τ, τ on B;
- colocated: the mates' prefill chunks ride in mixed steps, each lengthening one by Δ (compute beyond
  the decode step's memory time): decode stretches by 1/(1 − ν·Δ), ν = the mates' turns per second;
- disaggregated: a turn fetches its response's KV from the decode worker, prefills on a prefill
  worker and hands the new KV back (`kv_transfer_time`, same-node share from the device order);
- the prefill queue (prefill workers, or a mixed worker's chunk budget) is a closed network with
  think time Z (Schweitzer's MVA), so saturation throttles the turns instead of diverging;
- KV: every alive session holds KV; decoders beyond capacity shrink the batch and wait, idle sessions
  beyond it are evicted (the next turn recomputes, or re-sends, the whole context);
- the tail: late segments hold few trajectories, so the longest finish at low concurrency.
A trajectory decodes a steady share of its life, so its tokens see the harmonic mean τ_h of the step
time over [0, T_i]. Its mates are a random draw fixed for life; linearised, they spread T_i by σ_i.
Completion = E[max] of T_i ~ N(T_i, σ_i): known trajectories as they are, a sampled class as n_c
draws: ∫ (1 − Π Φ · Π_c F_c^n_c) dt. Never below the slowest trajectory's critical path.

What it must not do: simulate events, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Iterable, Sequence

import numpy as np
from scipy.special import ndtr

from pearl.config import EngineConfig
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode
from pearl.workloads import TrajectorySpec, Workload

_REBALANCE = 0.5  # share of the worker-mate spread that session rebalancing leaves (see _solve)

__all__ = ["BatchReps", "BatchState", "Prediction", "TrajectoryProgress", "WorkloadStats", "predict",
           "predict_many", "prepare"]


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
    flight."""

    n_fresh: int = 0
    trajectories: tuple[TrajectoryProgress, ...] = ()

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


# ------------------------------------------------------------------ vectorised roofline
class _Coeffs:
    """`PerfModel.step_time` as linear coefficients, probed through its public methods and checked, so
    that step times of many candidates and batch sizes are a few numpy operations."""

    NAMES = ("flop_rate", "byte_rate", "ovh", "sum", "a_tok", "a_pair", "a_lm", "b_static", "b_tok",
             "b_kv", "b_exp", "n_exp", "log_miss", "ar_tok", "ar_fixed", "cap", "xfer_same", "xfer_net",
             "setup")
    _cache: dict[int, tuple[PerfModel, _Coeffs]] = {}

    @classmethod
    def of(cls, pm: PerfModel) -> _Coeffs:
        hit = cls._cache.get(id(pm))
        if hit is None or hit[0] is not pm:  # (the model is kept, so its id is not reused)
            hit = cls._cache[id(pm)] = (pm, cls(pm))
        return hit[1]

    def __init__(self, pm: PerfModel | None = None):
        if pm is None:
            return
        c, hw, m, w = pm.coeffs, pm.hw, pm.model, pm.step_work
        self.flop_rate, self.byte_rate = pm.tp * hw.peak_flops * c.mfu, pm.tp * hw.hbm_bw * c.bw_eff
        self.ovh, self.sum = c.step_overhead_s, float(c.combine == "sum")
        f1, f2 = w(0, 0, 1, 0.0)[0], w(0, 0, 2, 0.0)[0]
        self.a_tok, self.a_lm, self.a_pair = f2 - f1, 2 * f1 - f2, w(1, 1)[0] - w(1, 0)[0]
        self.b_kv = w(1, 1)[1] - w(1, 0)[1]
        self.n_exp = float(m.num_experts) if m.is_moe else 0.0
        self.log_miss = float(np.log1p(-m.experts_per_token / m.num_experts)) if m.is_moe else 0.0
        a = np.array([[1.0, n, pm.experts_touched(n)] for n in (1, 2, 3)])
        sol = np.linalg.lstsq(a if self.n_exp else a[:, :2], [w(n, 0)[1] for n in (1, 2, 3)], rcond=None)[0]
        self.b_static, self.b_tok = sol[0], sol[1]
        self.b_exp = sol[2] if self.n_exp else 0.0  # bytes per expert touched
        self.ar_tok = w(2, 0)[2] - w(1, 0)[2]
        self.ar_fixed = w(1, 0)[2] - self.ar_tok
        self.cap = float(pm.kv_capacity_tokens())
        self.xfer_same = pm.kv_bytes_per_token / (hw.nvlink_bw * pm.tp)
        self.xfer_net = pm.kv_bytes_per_token / (hw.net_bw * pm.tp)
        self.setup = c.kv_setup_s
        for args in ((7, 9000, 0, 0.0), (3, 500, 700, 7e5), (0, 0, 4000, 9e6), (40, 2e5, 300, 4e5)):
            want, got = pm.step_time(*args), float(_step(self, *args[:2], *(args[2:] if args[2] else ())))
            if abs(got - want) > 1e-9 + 1e-6 * want:
                raise RuntimeError(f"predictor's step-time coefficients disagree with {pm}: {got} vs {want}")

    @staticmethod
    def stack(cs: Sequence[_Coeffs]) -> _Coeffs:
        out = _Coeffs()
        out.__dict__.update({n: np.array([getattr(c, n) for c in cs], float)[:, None] for n in _Coeffs.NAMES})
        return out

    def take(self, rows: np.ndarray) -> _Coeffs:
        out = _Coeffs()
        out.__dict__.update({n: getattr(self, n)[rows] for n in _Coeffs.NAMES})
        return out


def _step(c, B, ctx, P=None, A=None, parts: bool = False):
    """Vectorised `PerfModel.step_time` (B may be fractional: a mean batch); P, A: prefill tokens and
    attention work (None: a decode step, B > 0); with `parts`, also whether it is memory-bound."""
    tokens = B if P is None else B + P
    flops = c.a_tok * tokens + c.a_lm * B + c.a_pair * ctx
    nbytes = c.b_static + c.b_tok * tokens + c.b_kv * ctx + c.b_exp * c.n_exp * -np.expm1(tokens * c.log_miss)
    if P is not None:  # prefill chunks: their attention, their KV reads and one sampled position
        P = np.asarray(P, float)
        flops = flops + c.a_pair * A + c.a_lm * (P > 0)
        nbytes = nbytes + c.b_kv * np.where(P > 0, A / np.maximum(P, 1.0) + P / 2, 0.0)
    tc, tm = flops / c.flop_rate, nbytes / c.byte_rate
    t = c.ovh + np.where(c.sum > 0, tc + tm, np.maximum(tc, tm)) + c.ar_tok * tokens + c.ar_fixed
    if P is not None:
        t = np.where(tokens > 0, t, 0.0)  # an empty step costs nothing
    return (t, tm >= tc) if parts else t


# ------------------------------------------------------------------ the batch as representatives
@dataclass(frozen=True, eq=False)
class BatchReps:
    """The batch as weighted representatives (`prepare`): per-rep work arrays, population weight w,
    class label (-1: known) with mass q in its class, class sizes, and the turns as events."""

    work: dict
    w: np.ndarray
    label: np.ndarray
    q: np.ndarray
    sizes: dict


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
        rows, q = _thin(stats, rows, max_reps)
        sizes[label] = n = batch.n_fresh if done < 0 else len(members)
        ctx = None if done < 0 else np.full(rows.size, float(np.mean([t.context for t in members])))
        parts.append((_work(stats, rows, np.full(rows.size, d), ctx), n * q, label, q))
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


def _thin(stats: WorkloadStats, rows: np.ndarray, max_reps: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_reps` rows with probability masses: the heaviest quarter (by a rough critical
    path) one by one, since they decide the batch's end; the rest thinned evenly."""
    if rows.size <= max_reps:
        return rows, np.full(rows.size, 1.0 / rows.size)
    order = rows[np.argsort(stats.work_score[rows])]
    top = max_reps // 4
    bulk, head = order[:-top], order[-top:]
    pick = np.linspace(0, bulk.size - 1, max_reps - top).round().astype(int)
    edges = np.concatenate([[0], (pick[1:] + pick[:-1]) // 2 + 1, [bulk.size]])
    return np.concatenate([bulk[pick], head]), np.concatenate([np.diff(edges), np.ones(top)]) / rows.size


# ------------------------------------------------------------------ the fixed point
def _solve(cf, n_dw, n_p, dis, p_same, engine: EngineConfig, reps: BatchReps, tol: float) -> dict:
    """T_i and σ_i of every representative (columns) under every candidate (rows)."""
    wk, w = reps.work, reps.w
    K, Dn, E, Cd, X, F, c0, cF, fresh, prompt = (wk[k] for k in "K Dn E Cd X F c0 cF fresh prompt".split())
    ev_x, ev_a, ev_m, starts = wk["ev_x"], wk["ev_attn"], wk["ev_m"], wk["starts"]
    ev_w = w[wk["ev_row"]] * ev_m / (w[wk["ev_row"]] * ev_m).sum()
    C, N = dis.shape[0], len(w)
    ic, idis = np.nonzero(~dis[:, 0])[0], np.nonzero(dis[:, 0])[0]
    cc, cd = cf.take(ic), cf.take(idis)
    # Disaggregated: a prefill step per turn (its mean is the queue's service), fetch and hand-off.
    own, s1 = np.zeros((C, N)), np.zeros((C, 1))
    xfer = p_same * cf.xfer_same + (1 - p_same) * cf.xfer_net
    if idis.size:
        s_e = _step(cd, 0.0, 0.0, ev_x, ev_a)
        # Queued turns share steps (a chunk takes every waiting prompt up to the token budget), so
        # the queue drains at the marginal cost of a turn: its step less an empty step's overhead.
        s1[idis] = (np.maximum(s_e - _step(cd, 0.0, 0.0, 1.0, 0.5), 0.0) * ev_w).sum(1, keepdims=True)
        own[idis] = (np.add.reduceat(s_e * ev_m, starts, axis=1) + (2 * K - fresh) * cd.setup
                     + (X + F) * xfer[idis])
    # The first prompts all arrive at t=0: a trajectory waits, on average, for half of its worker's
    # other prompts (chunked together, so compute-bound).
    n_all = w.sum()
    p_time = (cf.a_tok * prompt + cf.a_pair * prompt ** 2 / 2) / cf.flop_rate
    p_mean = (p_time * w * fresh).sum(1, keepdims=True) / max((w * fresh).sum(), 1e-9)
    burst = 0.5 * np.maximum((w * fresh).sum() / np.where(dis, n_p, n_dw) - 1, 0) * p_mean * fresh
    # Of the N-1 others, N/n - 1 share a trajectory's worker (spread evenly, then session affinity).
    mate = np.clip((n_all / n_dw - 1) / max(n_all - 1, 1e-9), 0.0, 1.0)
    # Start from half of the mates decoding alongside, each at the batch's mean context.
    b0 = 1 + 0.5 * mate * (n_all - 1)
    tau1 = _step(cf, b0, Cd / np.maximum(Dn, 1) + (b0 - 1) * (w * Cd).sum() / max((w * Dn).sum(), 1.0))
    T = E + Dn * tau1 + np.where(dis, own, K * tau1) + burst
    tau_h, wait = tau1 + 0 * T, 0 * T
    b_ref = np.maximum(1.0, 0.5 * n_all * mate)[ic]
    ctx_ref = b_ref * (w * c0).sum() / n_all
    rowoff = (np.arange(C) * N)[:, None]
    per_rep = np.stack([w, w * c0, w * K, Dn, E, Cd, K, cF - c0])
    for it in range(60):
        order = np.argsort(T, axis=1)
        flat = (order + rowoff).ravel()
        ws, wc0, wK, Dn_s, E_s, Cd_s, K_s, grow = per_rep[:, order]
        Ts, th_prev, own_s, wait_s = np.stack([T, tau_h, own + burst, wait]).reshape(4, -1)[:, flat].reshape(4, C, N)
        think = np.maximum(Ts / K_s - wait_s - own_s / K_s, 0.0)  # a turn's time outside the prefill queue
        ps = np.minimum(Dn_s * th_prev / Ts, 1.0)  # share of its life decoding (Little's law)
        prev = np.concatenate([np.zeros((C, 1)), Ts[:, :-1]], axis=1)
        dt, tmid = Ts - prev, (Ts + prev) / 2
        slope = grow / Ts  # context growth per second while alive
        # Sums over the alive (reverse cumulative sums in completion order), all in one pass.
        parts = np.stack([ws, ws * ps, wc0 * ps, ws * ps * slope, wc0, ws * slope, wK / Ts, ws * think])
        S_w, S_p, S_pc, S_ps, S_c0, S_sl, S_k, S_z = np.cumsum(parts[:, :, ::-1], axis=2)[:, :, ::-1]
        oth = np.maximum(S_w - 1, 0) / np.maximum(S_w, 1e-12)  # share of the alive that are others
        S_c, S_all = S_pc + S_ps * tmid, S_c0 + S_sl * tmid  # contexts decoding / held by all alive
        B = np.minimum(1 + S_p * oth * mate, engine.max_num_seqs)
        ctx, own_ctx = S_c * oth * mate, S_c / np.maximum(S_p, 1e-12)
        # KV beyond capacity: decoders wait (the batch shrinks by kv_slow, each advances kv_slow times
        # slower); idle sessions are evicted, so a share `evict` of turns recomputes / re-sends it all.
        kv_slow = np.maximum(1.0, (ctx + own_ctx) / cf.cap)
        demand = S_all * oth * mate + own_ctx
        evict = np.minimum(np.maximum(demand - cf.cap, 0.0) / np.maximum(demand - ctx - own_ctx, 1.0), 1.0)
        m_ctx = S_all / np.maximum(S_w, 1e-12)
        # Colocated, an evicted context is recomputed; disaggregated, the prefill worker that last
        # prefilled it still holds it (as the simulator's queued requests keep theirs), so it is re-sent.
        rec = np.where(dis, m_ctx * xfer, (cf.a_tok * m_ctx + cf.a_pair * m_ctx ** 2 / 2) / cf.flop_rate)
        tau_d, membound = _step(cf, B / kv_slow, ctx / kv_slow, parts=True)
        kappa = np.where((cf.sum > 0) | membound, cf.b_kv / cf.byte_rate, 0.0) + np.where(
            (cf.sum > 0) | ~membound, cf.a_pair / cf.flop_rate, 0.0)  # own context, per token per step
        nu = S_k * oth  # the others' turns per second
        stretch, d_mean = np.ones((C, N)), np.zeros((C, 1))
        if ic.size:  # colocated: the mates' chunks lengthen the mixed steps (at the event-weighted batch)
            d_e = _step(cc, b_ref, ctx_ref, ev_x, ev_a) - _step(cc, b_ref, ctx_ref)
            d_mean[ic] = (d_e * ev_w).sum(1, keepdims=True)
            stretch[ic] = 1 / (1 - np.minimum(nu[ic] * mate[ic] * (d_mean[ic] + evict[ic] * rec[ic]), 0.95))
            own[ic] = np.add.reduceat(d_e * ev_m, starts, axis=1)
        # The prefill queue (prefill workers, or a mixed worker's chunks) as a closed network: n
        # trajectories per server, each back after Z s of thinking, service s. Schweitzer's MVA gives
        # the residence R: R(Z + R) = s(Z + R) + s(n-1)R, light load R ~ s, saturation R ~ n·s - Z.
        n_q = np.where(dis, S_w / np.maximum(n_p, 1), 1 + S_w * oth * mate)
        s_q = np.where(dis, s1, d_mean + evict * rec)  # a mixed worker also recomputes evicted contexts
        z_q = S_z / np.maximum(S_w, 1e-12)
        b_q = z_q - n_q * s_q
        wq = np.maximum((np.sqrt(b_q ** 2 + 4 * s_q * z_q) - b_q) / 2 - s_q, 0.0)
        omega = np.where(dis, tau_d / 2, tau_d) + wq + evict * rec
        tau_e = tau_d * kv_slow * stretch
        I_inv, I_kap, I_om = np.cumsum(np.stack([dt / tau_e, kappa * stretch * dt, omega * dt]), axis=2)
        th_s = Ts / I_inv  # harmonic mean of the step time over each one's life
        new_s = E_s + own_s + Dn_s * th_s + (Cd_s * I_kap + K_s * I_om) / Ts
        new, tau_h, wait = np.empty(C * N), np.empty(C * N), np.empty(C * N)
        new[flat], tau_h[flat] = new_s.ravel(), th_s.ravel()
        wait[flat] = (K_s * np.cumsum(wq * dt, axis=1) / Ts).ravel()
        new, tau_h, wait = new.reshape(C, N), tau_h.reshape(C, N), wait.reshape(C, N) / np.maximum(K, 1)
        if ic.size:
            wt = (nu * dt)[ic]
            wsum = np.maximum(wt.sum(1, keepdims=True), 1e-12)
            b_ref, ctx_ref = (B[ic] * wt).sum(1, keepdims=True) / wsum, (ctx[ic] * wt).sum(1, keepdims=True) / wsum
        # Converged once every shape still in contention (within 1.2x of the best) has: far worse
        # shapes (a starved decode side can oscillate) need no more precision to lose.
        tmax = new.max(axis=1)
        done = np.max((np.abs(new - T) / T)[tmax <= 1.2 * tmax.min()]) < tol
        T = 0.3 * T + 0.7 * new
        if done:
            break
    # Worker-mate spread: m = N/n - 1 mates drawn at random. Linearised, mate j moves T_i by
    # p_j ∫ (∂τ/∂B)/τ² over their overlap, times Dn_i·τ_h²/T_i (harmonic mean). Mates are not fixed
    # for life, though: the router moves a session whose worker is clearly busier than a random other
    # (its slack), so only part of the spread survives; _REBALANCE (fitted once, over seeds) keeps half.
    half = 0.5 * own_ctx
    fp = (_step(cf, B / kv_slow + 0.5, (ctx + half) / kv_slow)
          - _step(cf, np.maximum(B / kv_slow - 0.5, 0.5), np.maximum(ctx - half, 0) / kv_slow)) * kv_slow * stretch
    G = np.cumsum(fp / tau_e ** 2 * dt, axis=1)
    y, y2 = ws * ps * G, ws * (ps * G) ** 2
    w_o = np.maximum(n_all - ws, 1e-9)
    below1, below2 = np.cumsum(np.stack([y, y2]), axis=2) - np.stack([y, y2])
    above1, above2 = np.cumsum(np.stack([ws * ps, ws * ps ** 2])[:, :, ::-1], axis=2)[:, :, ::-1] - np.stack(
        [ws * ps, ws * ps ** 2])
    e1, e2 = (below1 + G * above1) / w_o, (below2 + G ** 2 * above2) / w_o
    m = mate * (n_all - 1)
    var = np.maximum(e2 - e1 ** 2, 0.0) * m * np.clip((n_all - 1 - m) / max(n_all - 2, 1.0), 0.0, 1.0)
    sigma, om = np.empty(C * N), np.empty(C * N)
    sigma[flat], om[flat] = (_REBALANCE * Dn_s * th_s ** 2 / Ts * np.sqrt(var)).ravel(), I_om.ravel()
    return dict(T=T, sigma=sigma.reshape(C, N), iters=it + 1, concurrency=(B * dt).sum(1) / Ts[:, -1], tau_h=tau_h,
                own=own + burst, omega=om.reshape(C, N) / T, evict=(evict * dt).sum(1) / Ts[:, -1],
                segments=dict(end=Ts, B=B, ctx=ctx, step=tau_e, wait=wq, evict=evict))  # for inspection


# ------------------------------------------------------------------ entry points
def predict_many(shapes: Sequence[LayoutShape], perfs: Sequence[PerfModel], engine: EngineConfig,
                 stats: WorkloadStats | None, batch: BatchState, devices_per_node: int = 8,
                 max_reps: int = 512, reps: BatchReps | None = None, tol: float = 1e-4,
                 grid_points: int = 160) -> list[Prediction]:
    """`predict` for many shapes at once (vectorised over them): `perfs[i]` is shape i's worker model;
    `reps` (from `prepare`) skips rebuilding the batch's representatives; `grid_points` sets the
    resolution of the E[max] integral."""
    if len(shapes) != len(perfs) or not shapes:
        raise ValueError("predict_many needs one PerfModel per shape, and at least one shape")
    if reps is None:
        reps = prepare(stats, batch, max_reps)
    uniq = {id(pm): pm for pm in perfs}  # few distinct worker models (one per tp): stack each once
    pos = {k: i for i, k in enumerate(uniq)}
    cf = _Coeffs.stack([_Coeffs.of(pm) for pm in uniq.values()]).take(np.array([pos[id(pm)] for pm in perfs]))
    dis = np.array([s.mode is Mode.DISAGGREGATED for s in shapes])[:, None]
    n_dw = np.array([s.n_mixed + s.n_decode for s in shapes], float)[:, None]
    n_p = np.array([s.n_prefill for s in shapes], float)[:, None]
    if (n_dw < 1).any() or (dis & (n_p < 1)).any():
        raise ValueError("every shape needs a decode-capable worker (and a prefill worker if disaggregated)")
    p_same = np.array([_same_node_share(s, devices_per_node) for s in shapes])[:, None]
    r = _solve(cf, n_dw, n_p, dis, p_same, engine, reps, tol)
    T = r["T"]
    comp = _expected_max(T, r["sigma"], reps, grid_points)
    gen = float((reps.w * (reps.work["Dn"] + reps.work["K"])).sum())
    out = []
    for i, s in enumerate(shapes):
        j = int(np.argmin(np.abs(T[i] - comp[i])))  # the critical trajectory: the one ending nearest
        terms = dict(env=float(reps.work["E"][j]), decode=float(reps.work["Dn"][j] * r["tau_h"][i, j]),
                     prefill=float(r["own"][i, j] + reps.work["K"][j] * r["omega"][i, j]))
        terms["decode"] += max(T[i, j] - sum(terms.values()), 0.0)  # own-context reads ride with decode
        out.append(Prediction(float(comp[i]), gen / float(comp[i]), float(r["concurrency"][i]),
                              max(terms, key=terms.get),
                              dict(critical_path=terms, critical_T=float(T[i, j]), spread_s=float(r["sigma"][i, j]),
                                   evicted_share=float(r["evict"][i]), iterations=r["iters"])))
    return out


def predict(shape: LayoutShape, perf: PerfModel, engine: EngineConfig, stats: WorkloadStats,
            batch: BatchState, devices_per_node: int = 8, max_reps: int = 512) -> Prediction:
    """Predicted completion of `batch` under `shape`, workers modelled by `perf` (module docstring)."""
    return predict_many([shape], [perf], engine, stats, batch, devices_per_node, max_reps)[0]


@lru_cache(maxsize=8192)
def _same_node_share(shape: LayoutShape, devices_per_node: int) -> float:
    """Share of (prefill, decode) worker pairs on one node, workers placed in device order, prefill first."""
    if shape.mode is not Mode.DISAGGREGATED:
        return 1.0
    per = max(devices_per_node // shape.tp, 1)
    nodes = np.arange(-(-shape.n_workers // per))
    pre = np.clip(shape.n_prefill - nodes * per, 0, per)
    dec = np.clip(shape.n_workers - nodes * per, 0, per) - pre
    return float((pre * dec).sum() / (shape.n_prefill * shape.n_decode))


def _expected_max(T: np.ndarray, sigma: np.ndarray, reps: BatchReps, points: int = 160) -> np.ndarray:
    """Per row, E[max] with T_i ~ N(T_i, σ_i): P(max ≤ t) = Π_known Φ((t−T_i)/σ_i) · Π_c F_c(t)^n_c,
    F_c the class's mixture; integrated on a grid from where it leaves zero (below that, a class's
    reps count as finished)."""
    rows, known = np.arange(T.shape[0]), reps.label < 0
    lo = T[:, known].max(axis=1) if known.any() else np.full(T.shape[0], np.inf)
    classes = []
    for c, n in reps.sizes.items():
        sel = np.nonzero(reps.label == c)[0]
        order = np.argsort(T[:, sel], axis=1)
        ts = np.take_along_axis(T[:, sel], order, axis=1)
        F = np.cumsum(reps.q[sel][order], axis=1)
        lo = np.minimum(lo, ts[rows, np.argmax(F ** n > 1e-4, axis=1)])  # where F^n leaves zero
        classes.append((sel, order, ts, n))
    lo = np.maximum(lo - 5 * sigma.max(axis=1), 0.0)
    cols, lows = [np.broadcast_to(np.nonzero(known)[0], (T.shape[0], int(known.sum())))], []
    for sel, order, ts, n in classes:
        k = max(int((ts >= lo[:, None]).sum(axis=1).max()), 1)  # the reps that can still be running
        keep = sel[order[:, -k:]]
        cols.append(keep)
        lows.append((n, 1.0 - reps.q[keep].sum(axis=1), k))
    idx = np.concatenate(cols, axis=1)
    Tk, sk = np.take_along_axis(T, idx, axis=1), np.take_along_axis(sigma, idx, axis=1)
    grid = lo[:, None] + (np.max(Tk + 6 * sk, axis=1) - lo)[:, None] * np.linspace(0.0, 1.0, points)[None, :]
    z = (grid[:, :, None] - Tk[:, None, :]) / np.maximum(sk[:, None, :], 1e-12)
    phi = np.where(sk[:, None, :] > 0, ndtr(z), (z >= 0).astype(float))
    at = int(known.sum())
    log_g = np.log(np.maximum(phi[:, :, :at], 1e-300)).sum(axis=2)
    for n, below, k in lows:
        mix = below[:, None] + (phi[:, :, at:at + k] * reps.q[idx[:, at:at + k]][:, None, :]).sum(axis=2)
        log_g += n * np.log(np.clip(mix, 1e-300, 1.0))
        at += k
    return lo + np.trapezoid(1.0 - np.exp(log_g), grid, axis=1)
