"""Batch-completion predictor: when will the rollout batch in flight be finished under a layout shape?

Job: from the performance model (roofline step times), the engine limits, the workload's statistics and
the batch's progress, predict the completion time of the whole batch for one candidate `LayoutShape`,
analytically (no event simulation) and cheaply enough to rank thousands of shapes per decision.

The model (DESIGN.md §3.2). The batch is a set of trajectories, each a sequence of turns (prefill the
new tokens, decode the response, wait on the environment). They are either known (lengths given) or
representative samples of the workload, each standing for a share of the batch. Trajectory i's time is

    T_i = env_i + own prefill_i + transfers_i + Σ_its decode steps τ(t) + κ(t)·own context + turns·ω(t)

where τ(t), κ(t), ω(t) are the per-token decode step, the per-context-token cost of its own KV reads and
the per-turn waits on its worker at time t. They depend on who is still running, so the batch is cut into
segments at the trajectories' completion times (sorted): in a segment the alive set is fixed and

- decode concurrency per decode-capable worker (Little's law): B = 1 + Σ_{others alive} p_j / n_workers,
  p_j = the fraction of j's life spent decoding (a trajectory waiting on its environment holds KV but is
  not in the batch); a fixed point, since p_j depends on τ which depends on B;
- colocated: others' prefill chunks ride in mixed steps and lengthen them by Δ (the step's compute
  beyond the decode step's memory time), so decode steps stretch by 1 / (1 − ν·Δ), ν = prefills per s;
- disaggregated: prefill workers are an M/G/1 queue (Pollaczek–Khinchine wait) of per-turn prefill
  steps; every turn fetches the response's KV from the decode worker and hands the new KV back
  (`kv_transfer_time`, same-node share from the device order);
- KV capacity: all alive sessions hold KV; demand beyond capacity evicts idle sessions (their next
  turn recomputes the whole context) and, beyond that, caps the decode batch (recompute preemption);
- the tail: late segments have few alive trajectories, so the longest ones finish at low concurrency.

Each trajectory's decode steps are spread evenly over its life, so it sees the time-average of τ over
[0, T_i]. Completion is the max over known trajectories, and for sampled ones the expected maximum over
the batch: ∫ (1 − Π_classes F_c(t)^n_c) dt, with F_c a class's weighted distribution of T. Completion is
never below the slowest trajectory's critical path at concurrency one.

What it must not do: simulate events, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from scipy.special import ndtr

from pearl.config import EngineConfig
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode
from pearl.workloads import TrajectorySpec, Workload

__all__ = ["BatchState", "Prediction", "TrajectoryProgress", "WorkloadStats", "predict", "predict_many"]

_ITERS, _TOL = 40, 1e-4
import os
_MODE = os.environ.get("PM", "h")


# ------------------------------------------------------------------ workload statistics
@dataclass(frozen=True, eq=False)
class WorkloadStats:
    """Per-turn samples of M trajectories as padded matrices (0 past a trajectory's last turn):
    prompt (M,), responses / observations / env_latency (M, K). observations[k] follows turn k."""

    prompt: np.ndarray
    responses: np.ndarray
    observations: np.ndarray
    env_latency: np.ndarray
    turns: np.ndarray

    @staticmethod
    def from_samples(specs: Iterable[TrajectorySpec], prior: "WorkloadStats | None" = None,
                     prior_weight: int = 0) -> "WorkloadStats":
        """Fit from observed trajectories (an online refit), optionally blended with `prior_weight`
        trajectories of a prior (say `from_workload`), which guards a refit against the survivor bias
        of early, short finishers."""
        specs = list(specs)
        if prior is not None and prior_weight > 0:
            idx = np.linspace(0, prior.size - 1, min(prior_weight, prior.size)).astype(int)
            specs += [prior.spec(int(i)) for i in idx]
        if not specs:
            raise ValueError("WorkloadStats.from_samples needs at least one trajectory")
        m, k = len(specs), max(s.turns for s in specs)
        mats = [np.zeros((m, k)) for _ in range(3)]
        for i, s in enumerate(specs):
            mats[0][i, :s.turns] = s.responses
            mats[1][i, :len(s.observations)] = s.observations
            mats[2][i, :len(s.env_latency)] = s.env_latency
        return WorkloadStats(np.array([s.prompt_tokens for s in specs], float), *mats,
                             np.array([s.turns for s in specs]))

    @staticmethod
    def from_workload(workload: Workload, samples: int = 2048, seed: int = 987_654) -> "WorkloadStats":
        """Sample the profile's distributions (on a seed of their own: never the batch's trajectories)."""
        w = copy.copy(workload)
        w.seed = seed
        return WorkloadStats.from_samples(w.trajectory(i, i) for i in range(samples))

    @property
    def size(self) -> int:
        return len(self.prompt)

    def spec(self, i: int) -> TrajectorySpec:
        k = int(self.turns[i])
        return TrajectorySpec(i, i, int(self.prompt[i]), tuple(int(x) for x in self.responses[i, :k]),
                              tuple(int(x) for x in self.observations[i, :k - 1]),
                              tuple(float(x) for x in self.env_latency[i, :k]))

    def _values(self, name: str) -> np.ndarray:
        mask = np.arange(self.responses.shape[1]) < self.turns[:, None]
        per_turn = {"response_tokens": self.responses, "env_latency_s": self.env_latency,
                    "observation_tokens": self.observations}
        if name == "turns":
            return self.turns.astype(float)
        if name == "prompt_tokens":
            return self.prompt
        if name == "observation_tokens":
            mask = np.arange(self.responses.shape[1]) < self.turns[:, None] - 1
        return per_turn[name][mask]

    def mean(self, name: str) -> float:
        """Mean of turns, prompt_tokens, response_tokens, observation_tokens or env_latency_s."""
        v = self._values(name)
        return float(v.mean()) if v.size else 0.0

    def quantile(self, name: str, q: float) -> float:
        v = self._values(name)
        return float(np.quantile(v, q)) if v.size else 0.0


# ------------------------------------------------------------------ batch state
@dataclass(frozen=True)
class TrajectoryProgress:
    """One trajectory in flight: turns finished, context after the last finished response, and, when
    known (replays, benchmarks), its spec (the turns from `turns_done` on are what is left)."""

    turns_done: int = 0
    context: int = 0
    spec: TrajectorySpec | None = None


@dataclass(frozen=True)
class BatchState:
    """What is left of the batch: `n_fresh` trajectories not started (lengths unknown) plus those
    in flight."""

    n_fresh: int = 0
    trajectories: tuple[TrajectoryProgress, ...] = ()

    @staticmethod
    def fresh(n: int) -> "BatchState":
        return BatchState(n_fresh=n)

    @staticmethod
    def from_specs(specs: Iterable[TrajectorySpec]) -> "BatchState":
        return BatchState(trajectories=tuple(TrajectoryProgress(spec=s) for s in specs))

    @property
    def size(self) -> int:
        return self.n_fresh + len(self.trajectories)


@dataclass(frozen=True)
class Prediction:
    completion_s: float
    tokens_per_s: float  # generated tokens per second over the batch
    decode_concurrency: float  # time-averaged decode batch per decode-capable worker
    bottleneck: str  # the largest term of the critical trajectory: decode, env, prefill, transfer, kv
    breakdown: dict = field(default_factory=dict)


# ------------------------------------------------------------------ trajectories -> work
def _work(st: WorkloadStats, rows: np.ndarray, start: np.ndarray, ctx: np.ndarray | None) -> dict:
    """Remaining work of trajectories `rows` of `st` from turn `start` on (context `ctx` if given)."""
    resp, obs, env = st.responses[rows], st.observations[rows], st.env_latency[rows]
    turns, prompt = st.turns[rows], st.prompt[rows]
    k = np.arange(resp.shape[1])
    mask = (k >= start[:, None]) & (k < turns[:, None])
    prev = np.concatenate([np.zeros((len(rows), 1)), resp[:, :-1] + obs[:, :-1]], axis=1)
    c = prompt[:, None] + np.cumsum(prev, axis=1)  # context at the start of turn k, new tokens included
    x = np.concatenate([prompt[:, None], obs[:, :-1] + 1], axis=1)  # tokens to prefill in turn k
    if ctx is not None:  # re-anchor on the observed context (obs of the last finished turn still to come)
        s = np.minimum(start, resp.shape[1] - 1)
        ci = np.take_along_axis(c, s[:, None], 1)[:, 0]
        shift = np.where(start > 0, ctx + np.take_along_axis(obs, np.maximum(s - 1, 0)[:, None], 1)[:, 0] - ci, 0)
        c = c + shift[:, None]
    d = np.maximum(resp - 1, 0)  # the first token of a turn is sampled by its prefill
    fetch = np.concatenate([np.zeros((len(rows), 1)), resp[:, :-1]], axis=1)  # response KV to fetch back
    first = np.argmax(mask, axis=1)
    last = np.clip(turns - 1, 0, resp.shape[1] - 1)
    ri, ki = np.nonzero(mask)
    return dict(
        K=mask.sum(1).astype(float), Dn=(d * mask).sum(1), E=(env * mask).sum(1),
        Cd=((d * c + d * (d + 1) / 2) * mask).sum(1), X=(x * mask).sum(1), F=(fetch * mask).sum(1),
        c0=np.take_along_axis(c, first[:, None], 1)[:, 0],
        cF=np.take_along_axis(c + resp, last[:, None], 1)[:, 0],
        fresh=(start == 0).astype(float), prompt=np.where(start == 0, prompt, 0.0),
        ev_row=ri, ev_x=x[ri, ki], ev_attn=x[ri, ki] * (c[ri, ki] - x[ri, ki] / 2))


# ------------------------------------------------------------------ vectorised roofline
class _Coeffs:
    """`PerfModel.step_time` as linear coefficients (probed through its public methods, and checked),
    so that step times of many candidates and batch sizes are a few numpy operations."""

    _cache: dict[int, tuple[PerfModel, "_Coeffs"]] = {}

    NAMES = ("flop_rate", "byte_rate", "ovh", "sum", "a_tok", "a_pair", "a_lm", "b_static", "b_tok",
             "b_kv", "b_exp", "n_exp", "log_miss", "ar_tok", "ar_fixed", "cap", "xfer_same", "xfer_net",
             "setup")

    @classmethod
    def of(cls, pm: PerfModel) -> "_Coeffs":
        hit = cls._cache.get(id(pm))
        if hit is None or hit[0] is not pm:
            if len(cls._cache) > 256:
                cls._cache.clear()
            hit = cls._cache[id(pm)] = (pm, cls(pm))
        return hit[1]

    def __init__(self, pm: PerfModel):
        c, hw, m = pm.coeffs, pm.hw, pm.model
        self.flop_rate, self.byte_rate = pm.tp * hw.peak_flops * c.mfu, pm.tp * hw.hbm_bw * c.bw_eff
        self.ovh, self.sum = c.step_overhead_s, float(c.combine == "sum")
        w = pm.step_work
        f1, f2 = w(0, 0, 1, 0.0)[0], w(0, 0, 2, 0.0)[0]
        self.a_tok, self.a_lm = f2 - f1, 2 * f1 - f2
        self.a_pair = w(1, 1)[0] - w(1, 0)[0]
        self.b_kv = w(1, 1)[1] - w(1, 0)[1]
        self.n_exp = float(m.num_experts) if m.is_moe else 0.0
        self.log_miss = float(np.log1p(-m.experts_per_token / m.num_experts)) if m.is_moe else 0.0
        ns = (1, 2, 3)
        a = np.array([[1.0, n, pm.experts_touched(n)] for n in ns])
        b = np.array([w(n, 0)[1] for n in ns])
        sol = np.linalg.lstsq(a if self.n_exp else a[:, :2], b, rcond=None)[0]
        self.b_static, self.b_tok = sol[0], sol[1]
        self.b_exp = sol[2] if self.n_exp else 0.0  # bytes per expert touched
        self.ar_tok = w(2, 0)[2] - w(1, 0)[2]
        self.ar_fixed = w(1, 0)[2] - self.ar_tok
        self.cap = float(pm.kv_capacity_tokens())
        self.xfer_same = pm.kv_bytes_per_token / (hw.nvlink_bw * pm.tp)
        self.xfer_net = pm.kv_bytes_per_token / (hw.net_bw * pm.tp)
        self.setup = c.kv_setup_s
        for args in ((7, 9000, 0, 0.0), (3, 500, 700, 7e5), (0, 0, 4000, 9e6), (40, 2e5, 300, 4e5)):
            want, got = pm.step_time(*args), float(_step(self, *args))
            if abs(got - want) > 1e-9 + 1e-6 * want:
                raise RuntimeError(f"predictor's step-time coefficients disagree with {pm}: {got} vs {want}")

    @staticmethod
    def stack(cs: Sequence["_Coeffs"]) -> "_Coeffs":
        out = object.__new__(_Coeffs)
        for n in _Coeffs.NAMES:
            setattr(out, n, np.array([getattr(c, n) for c in cs], float)[:, None])
        return out


def _step(c, B, ctx, P=0.0, A=0.0, parts: bool = False):
    """Vectorised `PerfModel.step_time` (B may be fractional: a mean batch); with `parts`, also
    whether the step is memory-bound."""
    B, ctx, P, A = (np.asarray(v, float) for v in (B, ctx, P, A))
    tokens = B + P
    flops = c.a_tok * tokens + c.a_pair * (ctx + A) + c.a_lm * (B + (P > 0))
    pkv = np.where(P > 0, A / np.maximum(P, 1.0) + P / 2, 0.0)
    nbytes = (c.b_static + c.b_tok * tokens + c.b_kv * (ctx + pkv)
              + c.b_exp * c.n_exp * -np.expm1(tokens * c.log_miss))
    tc, tm = flops / c.flop_rate, nbytes / c.byte_rate
    comm = c.ar_tok * tokens + c.ar_fixed  # both 0 at tp 1
    t = np.where(tokens > 0, c.ovh + np.where(c.sum > 0, tc + tm, np.maximum(tc, tm)) + comm, 0.0)
    return (t, tm >= tc) if parts else t


# ------------------------------------------------------------------ the batch as representatives
def _representatives(stats: WorkloadStats, batch: BatchState, max_reps: int) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray]:
    """Work of the representatives, their population weight w, class label (-1: known) and the
    probability mass q of each within its class; also the class sizes n_c."""
    parts: list[tuple[dict, np.ndarray, int, np.ndarray]] = []
    known = [t for t in batch.trajectories if t.spec is not None and t.turns_done < t.spec.turns]
    if known:
        ks = WorkloadStats.from_samples(t.spec for t in known)
        wk = _work(ks, np.arange(len(known)), np.array([t.turns_done for t in known]),
                   np.array([float(t.context) for t in known]))
        parts.append((wk, np.ones(len(known)), -1, np.ones(len(known))))
    groups: dict[int, list[TrajectoryProgress]] = {}
    for t in batch.trajectories:
        if t.spec is None:
            groups.setdefault(t.turns_done, []).append(t)
    if batch.n_fresh:
        groups.setdefault(-1, [])
    for label, (done, members) in enumerate(sorted(groups.items())):
        d = max(done, 0)
        rows = np.nonzero(stats.turns > d)[0]
        if rows.size == 0:  # longer than every sample: assume one more turn like the longest ones
            rows = np.nonzero(stats.turns == stats.turns.max())[0]
            d = int(stats.turns.max()) - 1
        rows, q = _thin(stats, rows, max_reps)
        n = batch.n_fresh if done < 0 else len(members)
        ctx = None if done < 0 else np.full(rows.size, float(np.mean([t.context for t in members])))
        wk = _work(stats, rows, np.full(rows.size, d), ctx)
        parts.append((wk, n * q, label, q))
    if not parts:
        raise ValueError("the batch is empty: nothing to predict")
    work = {k: np.concatenate([p[0][k] for p in parts]) for k in parts[0][0] if not k.startswith("ev_")}
    offs = np.cumsum([0] + [len(p[1]) for p in parts])
    for k in ("ev_x", "ev_attn"):
        work[k] = np.concatenate([p[0][k] for p in parts])
    work["ev_row"] = np.concatenate([p[0]["ev_row"] + o for p, o in zip(parts, offs)])
    w = np.concatenate([p[1] for p in parts])
    label = np.concatenate([np.full(len(p[1]), p[2]) for p in parts])
    q = np.concatenate([p[3] for p in parts])
    return work, w, label, q


def _thin(stats: WorkloadStats, rows: np.ndarray, max_reps: int) -> tuple[np.ndarray, np.ndarray]:
    """At most `max_reps` rows with probability masses: the heaviest quarter (by a rough critical
    path) kept one by one, since they decide the batch's end; the rest thinned evenly."""
    if rows.size <= max_reps:
        return rows, np.full(rows.size, 1.0 / rows.size)
    mask = np.arange(stats.responses.shape[1]) < stats.turns[rows, None]
    score = stats.env_latency[rows].sum(1) + 0.01 * (stats.responses[rows] * mask).sum(1)
    order = rows[np.argsort(score)]
    top = max_reps // 4
    bulk, head = order[:-top], order[-top:]
    pick = np.linspace(0, bulk.size - 1, max_reps - top).round().astype(int)
    edges = np.concatenate([[0], (pick[1:] + pick[:-1]) // 2 + 1, [bulk.size]])
    q = np.concatenate([np.diff(edges), np.ones(top)]) / rows.size
    return np.concatenate([bulk[pick], head]), q


# ------------------------------------------------------------------ the fixed point
def _solve(cf, n_dw, n_p, dis, p_same, engine: EngineConfig, work: dict, w: np.ndarray) -> dict:
    """Completion time of every representative under every candidate (rows): see the module docstring."""
    K, Dn, E, Cd, X, F = (work[k] for k in ("K", "Dn", "E", "Cd", "X", "F"))
    c0, cF, fresh, prompt = work["c0"], work["cF"], work["fresh"], work["prompt"]
    ev_row, ev_x, ev_attn = work["ev_row"], work["ev_x"], work["ev_attn"]
    ev_w = w[ev_row] / w[ev_row].sum()
    starts = np.searchsorted(ev_row, np.arange(len(w)))
    col = ~dis
    # Disaggregated: prefill-worker service per turn, the M/G/1 moments, the KV hand-offs.
    s_e = _step(cf, 0.0, 0.0, ev_x, ev_attn)
    s1, s2 = (s_e * ev_w).sum(1, keepdims=True), (s_e ** 2 * ev_w).sum(1, keepdims=True)
    xfer = p_same * cf.xfer_same + (1 - p_same) * cf.xfer_net
    own_dis = np.add.reduceat(s_e, starts, axis=1) + (2 * K - fresh) * cf.setup + (X + F) * xfer
    # The first turn's prompts all arrive at t=0: on average a trajectory waits for half of its
    # worker's other prompts (chunked together, so compute-bound).
    n_front = np.where(dis, n_p, n_dw)
    wf = (w * fresh).sum()
    p_time = (cf.a_tok * prompt + cf.a_pair * prompt ** 2 / 2) / cf.flop_rate
    p_mean = (p_time * w * fresh).sum(1, keepdims=True) / max(wf, 1e-9)
    burst = 0.5 * np.maximum(wf / n_front - 1, 0) * p_mean * fresh
    ctx_mean = Cd / np.maximum(Dn, 1)
    tau1 = _step(cf, 1.0, ctx_mean)
    T = E + Dn * tau1 + np.where(dis, own_dis, K * tau1) + burst
    tau_bar = tau1 + 0 * T
    b_ref = np.maximum(1.0, 0.5 * w.sum() / n_dw)
    ctx_ref = b_ref * (w * ctx_mean).sum() / w.sum()
    rc = lambda a: np.cumsum(a[:, ::-1], axis=1)[:, ::-1]  # noqa: E731  (sum over the alive)
    # Trajectories are spread evenly over the decode-capable workers and stay there (session
    # affinity): of the N-1 others, N/n - 1 share a trajectory's worker.
    n_all = w.sum()
    mate = np.clip((n_all / n_dw - 1) / max(n_all - 1, 1e-9), 0.0, 1.0)
    for it in range(_ITERS):
        p = np.clip(Dn * tau_bar / T, 0.0, 1.0)
        order = np.argsort(T, axis=1)
        g = lambda a: np.take_along_axis(np.broadcast_to(a, T.shape), order, axis=1)  # noqa: E731
        Ts, ws, ps = g(T), g(w), g(p)
        S_w = rc(ws)
        oth = np.maximum(S_w - 1, 0) / np.maximum(S_w, 1e-12)  # share of the alive that are others
        S_p = rc(ws * ps)
        prev = np.concatenate([np.zeros((T.shape[0], 1)), Ts[:, :-1]], axis=1)
        dt, tmid = Ts - prev, (Ts + prev) / 2
        slope = g((cF - c0) / T)  # context growth per second while alive
        S_c = rc(ws * ps * g(c0)) + rc(ws * ps * slope) * tmid  # contexts of those wanting to decode
        S_all = rc(ws * g(c0)) + rc(ws * slope) * tmid  # every alive session holds its KV
        B = np.minimum(1 + S_p * oth * mate, engine.max_num_seqs)
        ctx = S_c * oth * mate
        own_ctx = S_c / np.maximum(S_p, 1e-12)
        # KV: sessions wanting to decode beyond capacity wait (or are preempted): the batch shrinks
        # by kv_slow and each of them advances kv_slow times slower; idle sessions beyond capacity
        # are evicted, so a share `evict` of the turns starts by recomputing (colocated) or
        # re-sending (disaggregated) the whole context.
        kv_slow = np.maximum(1.0, (ctx + own_ctx) / cf.cap)
        demand = S_all * oth * mate + own_ctx
        evict = np.clip((demand - cf.cap) / np.maximum(demand - ctx - own_ctx, 1.0), 0.0, 1.0)
        m_ctx = S_all / np.maximum(S_w, 1e-12)
        rec = np.where(dis, m_ctx * xfer, (cf.a_tok * m_ctx + cf.a_pair * m_ctx ** 2 / 2) / cf.flop_rate)
        tau_d, membound = _step(cf, B / kv_slow, ctx / kv_slow, parts=True)
        kappa = np.where(cf.sum > 0, cf.b_kv / cf.byte_rate + cf.a_pair / cf.flop_rate,
                         np.where(membound, cf.b_kv / cf.byte_rate, cf.a_pair / cf.flop_rate))
        nu = rc(ws * g(K) / Ts) * oth  # others' turns (so prefills) per second, all workers
        # Colocated: others' chunks lengthen the mixed steps (measured at the event-weighted batch).
        d_e = _step(cf, b_ref, ctx_ref, ev_x, ev_attn) - _step(cf, b_ref, ctx_ref)
        d_mean = (d_e * ev_w).sum(1, keepdims=True)
        stretch = np.where(col, 1 / (1 - np.minimum(nu * mate * (d_mean + evict * rec), 0.9)), 1.0)
        own = np.where(dis, own_dis, np.add.reduceat(d_e, starts, axis=1)) + burst
        # Disaggregated: M/G/1 wait at the prefill workers, half a decode step to join the batch.
        lam = nu / np.maximum(n_p, 1)
        rho = np.minimum(lam * s1, 0.95)
        omega = np.where(dis, lam * s2 / (2 * (1 - rho)) + tau_d / 2, tau_d) + evict * rec
        I_inv = np.cumsum(dt / (tau_d * kv_slow * stretch), axis=1)
        I_ar = np.cumsum(dt * (tau_d * kv_slow * stretch), axis=1)
        I_kap = np.cumsum(kappa * stretch * dt, axis=1)
        I_om = np.cumsum(omega * dt, axis=1)
        # A trajectory decodes a steady share of its time, so its tokens see the harmonic mean of τ.
        tau_h = Ts / I_inv if _MODE == "h" else I_ar / Ts
        new_s = g(E) + g(own) + g(Dn) * tau_h + (g(Cd) * I_kap + g(K) * I_om) / Ts
        new = np.empty_like(T)
        np.put_along_axis(new, order, new_s, axis=1)
        np.put_along_axis(tau_bar, order, tau_h, axis=1)
        wt = nu * dt
        b_ref = (B * wt).sum(1, keepdims=True) / np.maximum(wt.sum(1, keepdims=True), 1e-12)
        ctx_ref = (ctx * wt).sum(1, keepdims=True) / np.maximum(wt.sum(1, keepdims=True), 1e-12)
        done = np.max(np.abs(new - T) / T) < _TOL
        T = 0.5 * T + 0.5 * new
        if done:
            break
    # Worker-mate variance: a trajectory's m = N/n - 1 mates are a random draw, fixed for its life.
    # Linearised, mate j moves its decode time by p_j ∫ (∂τ/∂B)/τ² over their overlap (harmonic mean),
    # so T_i gets a spread σ_i; the batch's end is the max of spread-out T_i (see _expected_max).
    tau_e = tau_d * kv_slow * stretch
    half = 0.5 * own_ctx
    fp = (_step(cf, B / kv_slow + 0.5, (ctx + half) / kv_slow)
          - _step(cf, np.maximum(B / kv_slow - 0.5, 0.5), np.maximum(ctx - half, 0) / kv_slow)) * kv_slow * stretch
    G = np.cumsum(fp / tau_e ** 2 * dt, axis=1)
    y = ws * ps * G
    y2 = y * ps * G  # w (p G)^2
    below1, below2 = np.cumsum(y, axis=1) - y, np.cumsum(y2, axis=1) - y2
    above1, above2 = rc(ws * ps) - ws * ps, rc(ws * ps ** 2) - ws * ps ** 2
    w_o = np.maximum(n_all - ws, 1e-9)
    e1, e2 = (below1 + G * above1) / w_o, (below2 + G ** 2 * above2) / w_o
    m = mate * (n_all - 1)
    var = np.maximum(e2 - e1 ** 2, 0.0) * m * np.clip((n_all - 1 - m) / max(n_all - 2, 1.0), 0.0, 1.0)
    sig_s = g(Dn) * (Ts / I_inv) ** 2 / Ts * np.sqrt(var)
    sigma = np.empty_like(T)
    np.put_along_axis(sigma, order, sig_s, axis=1)
    conc = (B * dt).sum(1) / Ts[:, -1]
    inv = np.argsort(order, axis=1)
    return dict(T=T, sigma=sigma, iters=it + 1, concurrency=conc, B=B, Ts=Ts, S_w=S_w, ctx=ctx, tau_d=tau_d,
                kv_slow=kv_slow, evict=evict, stretch=stretch, tau_bar=tau_bar, own=own, E=E, Dn=Dn, K=K,
                omega=np.take_along_axis(I_om, inv, axis=1) / T)


# ------------------------------------------------------------------ entry points
def _same_node_share(shape: LayoutShape, devices_per_node: int) -> float:
    """Share of (prefill, decode) worker pairs on one node, workers placed in device order, prefill first."""
    if shape.mode is not Mode.DISAGGREGATED:
        return 1.0
    per = max(devices_per_node // shape.tp, 1)
    nodes = np.arange(-(-shape.n_workers // per))
    pre = np.clip(shape.n_prefill - nodes * per, 0, per)
    dec = np.clip(shape.n_workers - nodes * per, 0, per) - pre
    return float((pre * dec).sum() / (shape.n_prefill * shape.n_decode))


def predict_many(shapes: Sequence[LayoutShape], perfs: Sequence[PerfModel], engine: EngineConfig,
                 stats: WorkloadStats, batch: BatchState, devices_per_node: int = 8,
                 max_reps: int = 512) -> list[Prediction]:
    """`predict` for many shapes at once (vectorised over them); `perfs[i]` is shape i's worker model."""
    if len(shapes) != len(perfs) or not shapes:
        raise ValueError("predict_many needs one PerfModel per shape, and at least one shape")
    work, w, label, q = _representatives(stats, batch, max_reps)
    cf = _Coeffs.stack([_Coeffs.of(pm) for pm in perfs])
    dis = np.array([s.mode is Mode.DISAGGREGATED for s in shapes])[:, None]
    n_dw = np.array([s.n_mixed + s.n_decode for s in shapes], float)[:, None]
    n_p = np.array([s.n_prefill for s in shapes], float)[:, None]
    if (n_dw < 1).any() or (dis & (n_p < 1)).any():
        raise ValueError(f"every shape needs a decode-capable worker (and a prefill worker if disaggregated)")
    p_same = np.array([_same_node_share(s, devices_per_node) for s in shapes])[:, None]
    r = _solve(cf, n_dw, n_p, dis, p_same, engine, work, w)
    T = r["T"]
    comp = _expected_max(T, r["sigma"], label, q, batch)
    # The critical trajectory: the known one that ends last, else the sampled one nearest the expected end.
    crit = np.argmin(np.abs(T - comp[:, None]) + 1e9 * (T > comp[:, None] * 1.0001), axis=1)
    gen = float((w * (work["Dn"] + work["K"])).sum())
    out = []
    for i, s in enumerate(shapes):
        j = crit[i]
        Ti = T[i, j]
        terms = dict(env=float(r["E"][j]), decode=float(r["Dn"][j] * r["tau_bar"][i, j]),
                     prefill=float(r["own"][i, j] + r["K"][j] * r["omega"][i, j]))
        other = max(Ti - sum(terms.values()), 0.0)
        terms["decode"] += other  # own-context reads ride with the decode steps
        bott = max(terms, key=terms.get)
        out.append(Prediction(float(comp[i]), gen / float(comp[i]), float(r["concurrency"][i]), bott,
                              dict(critical_path=terms, critical_T=float(Ti), iterations=r["iters"],
                                   same_node=float(p_same[i, 0]))))
    return out


def predict(shape: LayoutShape, perf: PerfModel, engine: EngineConfig, stats: WorkloadStats,
            batch: BatchState, devices_per_node: int = 8, max_reps: int = 512) -> Prediction:
    """Predicted completion of `batch` under `shape` (workers of `perf`); see the module docstring."""
    return predict_many([shape], [perf], engine, stats, batch, devices_per_node, max_reps)[0]


def _expected_max(T: np.ndarray, sigma: np.ndarray, label: np.ndarray, q: np.ndarray, batch: BatchState,
                  points: int = 192) -> np.ndarray:
    """Per row: E[max] over the batch, with trajectory i's time ~ Normal(T_i, σ_i): known ones as they
    are, and each sampled class as n_c i.i.d. draws from its weighted mixture. P(max ≤ t) is
    Π_known Φ((t-T_i)/σ_i) · Π_c F_c(t)^n_c, integrated on a grid over where it rises."""
    known = label < 0
    sizes = _class_sizes(batch)
    rows = np.arange(T.shape[0])
    # Where P(max <= t) starts to rise, without the spread: the known max, or the class quantiles
    # at which F^n_c leaves zero.
    lo = T[:, known].max(axis=1) if known.any() else np.full(T.shape[0], np.inf)
    for c, n in sizes.items():
        sel = label == c
        order = np.argsort(T[:, sel], axis=1)
        F = np.cumsum(q[sel][order], axis=1)
        k = np.argmax(F ** n > 1e-4, axis=1)
        lo = np.minimum(lo, np.take_along_axis(T[:, sel], order, axis=1)[rows, k])
    smax = sigma.max(axis=1)
    lo = np.maximum(lo - 5 * smax, 0.0)
    hi = np.max(T + 6 * sigma, axis=1)
    grid = lo[:, None] + (hi - lo)[:, None] * np.linspace(0.0, 1.0, points)[None, :]
    z = (grid[:, :, None] - T[:, None, :]) / np.maximum(sigma[:, None, :], 1e-12)
    phi = np.where(sigma[:, None, :] > 0, ndtr(z), (z >= 0).astype(float))
    log_g = np.zeros(grid.shape)
    if known.any():
        log_g += np.log(np.clip(phi[:, :, known], 1e-300, 1.0)).sum(axis=2)
    for c, n in sizes.items():
        sel = label == c
        log_g += n * np.log(np.clip((phi[:, :, sel] * q[sel]).sum(axis=2), 1e-300, 1.0))
    return lo + np.trapezoid(1.0 - np.exp(log_g), grid, axis=1)


def _class_sizes(batch: BatchState) -> dict[int, int]:
    groups: dict[int, int] = {}
    for t in batch.trajectories:
        if t.spec is None:
            groups[t.turns_done] = groups.get(t.turns_done, 0) + 1
    if batch.n_fresh:
        groups[-1] = batch.n_fresh
    return {i: n for i, (_, n) in enumerate(sorted(groups.items()))}
