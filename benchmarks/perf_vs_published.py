"""The roofline against published measurements (src/pearl/data/published_perf.csv; docs/perf_model.md).

Fits the engine-level coefficients (step and per-sequence overhead, all-reduce latency, KV-read and expert
efficiencies) and the per-GPU ones (mfu, bw_eff) on the fitting half of the rows (`pearl.perf.published.
held_out`: every second row of each source is held out), then prints, per row, measured vs predicted by
the fit, by the catalogue's constants, and by the old model (mfu 0.5, bw_eff 0.8, 4 ms per step, 10 us
per all-reduce at NVLink line rate, no per-sequence cost, KV and experts at the weight rate). Last line:
the held-out median absolute relative error of the catalogue (<= 10% required, goal <= 6%), with the old
model's on the same rows.

    PYTHONPATH=src python benchmarks/perf_vs_published.py [--no-fit]

The fit is here, not in the runtime: its result is written into `pearl.perf.hardware` / `PerfCoeffs`
defaults by hand, and tests/perf/test_published.py checks the catalogue's held-out error.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import numpy as np

from pearl.perf import published
from pearl.perf.hardware import get_hardware
from pearl.perf.roofline import PerfCoeffs

GPUS = ("a100", "h100", "h20")
GLOBAL = ("step_overhead_s", "seq_overhead_s", "oneshot_latency_s", "allreduce_latency_s", "kv_eff", "expert_eff")
LEGACY = PerfCoeffs(mfu=0.5, bw_eff=0.8, step_overhead_s=0.004, seq_overhead_s=0.0, allreduce="ring",
                    allreduce_latency_s=10e-6, kv_eff=1.0, expert_eff=1.0)
X0 = dict(step_overhead_s=0.002, seq_overhead_s=5e-5, oneshot_latency_s=2e-5, allreduce_latency_s=2e-5, kv_eff=0.6,
          expert_eff=0.7)
BOUNDS = dict(step_overhead_s=(1e-4, 0.02), seq_overhead_s=(1e-7, 2e-3), oneshot_latency_s=(1e-7, 2e-4),
              allreduce_latency_s=(1e-7, 2e-4),
              kv_eff=(0.1, 1.0), expert_eff=(0.1, 1.0), mfu=(0.1, 0.85), bw_eff=(0.1, 0.95))


def legacy(p) -> tuple[PerfCoeffs, object]:
    """The old model for row p: 10 us per all-reduce (now per ring hop: 2(tp-1) hops) at NVLink line rate."""
    hops = 2 * (p.tp - 1) if p.tp > 1 else 1
    return dataclasses.replace(LEGACY, allreduce_latency_s=10e-6 / hops), legacy_hw(p.gpu)


def legacy_hw(gpu: str):
    hw = get_hardware(gpu)
    return dataclasses.replace(hw, ring_bw=hw.nvlink_bw)


def unpack(x: np.ndarray, fixed: dict) -> tuple[PerfCoeffs, dict]:
    vals = dict(zip(GLOBAL, np.exp(x[:len(GLOBAL)])), **fixed)
    coeffs = PerfCoeffs(**{k: float(v) for k, v in vals.items()})
    hws = {}
    for i, g in enumerate(GPUS):
        mfu, bw = np.exp(x[len(GLOBAL) + 2 * i: len(GLOBAL) + 2 * i + 2])
        hws[g] = dataclasses.replace(get_hardware(g), mfu=float(mfu), bw_eff=float(bw))
    return coeffs, hws


def fit(points, fixed: dict) -> tuple[PerfCoeffs, dict]:
    from scipy.optimize import least_squares

    free = [k for k in GLOBAL if k not in fixed]
    names = list(GLOBAL) + [f"{g}.{k}" for g in GPUS for k in ("mfu", "bw_eff")]
    lo = np.log([BOUNDS[n.split(".")[-1]][0] for n in names])
    hi = np.log([BOUNDS[n.split(".")[-1]][1] for n in names])
    x0 = np.log([X0.get(n, 0.5) for n in names])
    keep = np.array([n in free or "." in n for n in names])

    def resid(z):
        x = x0.copy()
        x[keep] = z
        coeffs, hws = unpack(x, fixed)
        return np.array([np.log(published.predict(p, coeffs, hws[p.gpu]) / p.value) for p in points])

    r = least_squares(resid, x0[keep], bounds=(lo[keep], hi[keep]), loss="soft_l1", f_scale=0.05)
    x = x0.copy()
    x[keep] = r.x
    return unpack(x, fixed)


def med(errs) -> float:
    return statistics.median(abs(e) for e in errs) if errs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-fit", action="store_true", help="only compare the catalogue and the old model")
    args = ap.parse_args(argv)
    pts = published.load()
    split = published.held_out(pts)
    steps = [(p, h) for p, h in zip(pts, split) if p.is_step]
    train = [p for p, h in steps if not h]
    fitted = None
    if not args.no_fit:
        # The catalogue's form: everything but the per-sequence cost, which the controller's predictor
        # (pearl.control.predictor_core) cannot represent yet; then the full model as a comparison.
        for label, fixed in (("catalogue form (seq_overhead_s = 0)", {"seq_overhead_s": 0.0}),
                             ("with the per-sequence cost", {})):
            coeffs, hws = fit(train, fixed)
            ho = [published.rel_error(p, coeffs, hws[p.gpu]) for p, h in steps if h]
            print(f"fit, {label}, on {len(train)} rows:",
                  ", ".join(f"{k} {getattr(coeffs, k):.4g}" for k in GLOBAL))
            print("   ", "; ".join(f"{g} mfu {hws[g].mfu:.3f} bw_eff {hws[g].bw_eff:.3f}" for g in GPUS),
                  f"-> held-out median |error| {med(ho):.1%}")
            fitted = fitted or (coeffs, hws)
    print(f"\n{'id':4} {'split':5} {'gpu':4} {'model':13} {'tp':>2} {'B':>3} {'in':>6} {'out':>5} {'metric':14} "
          f"{'measured':>9} {'catalog':>9} {'err':>7} {'old':>9} {'err':>7}" + (f" {'fit err':>7}" if fitted else ""))
    cat_ho, old_ho, fit_ho, cat_tr = [], [], [], []
    for p, h in steps:
        cat, old = published.predict(p), published.predict(p, *legacy(p))
        ec, eo = cat / p.value - 1, old / p.value - 1
        line = (f"{p.id:4} {'held' if h else 'fit':5} {p.gpu:4} {p.model:13} {p.tp:>2} {p.batch:>3} {p.input_len:>6} "
                f"{p.output_len:>5} {p.metric:14} {p.value:>9.4g} {cat:>9.4g} {ec:>+7.1%} {old:>9.4g} {eo:>+7.1%}")
        if fitted:
            ef = published.rel_error(p, fitted[0], fitted[1][p.gpu])
            line += f" {ef:>+7.1%}"
            if h:
                fit_ho.append(ef)
        print(line)
        (cat_ho if h else cat_tr).append(ec)
        if h:
            old_ho.append(eo)
    for p in pts:
        if not p.is_step:
            print(f"{p.id:4} {p.gpu:4} {p.metric}: measured {p.value:g} GB/s, catalogue ring_bw "
                  f"{published.predict(p):g} GB/s, old model (NVLink line rate) {legacy_hw(p.gpu).ring_bw / 1e9:g}")
    by_src: dict[str, list[float]] = {}
    for (p, h), e in zip([s for s in steps if s[1]], cat_ho):
        by_src.setdefault(p.ref, []).append(e)
    print("\nheld-out median |error| by source (catalogue):",
          ", ".join(f"{k} {med(v):.1%} ({len(v)})" for k, v in by_src.items()))
    print(f"fitting rows: catalogue {med(cat_tr):.1%}; all step rows: catalogue {med(cat_tr + cat_ho):.1%}")
    if fitted:
        print(f"held-out median |error| of this run's fit: {med(fit_ho):.1%}")
    print(f"held-out median |error| ({len(cat_ho)} rows): catalogue {med(cat_ho):.1%}, old model {med(old_ho):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
