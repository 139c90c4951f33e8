"""The batch-completion predictor's geometry and the batch's end (`pearl.control.predictor`): the
share of prefill/decode worker pairs on one node, the prefill workers' model at a tp of their own
(`_with_tp`), the E[max] of the completion times and the critical trajectory's terms (`_critical_path`).

What it must not do: simulate events, own time, or import torch, Ray, asyncio or `time`.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import ndtr

from pearl.control.predictor_core import BatchReps
from pearl.perf.roofline import PerfModel
from pearl.types import LayoutShape, Mode, Role

_PHI_ONE, _PHI_ZERO = 8.5, -40.0  # ndtr(z) is exactly 1.0 at z >= 8.5 and exactly 0.0 at z <= -40


# ------------------------------------------------------------------ geometry and the batch's end
@lru_cache(maxsize=8192)
def _same_node_share(shape: LayoutShape, devices_per_node: int) -> float:
    """Share of (prefill, decode) worker pairs on one node, workers placed in device order, prefill first."""
    if shape.mode is not Mode.DISAGGREGATED:
        return 1.0
    if shape.per_role_tp:
        return _same_node_share_per_role(shape, devices_per_node)
    per = max(devices_per_node // shape.tp, 1)
    nodes = np.arange(-(-shape.n_workers // per))
    pre = np.clip(shape.n_prefill - nodes * per, 0, per)
    dec = np.clip(shape.n_workers - nodes * per, 0, per) - pre
    return float((pre * dec).sum() / (shape.n_prefill * shape.n_decode))


def _same_node_share_per_role(shape: LayoutShape, devices_per_node: int) -> float:
    """`_same_node_share` with a prefill tp of its own: workers packed on nodes in order (prefill
    first), a worker that does not fit in what is left of a node starting the next one."""
    pre: dict[int, int] = {}
    dec: dict[int, int] = {}
    node, used = 0, 0
    for role in shape.roles():
        tp = shape.tp_of(role)
        if used and used + tp > devices_per_node:
            node, used = node + 1, 0
        used += tp
        counts = pre if role is Role.PREFILL else dec
        counts[node] = counts.get(node, 0) + 1
    return float(sum(n * dec.get(k, 0) for k, n in pre.items()) / (shape.n_prefill * shape.n_decode))


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
    # Φ(z) where the spread is nonzero (a step where it is 0); Φ is exactly 1 from z ≈ 8.3 on and
    # exactly 0 below z ≈ -37.7 in double precision, so it is evaluated only in between (NaN too).
    pos = sk[:, None, :] > 0
    phi = (z >= np.where(pos, _PHI_ONE, 0.0)).astype(float)
    mid = pos & ~((z >= _PHI_ONE) | (z <= _PHI_ZERO))
    phi[mid] = ndtr(z[mid])
    at = int(known.sum())
    log_g = np.log(np.maximum(phi[:, :, :at], 1e-300)).sum(axis=2)
    for n, below, k in lows:
        mix = below[:, None] + (phi[:, :, at:at + k] * reps.q[idx[:, at:at + k]][:, None, :]).sum(axis=2)
        log_g += n * np.log(np.minimum(np.maximum(mix, 1e-300), 1.0))
        at += k
    return lo + np.trapezoid(1.0 - np.exp(log_g), grid, axis=1)


def _critical_path(reps: BatchReps, r: dict, i: int | np.ndarray,
                   j: int | np.ndarray) -> dict[str, float] | list[dict[str, float]]:
    """Representative j's time under candidate row i of a solve `r`, by term (environment, decode,
    prefill); its own-context reads ride with decode. With arrays i, j: a list, one per pair."""
    wk = reps.work
    env, dec, pre = wk["E"][j], wk["Dn"][j] * r["tau_h"][i, j], r["own"][i, j] + wk["K"][j] * r["omega"][i, j]
    dec = dec + np.maximum(r["T"][i, j] - (env + dec + pre), 0.0)
    if np.ndim(j):
        return [dict(env=e, decode=d, prefill=p) for e, d, p in zip(env.tolist(), dec.tolist(), pre.tolist())]
    return dict(env=float(env), decode=float(dec), prefill=float(pre))


_DERIVED: dict[tuple[int, int], tuple[PerfModel, PerfModel]] = {}


def _with_tp(pm: PerfModel, tp: int) -> PerfModel:
    """`pm` at another tp, built once per (model, tp) (the model is kept, so its id is not reused)."""
    if pm.tp == tp:
        return pm
    hit = _DERIVED.get((id(pm), tp))
    if hit is None or hit[0] is not pm:
        hit = _DERIVED[(id(pm), tp)] = (pm, pm.with_tp(tp))
    return hit[1]
