"""Fit the roofline efficiencies (mfu, bw_eff, step overhead) to measured engine step times.

Each measured step is reduced to the ideal compute time c (FLOPs at 100% of peak), the ideal memory
time m (bytes at 100% of HBM bandwidth), its sequences q (decodes, plus one for a prefill chunk) and
the all-reduce time; the fit then solves, in relative error,

    max form:  seconds - comm = overhead + max(c / mfu, m / bw_eff)
    sum form:  seconds - comm = overhead + c / mfu + m / bw_eff + seq_overhead·q   (linear)

In the sum form (CPUs) the samples determine either bw_eff or the per-sequence cost, not both (see
`_fit_sum`). When the memory time hardly varies over the samples (a model whose weights dominate every
step's bytes, such as SmolLM2 in float32), it cannot be told apart from the fixed overhead: bw_eff is
held at its prior and the per-sequence cost is fitted instead; an engine that loops over sequences in
Python pays milliseconds per sequence that no roofline term sees (SmolLM2 on one core: ~9 ms). A
negative fitted per-sequence cost is dropped (0, and the rest refitted). Otherwise bw_eff is fitted
and the per-sequence cost kept at its prior. `Calibration.held` names what was kept.

Fits that are physically impossible (mfu or bw_eff above 1 or not positive, negative overhead) or that
explain the data badly raise `CalibrationError` with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from pearl.errors import CalibrationError
from pearl.perf.hardware import Hardware
from pearl.perf.models import ModelShape
from pearl.perf.roofline import PerfCoeffs, PerfModel, ideal_time

MIN_SAMPLES = 5  # three unknowns, plus enough slack to see the residual
# The memory time must spread by more than this (max/min - 1) over the samples for the sum form to fit
# bw_eff apart from the step overhead.
MIN_MEMORY_SPREAD = 0.1


@dataclass(frozen=True)
class StepSample:
    """One measured engine step (arguments of `PerfModel.step_time`, and the seconds it took)."""

    n_decode: int
    decode_context: int
    prefill_tokens: int
    prefill_attn: float
    seconds: float


@dataclass(frozen=True)
class Calibration:
    """A fit and how well it explains the samples."""

    coeffs: PerfCoeffs
    n_samples: int
    rmse: float  # seconds
    rel_rmse: float  # root-mean-square of (predicted - measured) / measured
    compute_bound: int  # samples on the compute side of the roofline (max form)
    memory_bound: int
    held: tuple[str, ...] = ()  # coefficients the samples could not determine, kept at their prior


def _regressors(samples: Sequence[StepSample], pm: PerfModel) -> tuple[np.ndarray, ...]:
    rows = []
    for i, s in enumerate(samples):
        if not s.seconds > 0:
            raise CalibrationError(f"sample {i} has a non-positive duration ({s.seconds} s)")
        if s.n_decode < 0 or s.prefill_tokens < 0 or s.decode_context < 0 or s.prefill_attn < 0:
            raise CalibrationError(f"sample {i} has a negative count: {s}")
        if s.n_decode + s.prefill_tokens == 0:
            raise CalibrationError(f"sample {i} has no tokens (an empty step cannot be fitted)")
        c, m, comm = ideal_time(pm, s.n_decode, s.decode_context, s.prefill_tokens, s.prefill_attn)
        rows.append((c, m, comm, s.n_decode + (1 if s.prefill_tokens > 0 else 0), s.seconds))
    c, m, comm, q, y = (np.array(col, dtype=float) for col in zip(*rows))
    return c, m, q, y - comm, y


def _lsq(cols: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Weighted (relative-error) linear least squares of y on `cols`. Unconstrained on purpose: a sign
    or a value below 1 is what tells us the fit is impossible."""
    w = 1.0 / y
    design = np.column_stack(cols) * w[:, None]
    scale = np.linalg.norm(design, axis=0)
    if np.any(scale == 0) or np.linalg.matrix_rank(design / scale) < len(cols):
        raise CalibrationError("the samples do not vary enough to separate compute, memory and "
                               "overhead; mix decode, prefill and mixed steps of different sizes")
    sol, *_ = np.linalg.lstsq(design / scale, y * w, rcond=None)
    return sol / scale


def _fit_sum(c: np.ndarray, m: np.ndarray, q: np.ndarray, y: np.ndarray, b_prior: float,
             s_prior: float) -> tuple[float, float, float, float, tuple[str, ...]]:
    """overhead + a·c + b·m + s·q (module docstring): (a, b, o, s, held). Either the memory time or the
    per-sequence cost is fitted, never both: where the memory time varies, it grows with the batch as
    the sequence count does, and the two trade off freely (the tiny model's bw_eff came out anywhere
    from 1.7 to 32, or negative, under load)."""
    one = np.ones_like(c)
    if np.max(m) > np.min(m) * (1 + MIN_MEMORY_SPREAD):
        o, a, b = (float(v) for v in _lsq([one, c, m], y - s_prior * q))
        return a, b, o, s_prior, ("seq_overhead_s",)
    y = y - b_prior * m  # m ~ constant: collinear with the overhead; hold bw_eff
    sol = _lsq([one, c, q], y) if np.ptp(q) > 0 else np.append(_lsq([one, c], y), 0.0)
    if sol[-1] < 0:  # a per-sequence cost below 0 is noise: none, and refit the rest
        sol = np.append(_lsq([one, c], y), 0.0)
    o, a, s = (float(v) for v in sol)
    return a, b_prior, o, s, ("bw_eff",)


def _max_residual(x: np.ndarray, c: np.ndarray, m: np.ndarray, y: np.ndarray, ymed: float) -> np.ndarray:
    a, b, o = x
    return (o * ymed + np.maximum(a * c, b * m)) / y - 1.0


def _polish_max(a: float, b: float, o: float, c, m, y) -> tuple[float, float, float]:
    """Given which side of the roofline each sample sits on, the max form is linear: alternate
    classify / solve until the classification is stable (exact on noise-free data)."""
    w = 1.0 / y
    for _ in range(20):
        comp = a * c >= b * m
        cols = [np.ones_like(c), np.where(comp, c, 0.0), np.where(comp, 0.0, m)]
        keep = [0] + [j for j in (1, 2) if np.any(cols[j])]
        design = np.column_stack([cols[j] for j in keep]) * w[:, None]
        sol, *_ = np.linalg.lstsq(design, y * w, rcond=None)
        new = {0: o, 1: a, 2: b}
        new.update(zip(keep, sol))
        o2, a2, b2 = new[0], new[1], new[2]
        if a2 <= 0 or b2 <= 0:
            break
        if np.array_equal(a2 * c >= b2 * m, comp):
            return float(a2), float(b2), float(o2)
        a, b, o = a2, b2, o2
    return a, b, o


def _fit_max(c: np.ndarray, m: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    from scipy.optimize import least_squares  # scipy is slow to import; only calibration needs it

    ymed = float(np.median(y))
    # Bounds allow mfu/bw_eff up to 100 and negative overhead so that impossible fits are *seen* (and
    # refused below) instead of being clipped into something plausible-looking.
    lo, hi = [1e-2, 1e-2, -np.max(y) / ymed], [1e4, 1e4, np.max(y) / ymed]
    best, best_cost = None, np.inf
    o_starts = (0.0, 0.5 * float(np.min(y)) / ymed)
    for a0 in (1.2, 2.0, 4.0, 10.0):
        for b0 in (1.05, 1.5, 3.0):
            for o0 in o_starts:
                r = least_squares(_max_residual, [a0, b0, o0], bounds=(lo, hi), args=(c, m, y, ymed),
                                  method="trf", xtol=1e-12, ftol=1e-12, gtol=1e-12)
                if r.cost < best_cost:
                    best, best_cost = r.x, r.cost
    a, b, o = float(best[0]), float(best[1]), float(best[2]) * ymed
    a2, b2, o2 = _polish_max(a, b, o, c, m, y)
    if a2 > 0 and b2 > 0:
        cost2 = float(np.sum(_max_residual(np.array([a2, b2, o2 / ymed]), c, m, y, ymed) ** 2)) / 2
        if cost2 <= best_cost:
            a, b, o = a2, b2, o2
    return a, b, o


def fit(samples: Iterable[StepSample], model: ModelShape, hw: Hardware, tp: int = 1, combine: str = "max",
        base: PerfCoeffs | None = None, max_rel_error: float = 0.25) -> Calibration:
    """Fit mfu, bw_eff and step_overhead_s (and, in the sum form, seq_overhead_s); the other
    coefficients come from `base`. Raises
    CalibrationError when the fit is impossible or its relative RMS error exceeds `max_rel_error`."""
    samples = list(samples)
    if combine not in ("max", "sum"):
        raise CalibrationError(f"combine must be 'max' or 'sum', got {combine!r}")
    if len(samples) < MIN_SAMPLES:
        raise CalibrationError(f"too few samples to calibrate: {len(samples)} (need at least {MIN_SAMPLES})")
    pm = PerfModel(model, hw, tp, replace(base or PerfCoeffs(), combine=combine))
    base = pm.coeffs  # with the hardware's mfu / bw_eff where `base` leaves them unset
    c, m, q, y, measured = _regressors(samples, pm)
    s, held = base.seq_overhead_s, ()
    if combine == "sum":
        y = y + s * q  # (comm included the prior's per-sequence cost: the sum form fits its own)
    if np.any(y <= 0):
        raise CalibrationError("some steps took less than their tensor-parallel all-reduces alone; "
                               "wrong tp or hardware?")
    if combine == "sum":
        a, b, o, s, held = _fit_sum(c, m, q, y, 1.0 / base.bw_eff, s)
        y = y - s * q  # from here on, y is what the roofline terms and the overhead explain
    else:
        a, b, o = _fit_max(c, m, y)
    comp = a * c >= b * m
    if combine == "max":
        # A side of the roofline that no sample reaches only bounds its efficiency from below: keep the
        # prior, raised to the least value consistent with the data.
        slack = np.maximum(y - o, 1e-30)
        if not np.any(comp):
            a = min(1.0 / base.mfu, float(np.min(slack / c)))
        if np.all(comp):
            b = min(1.0 / base.bw_eff, float(np.min(slack / m)))
    where = f"{model.name} on {hw.name} tp={tp} ({combine} form, {len(samples)} samples)"
    for label, inv, what in (("mfu", a, "FLOP/s"), ("bw_eff", b, "HBM bandwidth")):
        if inv <= 0:
            raise CalibrationError(f"{where}: fitted {label} is not positive: step time does not grow "
                                   f"with the model's {what} demand")
        if inv < 1.0 and not hw.rough:  # (a rough catalogue peak may be beaten: the product is what counts)
            raise CalibrationError(f"{where}: fitted {label} = {1 / inv:.3g} > 1: steps are faster than the "
                                   f"hardware's peak {what} allows; wrong hardware, model or tp?")
    tol = max(1e-5, 0.01 * float(np.median(y)))  # measurement noise can push a true ~0 slightly below
    if o < -tol:
        raise CalibrationError(f"{where}: fitted step overhead is negative ({o * 1e3:.3g} ms)")
    o = max(o, 0.0)
    coeffs = replace(base, mfu=1.0 / a, bw_eff=1.0 / b, step_overhead_s=o, seq_overhead_s=s)
    pred = o + (np.maximum(a * c, b * m) if combine == "max" else a * c + b * m)
    err = pred - y
    rel = float(np.sqrt(np.mean((err / measured) ** 2)))
    if rel > max_rel_error:
        raise CalibrationError(f"{where}: the fit explains the samples badly (relative RMS error "
                               f"{rel:.1%} > {max_rel_error:.0%}); try combine='sum' or check the samples")
    return Calibration(coeffs, len(samples), float(np.sqrt(np.mean(err ** 2))), rel,
                       int(np.sum(comp)) if combine == "max" else 0,
                       int(np.sum(~comp)) if combine == "max" else 0, held)


def calibrate(samples: Iterable[StepSample], model: ModelShape, hw: Hardware, tp: int = 1,
              combine: str = "max", base: PerfCoeffs | None = None, max_rel_error: float = 0.25) -> PerfCoeffs:
    """The fitted coefficients (see `fit` for the full report)."""
    return fit(samples, model, hw, tp, combine, base, max_rel_error).coeffs

