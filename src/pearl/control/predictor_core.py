"""Numeric core of the batch-completion predictor (`pearl.control.predictor`, whose docstring states the
model): the vectorised roofline (`_Coeffs`, `_step`), the batch as weighted representatives
(`BatchReps`), the fixed point over the completion-ordered segments (`_solve`), each one's end and
mean wait per turn as its turns progress at the segments' pace (`_progress`) and the worker-mate
spread (`_spread`). The geometry and the E[max] of the completion times are
`pearl.control.predictor_end`.

Imports nothing of `pearl.control.predictor` (which imports this module and re-exports what it needs).
What it must not do: simulate events, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from pearl.config import EngineConfig
from pearl.perf.roofline import PerfModel

_REBALANCE = 1.0  # the worker-mate spread kept whole (see _spread)


# ------------------------------------------------------------------ vectorised roofline
class _Coeffs:
    """`PerfModel.step_time` as linear coefficients, probed through its public methods and checked, so
    that step times of many candidates and batch sizes are a few numpy operations. What `_step` may
    skip for a set of rows is decided once per set (`_derive`)."""

    NAMES = ("flop_rate", "byte_rate", "ovh", "sum", "per_op", "a_tok", "a_pair", "a_lm", "b_static", "b_tok",
             "b_kv", "b_exp", "n_exp", "log_miss", "ar_tok", "ar_fixed", "seq", "cap", "xfer_same", "xfer_net",
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
        self.ovh, self.sum, self.per_op = c.step_overhead_s, float(c.combine == "sum"), float(c.combine == "per_op")
        f1, f2 = w(0, 0, 1, 0.0)[0], w(0, 0, 2, 0.0)[0]
        self.a_tok, self.a_lm, self.a_pair = f2 - f1, 2 * f1 - f2, w(1, 1)[0] - w(1, 0)[0]
        self.b_kv = w(1, 1)[1] - w(1, 0)[1]
        self.n_exp = float(m.num_experts) if m.is_moe else 0.0
        self.log_miss = float(np.log1p(-m.experts_per_token / m.num_experts)) if m.is_moe else 0.0
        a = np.array([[1.0, n, pm.experts_touched(n)] for n in (1, 2, 3)])
        sol = np.linalg.lstsq(a if self.n_exp else a[:, :2], [w(n, 0)[1] for n in (1, 2, 3)], rcond=None)[0]
        self.b_static, self.b_tok = sol[0], sol[1]
        self.b_exp = sol[2] if self.n_exp else 0.0  # bytes per expert touched
        self.seq = c.seq_overhead_s  # per sampled sequence (the additive seconds' other part)
        self.ar_tok = w(2, 0)[2] - w(1, 0)[2] - self.seq
        self.ar_fixed = w(1, 0)[2] - self.ar_tok - self.seq
        self.cap = float(pm.kv_capacity_tokens())
        self.xfer_same = pm.kv_bytes_per_token / (hw.nvlink_bw * pm.tp)
        self.xfer_net = pm.kv_bytes_per_token / (hw.net_bw * pm.tp)
        self.setup = c.kv_setup_s
        self._derive()
        for args in ((7, 9000, 0, 0.0), (3, 500, 700, 7e5), (0, 0, 4000, 9e6), (40, 2e5, 300, 4e5)):
            want, got = pm.step_time(*args), float(_step(self, *args[:2], *(args[2:] if args[2] else ())))
            if abs(got - want) > 1e-9 + 1e-6 * want:
                raise RuntimeError(f"predictor's step-time coefficients disagree with {pm}: {got} vs {want}")

    @staticmethod
    def stack(cs: Sequence[_Coeffs]) -> _Coeffs:
        return _Coeffs()._derive({n: np.array([getattr(c, n) for c in cs], float)[:, None] for n in _Coeffs.NAMES})

    def take(self, rows: np.ndarray) -> _Coeffs:
        """These rows; `src`: the stack they come from (one row per distinct model, say) and their rows in it."""
        src, at = self.__dict__.get("src", (self, np.arange(len(self.flop_rate))))
        return _Coeffs()._derive({n: getattr(self, n)[rows] for n in _Coeffs.NAMES} | {"src": (src, at[rows])})

    def _derive(self, values: dict | None = None) -> _Coeffs:
        """With `values` (coefficients by `NAMES`) set first, what holds for every row (`_step` skips what
        it need not compute: all per operator or none, any additive, any MoE: the experts' bytes are 0 for
        dense models), and the own context's cost per token per step, memory- or compute-bound (`_rates`)."""
        self.__dict__.update(values or {})
        per_op = np.asarray(self.per_op) > 0
        self.all_per_op, self.any_per_op = bool(per_op.all()), bool(per_op.any())
        self.any_sum = bool((np.asarray(self.sum) > 0).any())
        self.moe = bool((np.asarray(self.b_exp * self.n_exp) != 0).any())
        self.kv_read, self.attn_flop = self.b_kv / self.byte_rate, self.a_pair / self.flop_rate
        return self

    def chunks(self, P, A) -> SimpleNamespace:
        """Prefill chunks' own terms of `_step` (their tokens, whether any, LM head, attention FLOPs and
        KV reads): the same numbers `_step` computes from P and A, once for chunks priced every iteration."""
        P = np.asarray(P, float)
        on = P > 0
        return SimpleNamespace(P=P, on=on, lm=self.a_lm * on, attn_f=self.a_pair * A,
                               attn_b=self.b_kv * np.where(on, A / np.maximum(P, 1.0) + P / 2, 0.0))


def _step(c, B, ctx, P=None, A=None, parts: bool = False):
    """Vectorised `PerfModel.step_time` (B may be fractional: a mean batch); P, A: prefill tokens and
    attention work (None: a decode step, B > 0; P may be their `_Coeffs.chunks`, A then unused); with
    `parts`, also whether it is memory-bound."""
    ch = None if P is None else P if isinstance(P, SimpleNamespace) else c.chunks(P, A)
    tokens, sampled = (B, B) if ch is None else (B + ch.P, B + ch.on)
    # dense operators (matmuls, experts, LM head) and attention (QK^T/PV FLOPs, KV reads), apart
    dense_f = c.a_tok * tokens + c.a_lm * B
    attn_f = c.a_pair * ctx
    dense_b = c.b_static + c.b_tok * tokens
    if c.moe:  # (0 for dense models: skipped)
        dense_b = dense_b + c.b_exp * c.n_exp * -np.expm1(tokens * c.log_miss)
    attn_b = c.b_kv * ctx
    if ch is not None:  # prefill chunks: their attention, their KV reads and one sampled position
        dense_f, attn_f, attn_b = dense_f + ch.lm, attn_f + ch.attn_f, attn_b + ch.attn_b
    if parts or not c.all_per_op:  # (one roofline, or "sum": additive; not needed when every row is per_op)
        tc, tm = (dense_f + attn_f) / c.flop_rate, (dense_b + attn_b) / c.byte_rate
        body = np.where(c.sum > 0, tc + tm, np.maximum(tc, tm)) if c.any_sum else np.maximum(tc, tm)
    if c.any_per_op:  # combine="per_op": each operator its own roofline, summed
        ops = (np.maximum(dense_f / c.flop_rate, dense_b / c.byte_rate)
               + np.maximum(attn_f / c.flop_rate, attn_b / c.byte_rate))
        body = ops if c.all_per_op else np.where(c.per_op > 0, ops, body)
    t = c.ovh + body + c.ar_tok * tokens + c.ar_fixed + c.seq * sampled
    if ch is not None:
        t = np.where(tokens > 0, t, 0.0)  # an empty step costs nothing
    return (t, tm >= tc) if parts else t


def _prefill_s(c, n, n_sq=None):
    """Seconds to prefill n tokens from scratch: FLOPs (attention at `n_sq`, the lengths' mean square,
    where n is a mean) and, at tp > 1, every token's all-reduces (at tp 8 they cost more)."""
    return (c.a_tok * n + c.a_pair * (n ** 2 if n_sq is None else np.maximum(n_sq, n ** 2)) / 2) / c.flop_rate + c.ar_tok * n


# ------------------------------------------------------------------ the batch as representatives
@dataclass(frozen=True, eq=False)
class BatchReps:
    """The batch as weighted representatives (built by `pearl.control.predictor.prepare`): per-rep
    work arrays, population weight w, class label (-1: known) with mass q in its class, class sizes,
    and the turns as events."""

    work: dict
    w: np.ndarray
    label: np.ndarray
    q: np.ndarray
    sizes: dict


# ------------------------------------------------------------------ the fixed point
def _solve(cf, n_dw, n_p, dis, p_same, engine: EngineConfig, reps: BatchReps, tol: float, cfp=None,
           steady: bool = False) -> dict:
    """T_i and σ_i of every representative (columns) under every candidate (rows): from a first guess
    (`_start`), iterate the segments' rates (`_segments`, `_rates`) to a fixed point, then add the
    worker-mate spread (`_spread`). `cf`: the decode (or mixed) workers' coefficients per candidate;
    `cfp`: the prefill workers' (default `cf`: the same tp). `steady`: the reps replaced as they
    finish (a capped pipeline): the alive set never changes (`_segments`), no first-prompt burst."""
    s = _start(cf, n_dw, n_p, dis, p_same, reps, cf if cfp is None else cfp, steady)
    C, N, ic = s.C, s.N, s.ic
    T, tau_h, wait, b_ref, ctx_ref = s.T, s.tau_h, s.wait, s.b_ref, s.ctx_ref
    for it in range(60):
        g = _segments(s, engine, T, tau_h, wait)
        r = _rates(s, g, b_ref, ctx_ref)
        flat, dt = g.flat, g.dt
        new, tau_h, w_new = np.empty(C * N), np.empty(C * N), np.empty(C * N)
        new[flat], tau_h[flat], w_new[flat] = r.new_s.ravel(), r.th_s.ravel(), r.wait_s.ravel()
        new, tau_h, w_new = new.reshape(C, N), tau_h.reshape(C, N), w_new.reshape(C, N)
        # Step 0.7, shrinking after 8 iterations: a saturated prefill queue can flip between two states
        # (short waits: few evictions and recomputes; long waits: the decode side evicts more of the
        # contexts that wait, their recomputes fill the queue), so late steps average them.
        a = 0.7 if it < 8 else 5.6 / it
        wait = w_new if it < 8 else wait + a * (w_new - wait)
        if ic.size:
            wt = (r.nu * dt)[ic]
            wsum = np.maximum(wt.sum(1, keepdims=True), 1e-12)
            b_ref, ctx_ref = (g.B_run[ic] * wt).sum(1, keepdims=True) / wsum, (g.ctx[ic] * wt).sum(1, keepdims=True) / wsum
        # Converged once every shape still in contention (within 1.2x of the best) has: far worse
        # shapes (a starved decode side can oscillate) need no more precision to lose.
        tmax = new.max(axis=1)
        done = np.max((np.abs(new - T) / T)[tmax <= 1.2 * tmax.min()]) * a / 0.7 < tol
        T = T + a * (new - T)
        if done:
            break
    return _spread(s, g, r, T, tau_h, it + 1)


def _start(cf, n_dw, n_p, dis, p_same, reps: BatchReps, cfp, steady: bool = False) -> SimpleNamespace:
    """What stays fixed through `_solve` (the reps' work, the candidates, the per-turn prefill costs,
    the first prompts' burst, the mate share), and the first guess of T, τ_h, the queue wait and the
    colocated steps' reference batch and context. Prefill work (a prefill worker's steps, the first
    prompts' burst) is timed with `cfp`, decode with `cf`; a hand-off between a prefill and a decode
    worker of different tp moves at the slower side's links (the fewer)."""
    wk, w = reps.work, reps.w
    K, Dn, E, Cd, X, F, c0, cF, fresh, prompt = (wk[k] for k in "K Dn E Cd X F c0 cF fresh prompt".split())
    ev_x, ev_a, ev_m, starts = wk["ev_x"], wk["ev_attn"], wk["ev_m"], wk["starts"]
    ev_w = w[wk["ev_row"]] * ev_m / (w[wk["ev_row"]] * ev_m).sum()
    C, N = dis.shape[0], len(w)
    ic, idis = np.nonzero(~dis[:, 0])[0], np.nonzero(dis[:, 0])[0]
    # A prefill step depends on the prefill model alone: priced once per row of `u` (the stack `cfp` was taken
    # from: a row per distinct model), `at` each candidate's row there.
    cc, (u, at) = cf.take(ic), cfp.__dict__.get("src", (cfp, np.arange(C)))
    # Disaggregated: a prefill step per turn (its mean is the queue's service), fetch and hand-off.
    own, s1 = np.zeros((C, N)), np.zeros((C, 1))
    xfer = p_same * cf.xfer_same + (1 - p_same) * cf.xfer_net
    if cfp is not cf:
        xfer = np.maximum(xfer, p_same * cfp.xfer_same + (1 - p_same) * cfp.xfer_net)
    if idis.size:
        s_e, at = _step(u, 0.0, 0.0, ev_x, ev_a), at[idis]
        # Queued turns share steps (a chunk takes every waiting prompt up to the token budget), so
        # the queue drains at the marginal cost of a turn: its step less an empty step's overhead, and
        # at least its FLOPs and all-reduces (small prompts ride a weight-read-bound step alone, not
        # when the queue packs them into one chunk).
        flops = (u.a_tok * ev_x + u.a_lm + u.a_pair * ev_a) / u.flop_rate + u.ar_tok * ev_x
        s1[idis] = (np.maximum(s_e - _step(u, 0.0, 0.0, 1.0, 0.5), flops) * ev_w).sum(1, keepdims=True)[at]
        own[idis] = (np.add.reduceat(s_e * ev_m, starts, axis=1)[at] + (2 * K - fresh) * u.setup[at]
                     + (X + F) * xfer[idis])
    # The first prompts all arrive at t=0: a trajectory waits, on average, for half of its worker's
    # other prompts (chunked together, so compute-bound).
    n_all = w.sum()
    p_time = _prefill_s(cfp, prompt)
    p_mean = (p_time * w * fresh).sum(1, keepdims=True) / max((w * fresh).sum(), 1e-9)
    burst = 0.5 * np.maximum((w * fresh).sum() / np.where(dis, n_p, n_dw) - 1, 0) * p_mean * fresh * (not steady)
    # Of the N-1 others, N/n - 1 share a trajectory's worker (spread evenly, then session affinity).
    mate = np.clip((n_all / n_dw - 1) / max(n_all - 1, 1e-9), 0.0, 1.0)
    # Start from half of the mates decoding alongside, each at the batch's mean context.
    b0 = 1 + 0.5 * mate * (n_all - 1)
    tau1 = _step(cf, b0, Cd / np.maximum(Dn, 1) + (b0 - 1) * (w * Cd).sum() / max((w * Dn).sum(), 1.0))
    T = E + Dn * tau1 + np.where(dis, own, K * tau1) + burst
    tau_h, wait = tau1 + 0 * T, 0 * T
    b_ref = np.maximum(1.0, 0.5 * n_all * mate)[ic]
    ctx_ref = b_ref * (w * c0).sum() / n_all
    rowoff, p_cap = (np.arange(C) * N)[:, None], n_p * cfp.cap  # (the prefill workers' KV, `_segments`)
    # The colocated rows' mixed steps, one `_step` per iteration (the events', first prompts', an empty chunk: decode)
    chunks = cc.chunks(np.concatenate([ev_x, prompt, [0.0]]), np.concatenate([ev_a, prompt ** 2 / 2, [0.0]])) if ic.size else None
    per_rep = np.stack([w, wc0 := w * c0, w * K, Dn, E, Cd, K, cF - c0, wc0 * (wc0 / np.maximum(w, 1e-12)), 2 * wc0])
    return SimpleNamespace(cf=cf, cfp=cfp, cc=cc, dis=dis, n_p=n_p, C=C, N=N, ic=ic, K=K, prompt=prompt, ev_x=ev_x, ev_a=ev_a,
                           ev_m=ev_m, ev_w=ev_w, starts=starts, own=own, s1=s1, xfer=xfer, n_all=n_all,
                           burst=burst, mate=mate, rowoff=rowoff, per_rep=per_rep, T=T, tau_h=tau_h,
                           wait=wait, b_ref=b_ref, ctx_ref=ctx_ref, steady=steady, chunks=chunks, p_cap=p_cap)


def _segments(s: SimpleNamespace, engine: EngineConfig, T, tau_h, wait) -> SimpleNamespace:
    """One iteration's segments: the reps in completion order (T), each segment's alive set summed
    (decode share, contexts, turn rate, think time), the decode batch and context on a worker, and
    the KV overflow (the batch's slowdown, the share of turns evicted and what an eviction costs)."""
    cf, C, N, mate = s.cf, s.C, s.N, s.mate
    order = T.argsort(axis=1)
    flat = (order + s.rowoff).ravel()
    ws, wc0, wK, Dn_s, E_s, Cd_s, K_s, grow, wc0c0, wc0x2 = s.per_rep.take(order.ravel(), axis=1).reshape(-1, C, N)  # (w·c0², 2·w·c0)
    Ts, th_prev, own_s, wait_s, burst_s = (x.take(flat).reshape(C, N) for x in (T, tau_h, s.own + s.burst, wait, s.burst))
    think = np.maximum(Ts / K_s - wait_s - own_s / K_s, 0.0)  # a turn's time outside the prefill queue
    ps = np.minimum(Dn_s * th_prev / Ts, 1.0)  # share of its life decoding (Little's law)
    prev = np.concatenate([np.zeros((C, 1)), Ts[:, :-1]], axis=1)
    dt, tmid = Ts - prev, (Ts + prev) / 2
    slope = grow / Ts  # context growth per second while alive
    # Sums over the alive (reverse cumulative sums in completion order), all in one pass.
    wps = ws * ps
    parts = np.array([ws, wps, wc0 * ps, wps * slope, wc0, ws * slope, wK / Ts, ws * think,
                      wc0c0, wc0x2 * slope, ws * slope ** 2])
    if s.steady:  # replaced as they finish: the alive are each kind in proportion to its life, at mid-life
        parts[[3, 5, 9]] *= Ts / 2
        parts[10] *= Ts ** 2 / 3
        tmid = 1.0
        sums = (parts * (s.n_all * Ts / (ws * Ts).sum(1, keepdims=True))).sum(2, keepdims=True)
        S_w, S_p, S_pc, S_ps, S_c0, S_sl, S_k, S_z, S_a, S_b, S_d = np.broadcast_to(sums, parts.shape)
    else:
        S_w, S_p, S_pc, S_ps, S_c0, S_sl, S_k, S_z, S_a, S_b, S_d = np.cumsum(parts[:, :, ::-1], axis=2)[:, :, ::-1]
    oth = np.maximum(S_w - 1, 0) / (S_w1 := np.maximum(S_w, 1e-12))  # share of the alive that are others
    S_c, S_all = S_pc + S_ps * tmid, S_c0 + S_sl * tmid  # contexts decoding / held by all alive
    B = 1 + S_p * oth * mate  # decoders wanting a step (the engine runs at most max_num_seqs)
    ctx, own_ctx = S_c * oth * mate, S_c / np.maximum(S_p, 1e-12)
    # KV beyond capacity, or decoders beyond max_num_seqs: they wait (the batch shrinks by kv_slow,
    # each advances kv_slow times slower); idle sessions beyond KV are evicted, so a share `evict` of
    # turns recomputes / re-sends it all.
    kv_slow = np.maximum(np.maximum(1.0, (ctx + own_ctx) / cf.cap), B / engine.max_num_seqs)
    # Disaggregated, a session waiting in the prefill queue keeps its context on the decode worker
    # until the prefill worker pulls it at admission: every alive session's context counts there
    # (never less than the decoders' own: S_all holds S_c).
    demand = S_all * oth * mate + own_ctx
    evict = np.minimum(np.maximum(demand - cf.cap, 0.0) / np.maximum(demand - ctx - own_ctx, 1.0), 1.0)
    m_ctx = S_all / S_w1
    m_sq = (S_a + S_b * tmid + S_d * tmid ** 2) / S_w1  # the alive contexts' mean square
    recompute = _prefill_s(s.cfp, m_ctx, m_sq)
    # Colocated, an evicted context is recomputed in the worker's own chunks. Disaggregated, the
    # prefill worker that last prefilled it re-sends it if it still holds it: the prefill workers keep
    # the most recently active contexts up to their own KV capacity (a share `held_p` of them), the
    # decode side evicts the least recently active, so a share min(evict, 1 - held_p) of turns finds
    # it nowhere and recomputes the whole context in the prefill queue; every evicted one is sent.
    held_p = np.minimum(np.maximum(s.p_cap / np.maximum(S_all, 1.0), 0.0), 1.0)
    rcmp = np.where(s.dis, np.minimum(evict, 1.0 - held_p), evict)
    svc_ev = rcmp * recompute  # per turn, in the prefill queue (a prefill worker's or a mixed one's)
    lat_ev = svc_ev + np.where(s.dis, evict * m_ctx * s.xfer, 0.0)  # per turn, on its critical path
    return SimpleNamespace(flat=flat, rowoff=s.rowoff, ws=ws, Dn_s=Dn_s, E_s=E_s, Cd_s=Cd_s, K_s=K_s, Ts=Ts, own_s=own_s, burst_s=burst_s,
                           ps=ps, dt=dt, S_w=S_w, S_k=S_k, S_z=S_z, oth=oth, B=B, B_run=np.minimum(B, engine.max_num_seqs), ctx=ctx, own_ctx=own_ctx,
                           kv_slow=kv_slow, evict=evict, svc_ev=svc_ev, lat_ev=lat_ev)


def _rates(s: SimpleNamespace, g: SimpleNamespace, b_ref, ctx_ref) -> SimpleNamespace:
    """The step times over the segments `g` (decode, stretched by the mates' prefill chunks when
    colocated), the prefill queue's wait, and each rep's new T (sorted order) with τ_h. Updates the
    colocated rows of `s.own` (a turn's own mixed-step cost) in place."""
    cf, cc, dis, mate, ic, ev_w = s.cf, s.cc, s.dis, s.mate, s.ic, s.ev_w
    B, ctx, kv_slow, svc_ev, lat_ev, oth, S_w = g.B, g.ctx, g.kv_slow, g.svc_ev, g.lat_ev, g.oth, g.S_w
    tau_d, membound = _step(cf, B / kv_slow, ctx / kv_slow, parts=True)
    kappa = (np.where((cf.sum > 0) | membound, cf.kv_read, 0.0) + np.where((cf.sum > 0) | ~membound, cf.attn_flop, 0.0)
             if cf.any_sum else np.where(membound, cf.kv_read, cf.attn_flop))  # own context, per token per step
    nu = g.S_k * oth  # the others' turns per second
    stretch, d_mean = np.ones((s.C, s.N)), np.zeros((s.C, 1))
    if ic.size:  # colocated: the mates' chunks lengthen the mixed steps (at the event-weighted batch)
        mixed = _step(cc, b_ref, ctx_ref, s.chunks)
        dec = mixed[:, -1:] if (b_ref > 0).all() else _step(cc, b_ref, ctx_ref)  # (the same where B > 0)
        d_e = mixed[:, :ev_w.size] - dec
        dm = (d_e * ev_w).sum(1, keepdims=True)
        s.own[ic] = own = np.add.reduceat(d_e * s.ev_m, s.starts, axis=1)
        if not s.steady:  # the first prompts are prefilled in the burst at t=0, not over the lives
            w, d_first = s.per_rep[0], mixed[:, ev_w.size:-1] - dec
            dm = dm * (1 - (w * d_first).sum(1, keepdims=True) / np.maximum((w * own).sum(1, keepdims=True), 1e-12))
        d_mean[ic] = dm
        stretch[ic] = 1 / (1 - np.minimum(nu[ic] * mate[ic] * (dm + svc_ev[ic]), 0.95))
    # The prefill queue (prefill workers, or a mixed worker's chunks) as a closed network: n
    # trajectories per server, each back after Z s of thinking, service s. Schweitzer's MVA gives
    # the residence R: R(Z + R) = s(Z + R) + s(n-1)R, light load R ~ s, saturation R ~ n·s - Z.
    n_q = np.where(dis, S_w / np.maximum(s.n_p, 1), 1 + S_w * oth * mate)
    s_q = np.where(dis, s.s1, d_mean) + svc_ev  # either queue also recomputes evicted contexts
    z_q = g.S_z / np.maximum(S_w, 1e-12)
    b_q = z_q - n_q * s_q
    wq = np.maximum((np.sqrt(b_q ** 2 + 4 * s_q * z_q) - b_q) / 2 - s_q, 0.0)
    omega = np.where(dis, tau_d / 2, tau_d) + wq + lat_ev
    tau_e = tau_d * kv_slow * stretch
    dt, Ts = g.dt, g.Ts
    I_inv, I_om = np.cumsum(np.array([dt / tau_e, omega * dt]), axis=2)
    th_s = Ts / I_inv  # harmonic mean of the step time over each one's life
    # The first prompts' burst is the queue's first wait: a first turn waits the longer of the two, not both.
    fixed = g.E_s + g.own_s - np.minimum(g.burst_s, wq[:, :1])
    new_s, wait_s = _progress(g, fixed, tau_e, kappa * stretch, omega, wq)
    return SimpleNamespace(nu=nu, stretch=stretch, wq=wq, tau_e=tau_e, I_om=I_om, th_s=th_s, new_s=new_s, wait_s=wait_s)


def _progress(g: SimpleNamespace, fixed, tau, kap, omega, wq) -> tuple[np.ndarray, np.ndarray]:
    """Each one's end (sorted order) as its turns progress at each segment's pace: a turn of rep j
    takes c_j = (Dn_j·τ + Cd_j·κ + fixed_j)/K_j + ω in a segment (decode, own-context reads, its
    environment and own prefill spread over its turns, the turn's waits), so it ends where
    Σ dt/c_j reaches K_j (past the last segment, at its pace). Where the waits are long early (a
    saturated queue) and short late, its turns crowd into the late segments, not spread evenly."""
    (C, N), K = g.Ts.shape, np.maximum(g.K_s, 1e-9)
    K3 = K[:, :, None]
    cyc = (g.Dn_s[:, :, None] * tau[:, None, :] + g.Cd_s[:, :, None] * kap[:, None, :] + fixed[:, :, None]) / K3 + omega[:, None, :]
    prog = np.cumsum(g.dt[:, None, :] / cyc, axis=2)
    m = np.minimum((prog < K3).sum(2), N - 1)  # the segment it ends in (or the last)
    at = m + np.arange(0, C * N * N, N).reshape(C, N)  # (flat indices of those cells)
    end = g.Ts.take(m + g.rowoff) - (prog.take(at) - K) * cyc.take(at)
    # Its turns per segment (those left past the last segment run at its pace), so its mean wait per
    # turn is weighted by where its turns are, not by time: crowded late, they wait little.
    done = np.minimum(prog, K3, out=prog)
    n = np.empty((C, N, N))
    np.subtract(done.ravel()[1:], done.ravel()[:-1], out=n.ravel()[1:])  # (all rows at once; their first cells next)
    n[:, :, 0] = done[:, :, 0]
    n[:, :, -1] += K - done[:, :, -1]
    n *= wq[:, None, :]
    return end, n.sum(2) / K


def _spread(s: SimpleNamespace, g: SimpleNamespace, r: SimpleNamespace, T, tau_h, iters: int) -> dict:
    """σ_i from the last iteration's segments `g` and rates `r`, and `_solve`'s answer."""
    cf, C, N, mate, n_all = s.cf, s.C, s.N, s.mate, s.n_all
    B, ctx, own_ctx, kv_slow, evict, dt = g.B, g.ctx, g.own_ctx, g.kv_slow, g.evict, g.dt
    ws, ps, Dn_s, Ts, flat = g.ws, g.ps, g.Dn_s, g.Ts, g.flat
    stretch, tau_e, th_s = r.stretch, r.tau_e, r.th_s
    # Worker-mate spread: m = N/n - 1 mates drawn at random. Linearised, mate j moves T_i by
    # p_j ∫ (∂τ/∂B)/τ² over their overlap, times Dn_i·τ_h²/T_i (harmonic mean). The router could move a
    # session off a clearly busier worker, but its slack keeps the long ones home (the simulator's last
    # trajectory sat on the most loaded worker all its life), and a loaded worker's mates live longer
    # and load it more, which the linear term leaves out: _REBALANCE keeps the spread whole. Fitted on
    # benchmarks/predictor_accuracy.py (MAPE without a cap / at cap 128, for 0.5, 0.75, 1.0, 1.25, 1.5:
    # 7.18/5.04, 6.31/4.93, 5.98/4.83, 6.27/4.75, 6.89/4.67%; 2026-12-03).
    half = 0.5 * own_ctx
    fp = (_step(cf, B / kv_slow + 0.5, (ctx + half) / kv_slow)
          - _step(cf, np.maximum(B / kv_slow - 0.5, 0.5), np.maximum(ctx - half, 0) / kv_slow)) * kv_slow * stretch
    G = np.cumsum(fp / tau_e ** 2 * dt, axis=1)
    y, y2 = ws * ps * G, ws * (ps * G) ** 2
    w_o = np.maximum(n_all - ws, 1e-9)
    below1, below2 = np.cumsum(yy := np.stack([y, y2]), axis=2) - yy
    above1, above2 = np.cumsum((pp := np.stack([ws * ps, ws * ps ** 2]))[:, :, ::-1], axis=2)[:, :, ::-1] - pp
    e1, e2 = (below1 + G * above1) / w_o, (below2 + G ** 2 * above2) / w_o
    m = mate * (n_all - 1)
    var = np.maximum(e2 - e1 ** 2, 0.0) * m * np.minimum(np.maximum((n_all - 1 - m) / max(n_all - 2, 1.0), 0.0), 1.0)
    sigma, om = np.empty(C * N), np.empty(C * N)
    sigma[flat], om[flat] = (_REBALANCE * Dn_s * th_s ** 2 / Ts * np.sqrt(var)).ravel(), r.I_om.ravel()
    return dict(T=T, sigma=sigma.reshape(C, N), iters=iters, concurrency=(g.B_run * dt).sum(1) / Ts[:, -1], tau_h=tau_h,
                own=s.own + s.burst, omega=om.reshape(C, N) / T, evict=(evict * dt).sum(1) / Ts[:, -1],
                segments=dict(end=Ts, B=B, ctx=ctx, step=tau_e, wait=r.wq, evict=evict))  # for inspection
