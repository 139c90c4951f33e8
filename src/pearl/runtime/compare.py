"""`pearl compare`: every policy on the same scenario and seeds, a table, and plots.

Rows (docs/policies.md says what each may and may not do): the baselines `fixed`, `static-pd`,
`rlboost+`, `roll-partial`, each as configured and tuned (`pearl.runtime.tuning.tune`: tp, the cap
on trajectories in flight, the P:D ratio, by short runs on a held-out seed); the static layouts
the predictor plans, `plan-static` and `plan-warmup` (`PLANNED`); `pearl`; `bound` (the
best static configuration for PEARL's time-averaged device budget, `tuning.bound_budget`); and
PEARL's ablations. Every row runs the scenario's seeds; the table gives mean ± standard deviation
over seeds and the ratios of the means.
"""
from __future__ import annotations

import json
import math
import statistics
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.config import ScenarioConfig, deep_merge, parse_config
from pearl.runtime.tuning import Bound, Tuned, bound_budget, configure, simulate, tune, tune_bound
from pearl.types import Mode

__all__ = ["ABLATIONS", "Row", "compare", "format_table"]

# PEARL with one mechanism off (`policy` overrides); `tp pinned` keeps the scenario's engine.tp.
ABLATIONS: dict[str, dict[str, Any]] = {
    "pearl -pd adaptation": {"adapt_pd": False},
    "pearl -borrowing": {"borrow": False},
    "pearl -elasticity": {"elastic": False},
    "pearl -cost-aware": {"cost_aware": False},
    "pearl -in-flight cap": {"adapt_cap": False},
    "pearl full restarts": {"incremental": False},
    "pearl tp pinned": {"tps": None},  # filled with [engine.tp] per scenario
}
BASELINES = ("fixed", "static-pd", "rlboost+", "roll-partial")
# Static layouts the predictor plans (no tuning runs: `pearl plan` is their tuning): before the run
# from the declared workload, or after the first quarter of the run (at most `policy.plan_after_s`)
# from the observed one.
PLANNED = ("plan-static", "plan-warmup")


def is_baseline(name: str) -> bool:
    """Whether row `name` is a baseline PEARL is measured against (tuned or planned)."""
    return name.endswith(" tuned") or name in PLANNED


@dataclass
class Row:
    name: str
    cfg: ScenarioConfig  # seed set per run
    note: str = ""  # the tuned knobs, the bound's budget
    runs: list[dict] = field(default_factory=list)

    def mean(self, key: str) -> float:
        vals = [_get(r, key) for r in self.runs]
        return statistics.fmean(vals) if vals else math.nan

    def std(self, key: str) -> float:
        vals = [_get(r, key) for r in self.runs]
        return statistics.stdev(vals) if len(vals) > 1 else 0.0


def _get(r: dict, key: str) -> float:
    x: Any = r
    for k in key.split("."):
        x = x[k]
    return float(x)


def _policy(cfg: ScenarioConfig, name: str, **over: Any) -> ScenarioConfig:
    return configure(cfg, {"policy": {"name": name, **over}})


def _as_configured(cfg: ScenarioConfig) -> dict[str, ScenarioConfig]:
    """The baselines as the scenario file configures them. `static-pd` on a colocated scenario:
    1 prefill worker per 4 at the configured tp (the verl/slime-style default)."""
    out = {p: _policy(cfg, p) for p in ("fixed", "rlboost+", "roll-partial")}
    if cfg.layout.mode is Mode.DISAGGREGATED:
        out["static-pd"] = _policy(cfg, "static-pd")
    else:
        w = cfg.cluster.rollout_devices // cfg.engine.tp
        if w >= 2:
            p = max(1, w // 4)
            out["static-pd"] = configure(cfg, {"policy": {"name": "static-pd"},
                                               "layout": {"mode": "disaggregated", "prefill": p, "decode": w - p}})
    return out


def run_key(data: dict[str, Any]) -> str:
    """What identifies a run's configuration (a scenario dump): everything but the name, with
    `policy.elastic` dropped when the scenario has no elastic pool (no elastic device ever arrives,
    so the flag changes nothing: `pearl -elasticity` there is PEARL's run)."""
    d = {k: v for k, v in data.items() if k != "name"}
    if d["cluster"]["elastic"]["kind"] == "none":
        d["policy"] = {k: v for k, v in d["policy"].items() if k != "elastic"}
    return json.dumps(d, sort_keys=True)


def _submit(ex: ProcessPoolExecutor, row: Row, seeds: list[int], seen: dict[str, list[Future]]) -> list[Future]:
    """One run per seed; the first seed's also records the device timeline (for the plots). A row
    whose configuration an earlier row already has (`run_key`: e.g. tuned = as configured) reuses its runs."""
    data = row.cfg.model_dump(mode="json")
    key = run_key(data)
    if key not in seen:
        seen[key] = [ex.submit(_run, data, s, s == seeds[0]) for s in seeds]
    return seen[key]


def _run(data: dict, seed: int, timeline: bool) -> dict:
    return simulate(parse_config(deep_merge(data, {"seed": seed}), ScenarioConfig), timeline=timeline)


# long: one pipeline (tune, run, bound after PEARL) kept in one place so its order is visible
def compare(cfg: ScenarioConfig, seeds: list[int], jobs: int = 2, log=print, legacy_tuning: bool = False) -> list[Row]:
    """Run every row on `seeds` (module docstring). `log`: progress lines, the last one the number of
    runs. The tuners (each baseline's and the bound's, coarse to fine: `tuning.search`) run at once
    in threads that share the process pool, so it never waits on one tuner's last trial.
    `legacy_tuning`: the tuners one after another, each exhaustive (`prune=False`), as before
    (kept for `benchmarks/compare_speed.py`)."""
    rows: list[Row] = []
    futs: dict[str, list[Future]] = {}
    seen: dict[str, list[Future]] = {}
    with ProcessPoolExecutor(jobs) as ex, ThreadPoolExecutor(len(BASELINES) + 1) as th:
        pearl = Row("pearl", _policy(cfg, "pearl"))
        futs["pearl"] = _submit(ex, pearl, seeds, seen)
        rows.append(pearl)
        for name, c in _as_configured(cfg).items():
            rows.append(Row(name, c, "as configured"))
            futs[name] = _submit(ex, rows[-1], seeds, seen)
        for name in PLANNED:
            after = min(cfg.policy.plan_after_s, 0.25 * cfg.duration_s)
            rows.append(Row(name, _policy(cfg, name, plan_after_s=after),
                            "planned before the run" if name == "plan-static" else f"planned at {after:g} s"))
            futs[name] = _submit(ex, rows[-1], seeds, seen)
        for name, over in ABLATIONS.items():
            over = {**over, "tps": [cfg.engine.tp]} if "tps" in over else over
            rows.append(Row(name, _policy(cfg, "pearl", **over)))
            futs[name] = _submit(ex, rows[-1], seeds, seen)
        tuners = _tuners(cfg, futs["pearl"], ex, th, legacy_tuning)
        trials = 0
        for p in BASELINES:
            t: Tuned = tuners[p].result()
            trials += len(t.trials)
            log(f"tuned {p}: {t.knobs.label()} (best of {len(t.trials)} short runs)")
            rows.append(Row(f"{p} tuned", t.cfg, t.knobs.label()))
            futs[rows[-1].name] = _submit(ex, rows[-1], seeds, seen)
        pearl.runs = [f.result() for f in futs["pearl"]]
        b: Bound = tuners["bound"].result()
        trials += len(b.trials)
        log(f"bound: budget {b.budget:.2f} devices: {b.label} (best of {len(b.trials)} short runs)")
        sides = [(_submit(ex, Row("bound", c), seeds, seen), w) for c, w in b.sides]
        for r in rows:
            if not r.runs:
                r.runs = [f.result() for f in futs[r.name]]
        rows.append(Row("bound", b.sides[-1][0], f"budget {b.budget:.1f} devices: {b.label}"))
        rows[-1].runs = [_mix([(f[i].result(), w) for f, w in sides]) for i in range(len(seeds))]
    log(f"runs: {len(seen) * len(seeds)} full ({len(seen)} distinct configurations x {len(seeds)} seeds), "
        f"{trials} short tuning runs")
    order = ["fixed", "fixed tuned", "static-pd", "static-pd tuned", "rlboost+", "rlboost+ tuned", "roll-partial",
             "roll-partial tuned", *PLANNED, "pearl", "bound", *ABLATIONS]
    return sorted(rows, key=lambda r: order.index(r.name))


def _tuners(cfg: ScenarioConfig, pearl: list[Future], ex: ProcessPoolExecutor, th: ThreadPoolExecutor,
            legacy: bool) -> dict[str, Future]:
    """Each baseline's tuning and the bound's (after PEARL's runs, which set its budget), as futures:
    threads submitting their trials to the shared pool `ex`, or, `legacy`, each done in turn here
    with the exhaustive search."""
    def bound() -> Bound:
        return tune_bound(cfg, bound_budget(cfg, [f.result() for f in pearl]), pool=ex, prune=not legacy)

    def one(p: str) -> Tuned:
        return tune(cfg, p, extra={"policy": {"name": p}}, pool=ex, prune=not legacy)
    jobs: dict[str, Any] = {**{p: (lambda p=p: one(p)) for p in BASELINES}, "bound": bound}
    if not legacy:
        return {k: th.submit(fn) for k, fn in jobs.items()}
    out: dict[str, Future] = {}
    for k, fn in jobs.items():
        out[k] = Future()
        out[k].set_result(fn())
    return out


def _mix(runs: list[tuple[dict, float]]) -> dict:
    """A time-share of runs (the bound): throughputs weighted by their shares; the rest (timeline,
    utilisation, steps) from the run with the largest share."""
    out = dict(max(runs, key=lambda x: x[1])[0])
    out["throughput"] = {k: sum(r["throughput"][k] * w for r, w in runs) for k in ("trajectories_per_s", "tokens_per_s")}
    return out


def _avg_devices(run: dict, pools: tuple[str, ...], labels: tuple[str, ...]) -> float:
    """Time-averaged devices of `pools` whose timeline label is one of `labels`."""
    ro = run.get("roles")
    if not ro:
        return math.nan
    pool = dict((i, p) for i, p in ro["devices"])
    s = sum(b - a for i, a, b, lab in ro["intervals"] if pool[i] in pools and lab in labels)
    return s / max(ro["T"], 1e-9)


def table_rows(rows: list[Row]) -> list[dict[str, Any]]:
    """One dict per row: the figures the table prints (and compare writes to results.json)."""
    by = {r.name: r for r in rows}
    ref = {k: by[k].mean("throughput.trajectories_per_s") for k in ("fixed", "rlboost+ tuned", "bound") if k in by}
    out = []
    for r in rows:
        thr = r.mean("throughput.trajectories_per_s")
        first = r.runs[0] if r.runs else {}
        out.append({
            "policy": r.name, "note": r.note,
            "traj_s": thr, "traj_s_std": r.std("throughput.trajectories_per_s"),
            "tok_s": r.mean("throughput.tokens_per_s"), "tok_s_std": r.std("throughput.tokens_per_s"),
            **{f"vs {k}": (thr / v if v else math.nan) for k, v in ref.items()},
            "trainer_wait_s": max((_get(x, "trainer.wait_for_devices_s") for x in r.runs), default=math.nan),
            "switches": r.mean("reconfiguration.switches"),
            "lent_avg": _avg_devices(first, ("train",), ("lent",)),
            "elastic_avg": _avg_devices(first, ("elastic",), ("prefill", "decode", "mixed", "starting")),
            "util": first.get("utilisation", {}).get("by_pool", {}),
        })
    return out


def format_table(rows: list[Row]) -> str:
    """A plain-text table (markdown-compatible)."""
    data = table_rows(rows)
    refs = [k for k in data[0] if k.startswith("vs ")] if data else []
    head = ["policy", "traj/s", "tokens/s", *[f"/{k[3:]}" for k in refs], "trainer wait s", "switches",
            "lent (avg dev)", "elastic used (avg dev)", "knobs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in data:
        cells = [d["policy"], f"{d['traj_s']:.3f} ± {d['traj_s_std']:.3f}", f"{d['tok_s']:.0f} ± {d['tok_s_std']:.0f}",
                 *[f"{d[k]:.2f}" for k in refs], f"{d['trainer_wait_s']:.1f}", f"{d['switches']:.1f}",
                 f"{d['lent_avg']:.2f}", f"{d['elastic_avg']:.2f}", d["note"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def best_baseline(rows: list[Row]) -> Row | None:
    """The baseline row (tuned or planned) with the highest mean trajectories/s."""
    return max((r for r in rows if is_baseline(r.name) and r.runs),
               key=lambda r: r.mean("throughput.trajectories_per_s"), default=None)


def headline(rows: list[Row]) -> dict[str, float]:
    """PEARL over the best baseline (tuned or planned) and over the bound."""
    by = {r.name: r.mean("throughput.trajectories_per_s") for r in rows}
    b = best_baseline(rows)
    best = b.mean("throughput.trajectories_per_s") if b is not None else math.nan
    p = by.get("pearl", math.nan)
    return {"pearl_over_best_baseline": p / best if best else math.nan,
            "pearl_over_bound": p / by["bound"] if by.get("bound") else math.nan}


def write(rows: list[Row], out_dir: Path) -> list[Path]:
    """results.json (the table's figures, each run's throughput per step) and the PNGs."""
    from pearl.compare_plots import plot_all

    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"rows": table_rows(rows), "headline": headline(rows),
            "runs": {r.name: [{k: x[k] for k in ("seed", "throughput", "trainer", "utilisation", "layout_final")}
                              for x in r.runs] for r in rows}}
    p = out_dir / "results.json"
    p.write_text(json.dumps(data, indent=1, default=str))
    return [p, *plot_all(rows, out_dir, best_baseline(rows))]
