"""`pearl report RUN`: PNG plots and one report.html for a `pearl train` run directory or a
`pearl simulate` result JSON.

A run directory needs `metrics.jsonl` (one JSON object per training step); `summary.json` and
`trace.json` are used when present. A simulation result is the JSON `pearl simulate --out` saves; its
role timeline comes from the trace `pearl simulate --trace` writes (`--trace`, else `<result>-trace.json`
or `<result>.trace.json` beside the result). The plots, each left out when its data is missing:

- reward.png: mean reward (± one standard deviation) and success rate per step (train runs only);
- throughput.png: trajectories/s and tokens/s per step;
- staleness.png: policy staleness per step, with η (and the simulator's staleness histogram);
- utilisation.png: known utilisation (trainer and engine busy time, or busy device time by pool) and,
  from the trace, the share of device (or worker) time in each role;
- timeline.png: device/worker × time coloured by role (prefill, decode, mixed, loading, training,
  idle, lent; hatched = a lent train device), the trainer's steps and the controller's decisions.

report.html embeds them by relative path, with a summary table. Plots are drawn with matplotlib's Agg
canvas (no display needed). A missing or empty input is a `ConfigError` (one line in the CLI).
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError
from pearl.runtime.trace import STATES, state_shares, timeline_rows, tracks

__all__ = ["load_run", "write_report"]

COLOURS = {"prefill": "#e8862a", "decode": "#2b79b9", "mixed": "#3b9e4b", "loading": "#c9c23f",
           "training": "#c43c3c", "idle": "#dadada", "lent": "#8f5db7"}
MAX_ROWS = 64  # timeline rows drawn at most


# ------------------------------------------------------------------------------------------ reading
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: not a readable JSON file ({str(err).splitlines()[0]})") from None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except ValueError:
                raise ConfigError(f"{path}:{i}: not valid JSON") from None
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _fmt(x: Any) -> str:
    return (f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}") if isinstance(x, float) else "-" if x is None else str(x)


def _rate(counts: list[float], t_end: list[float]) -> list[float]:
    """Per-step rates: count / time since the previous step ended (the first: since t=0)."""
    prev = [0.0] + t_end[:-1]
    return [c / (b - a) if b > a else float("nan") for c, a, b in zip(counts, prev, t_end)]


def _train_run(d: Path) -> dict[str, Any]:
    mpath = d / "metrics.jsonl"
    if not mpath.is_file():
        raise ConfigError(f"{d} has no metrics.jsonl: not a pearl train run directory")
    rows = _read_jsonl(mpath)
    if not rows:
        raise ConfigError(f"{mpath} is empty: the run logged no training step")
    summ = _read_json(d / "summary.json") if (d / "summary.json").is_file() else {}
    col = lambda k: [r.get(k) for r in rows]  # noqa: E731
    steps = [r.get("step", i) for i, r in enumerate(rows, 1)]
    util: dict[str, float] = {}
    known = [(r["step_s"], r["wait_for_batch_s"]) for r in rows if r.get("step_s") and
             r.get("wait_for_batch_s") is not None]
    if known:
        util["trainer busy"] = 1 - sum(w for _, w in known) / sum(s for s, _ in known)
    if summ.get("engine_busy_s") is not None and summ.get("wall_s"):
        # "layout" is e.g. "1P:1D (prefill+decode)": the first layout's workers
        m = re.search(r"\(([a-z+]+)\)", str(summ.get("layout", "")))
        n = len(m.group(1).split("+")) if m else 1
        what = (f"mean of {n} workers" if n > 1 else "1 worker") if m else "busy s per wall s"
        util[f"rollout engines busy\n({what})"] = summ["engine_busy_s"] / summ["wall_s"] / n
    traj = summ.get("trajectories", {})
    table = [("run", summ.get("name", d.name)), ("model / env", f"{summ.get('model', '-')} / {summ.get('env', '-')}"),
             ("steps", len(rows)), ("wall s", summ.get("wall_s", rows[-1].get("elapsed_s"))),
             ("reward first-5 → last-5", f"{_fmt(summ.get('reward_first5'))} → {_fmt(summ.get('reward_last5'))}"),
             ("trajectories ok / failed / stale",
              f"{traj.get('ok', '-')} / {traj.get('failed', '-')} / {traj.get('stale', '-')}"),
             ("staleness max (η)", f"{_fmt(summ.get('staleness_max'))} ({_fmt(summ.get('staleness_eta'))})"),
             ("layout", summ.get("controller", {}).get("layout_final", rows[-1].get("layout"))),
             ("controller decisions", len(summ.get("decisions", [])))]
    return {"kind": "train", "title": f"pearl train · {summ.get('name', d.name)}", "steps": steps,
            "reward": col("reward_mean"), "reward_std": col("reward_std"), "success": col("success_rate"),
            "traj_s": col("trajectories_per_s"), "tok_s": col("tokens_per_s"), "dt": col("step_s"),
            "staleness": {"mean (trained batch)": col("staleness_mean"), "max (trained batch)": col("staleness_max")},
            "eta": summ.get("staleness_eta"), "hist": None, "util": util,
            "table": table, "time_unit": "wall s"}


def _sim_run(res: dict[str, Any]) -> dict[str, Any]:
    ps = res.get("per_step") or []
    t_end = [s["t_end"] for s in ps]
    thr = res.get("throughput", {})
    rec = res.get("reconfiguration", {})
    table = [("scenario", res.get("scenario")), ("policy · seed", f"{res.get('policy')} · {res.get('seed')}"),
             ("virtual s", res.get("virtual_s")), ("train steps", res.get("train_steps")),
             ("trajectories/s (steady state)", thr.get("trajectories_per_s")),
             ("tokens/s (steady state)", thr.get("tokens_per_s")),
             ("trained / discarded (stale)", f"{res.get('trained_trajectories')} / {res.get('discarded_stale')}"),
             ("switches / decisions", f"{rec.get('switches', '-')} / {rec.get('decisions', '-')}"),
             ("final layout", res.get("layout_final"))]
    return {"kind": "sim", "title": f"pearl simulate · {res.get('scenario')} · {res.get('policy')}",
            "steps": [s["step"] for s in ps], "reward": [], "reward_std": [], "success": [],
            "traj_s": _rate([s["trajectories"] for s in ps], t_end), "tok_s": _rate([s["tokens"] for s in ps], t_end),
            "dt": [b - a for a, b in zip([0.0] + t_end[:-1], t_end)],
            "staleness": {"max (trained batch)": [s.get("max_staleness") for s in ps]}, "eta": None,
            "hist": res.get("staleness_histogram") or None,
            "util": {f"{k} pool": v for k, v in res.get("utilisation", {}).get("by_pool", {}).items()
                     if v or k != "elastic"},  # no elastic devices: no elastic bar
            "steady_traj": thr.get("trajectories_per_s"), "steady_tok": thr.get("tokens_per_s"),
            "table": table, "time_unit": "virtual s"}


def _trace_path(path: Path, given: Path | None) -> Path | None:
    if given is not None:
        if not given.is_file():
            raise ConfigError(f"--trace {given}: no such file")
        return given
    cands = [path / "trace.json"] if path.is_dir() else \
        [path.with_name(path.stem + "-trace.json"), path.with_name(path.stem + ".trace.json")]
    return next((c for c in cands if c.is_file()), None)


def load_run(path: Path, trace: Path | None = None) -> dict[str, Any]:
    """The run at `path` (a `pearl train` directory or a `pearl simulate` result), normalised for plotting."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path} does not exist: expected a pearl train run directory or a pearl simulate result")
    if path.is_dir():
        run = _train_run(path)
    else:
        res = _read_json(path)
        if not isinstance(res, dict) or "per_step" not in res or "throughput" not in res:
            raise ConfigError(f"{path} is not a pearl simulate result (no per_step/throughput)")
        run = _sim_run(res)
    tp = _trace_path(path, trace)
    run["trace"] = _read_json(tp) if tp is not None else None
    run["trace_path"] = tp
    if run["trace"] is not None and not isinstance(run["trace"], dict):
        raise ConfigError(f"{tp} is not a Chrome trace (expected an object with traceEvents)")
    return run


# ------------------------------------------------------------------------------------------ plotting
def _figure(w: float, h: float, rows: int = 1, ratios: list[float] | None = None) -> tuple[Any, Any]:
    """A figure on matplotlib's Agg canvas (no pyplot, no display) and its `rows` stacked axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 1, squeeze=False, height_ratios=ratios)[:, 0]


def _ints(ax: Any, y: bool = False) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if y:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _window_rate(steps: list[Any], rates: list[Any], dts: list[Any], w: int = 5) -> tuple[list[Any], list[float]]:
    """The rate over the last `w` steps (Σ rate·dt / Σ dt): the jagged per-step rates read better with it."""
    pts = [(x, r * d, d) for x, r, d in zip(steps, rates, dts)
           if isinstance(r, (int, float)) and r == r and isinstance(d, (int, float)) and d > 0]
    out = []
    for i in range(len(pts)):
        win = pts[max(0, i - w + 1):i + 1]
        out.append(sum(p[1] for p in win) / sum(p[2] for p in win))
    return [p[0] for p in pts], out


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _xy(steps: list[Any], ys: list[Any]) -> tuple[list[Any], list[float]]:
    pts = [(x, y) for x, y in zip(steps, ys) if isinstance(y, (int, float)) and y == y]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def _plot_reward(run: dict[str, Any], path: Path) -> bool:
    xs, ys = _xy(run["steps"], run["reward"])
    if not xs:
        return False
    fig, (ax,) = _figure(7.5, 3.6)
    ax.plot(xs, ys, "o-", color="#2b79b9", label="mean reward")
    sx, sd = _xy(run["steps"], [s if r is not None else None for r, s in zip(run["reward"], run["reward_std"])])
    if len(sx) == len(xs):
        ax.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)],
                        color="#2b79b9", alpha=0.15, label="± 1 std")
    qx, qy = _xy(run["steps"], run["success"])
    if qx:
        ax.plot(qx, qy, "s--", color="#3b9e4b", label="success rate")
    ax.set(title="Reward per training step", xlabel="training step", ylabel="reward / success rate")
    _ints(ax)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.savefig(path)
    return True


def _plot_throughput(run: dict[str, Any], path: Path) -> bool:
    (tx, ty), (kx, ky) = _xy(run["steps"], run["traj_s"]), _xy(run["steps"], run["tok_s"])
    if not tx and not kx:
        return False
    fig, (a, b) = _figure(7.5, 5.0, 2)
    unit = run["time_unit"]
    for ax, (xs, ys), what, c, key in ((a, (tx, ty), "trajectories", "#3b9e4b", "traj"),
                                       (b, (kx, ky), "tokens", "#e8862a", "tok")):
        steady = run.get(f"steady_{key}")
        ax.plot(xs, ys, "o-", color=c, alpha=0.45, ms=4, label=f"{what}/s, per step")
        if len(xs) >= 5:
            ax.plot(*_window_rate(run["steps"], run[f"{key}_s"], run["dt"]), "-", color=c, lw=2,
                    label="over the last 5 steps")
        if steady:
            ax.axhline(steady, color="black", ls="--", lw=1, label=f"steady state {_num(steady)}")
        ax.set(ylabel=f"{what} / {unit}")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(loc="lower right", fontsize=8)
        _ints(ax)
    a.set(title="Throughput per training step (since the previous step)")
    b.set(xlabel="training step")
    fig.savefig(path)
    return True


def _plot_staleness(run: dict[str, Any], path: Path) -> bool:
    series = {k: _xy(run["steps"], v) for k, v in run["staleness"].items()}
    series = {k: v for k, v in series.items() if v[0]}
    if not series:
        return False
    hist = run["hist"]
    fig, axes = _figure(7.5, 5.6 if hist else 3.4, 2 if hist else 1)
    ax = axes[0]
    for (k, (xs, ys)), m in zip(series.items(), ("o-", "s--", "^:")):
        ax.plot(xs, ys, m, label=k)
    top = max([v for _, ys in series.values() for v in ys] + [run["eta"] or 0])
    if run["eta"] is not None:
        ax.axhline(run["eta"], color="#c43c3c", ls=":", lw=2.5, label=f"η = {run['eta']} (bound)")
    ax.set(title="Policy staleness of the trained trajectories", xlabel="training step",
           ylabel="versions behind the trainer")
    ax.set_ylim(-0.2, top + 0.6)
    _ints(ax, y=True)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    if hist:
        ks = sorted(hist, key=int)
        axes[1].bar([int(k) for k in ks], [hist[k] for k in ks], color="#2b79b9")
        axes[1].set(title="Staleness histogram (all trained trajectories)", xlabel="staleness (versions)",
                    ylabel="trajectories", xticks=[int(k) for k in ks])
    fig.savefig(path)
    return True


def _plot_utilisation(run: dict[str, Any], rows: list[Any], path: Path) -> bool:
    util, shares = run["util"], state_shares(rows)
    if not util and not shares:
        return False
    fig, axes = _figure(7.5, 1.4 + 0.45 * len(util) + 1.3 * bool(shares), bool(util) + bool(shares),
                        ratios=[max(len(util), 1.5)] * bool(util) + [1.2] * bool(shares))
    i = 0
    if util:
        ks = list(util)
        axes[0].barh(ks, [util[k] for k in ks], color="#2b79b9")
        for y, k in enumerate(ks):
            axes[0].text(util[k], y, f" {util[k]:.0%}", va="center")
        what = "busy device time / available, by pool" if run["kind"] == "sim" else "busy time / wall time"
        axes[0].set(title=f"Utilisation ({what})", xlabel="fraction", xlim=(0, max(1.1, max(util.values()) * 1.2)))
        axes[0].invert_yaxis()
        i = 1
    if shares:
        ax, left = axes[i], 0.0
        for k, v in shares.items():
            ax.barh([0], [v], left=left, color=COLOURS.get(k, "#777777"), label=f"{k} {v:.0%}")
            left += v
        ax.set(title="Share of tracked device/worker time by role (from the trace)", xlim=(0, 1), yticks=[],
               xlabel="fraction of time")
        fig.legend(loc="outside lower center", ncol=min(len(shares), 7), fontsize=8)
    fig.savefig(path)
    return True


def _rank(state: str) -> tuple[int, str]:
    return (STATES.index(state) if state in STATES else len(STATES), state)


def _acted(d: dict[str, Any]) -> bool:
    """A decision that changed something: a switch, or a lend."""
    return bool(d.get("switch") or d.get("borrow"))


def _plot_timeline(run: dict[str, Any], rows: list[Any], path: Path) -> bool:
    if not rows:
        return False
    decisions = tracks(run["trace"])[1].get("controller", [])
    rows = rows[:MAX_ROWS]
    n = len(rows) + bool(decisions)
    fig, (ax,) = _figure(10, 1.4 + 0.3 * n)
    seen: set[str] = set()
    for y, (name, spans) in enumerate(rows):
        by: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for start, dur, state, lent in spans:
            by.setdefault((state, lent), []).append((start, dur))
        for (state, lent), xr in by.items():
            ax.broken_barh(xr, (y - 0.4, 0.8), facecolors=COLOURS.get(state, "#777777"),
                           hatch="///" if lent else None, edgecolor="white" if lent else "none", linewidth=0)
            seen.add(state)
    labels = [r[0] for r in rows]
    if decisions:
        y = len(rows)
        acts = [_acted(e.get("args", {})) for e in decisions]
        sw = [e["ts"] / 1e6 for e, a in zip(decisions, acts) if a]
        keep = [e["ts"] / 1e6 for e, a in zip(decisions, acts) if not a]
        ax.plot(keep, [y] * len(keep), "|", color="#555555", ms=10, label="decision: keep / no change")
        ax.plot(sw, [y] * len(sw), "v", color="black", ms=7, label="decision: switch / lend")
        labels.append("controller")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first row on top
    ax.set(title="Role timeline (what each device/worker did over time)", xlabel=f"time ({run['time_unit']})")
    import matplotlib.patches as mp

    handles = [mp.Patch(color=COLOURS.get(s, "#777777"), label=s) for s in sorted(seen, key=_rank)]
    handles += [h for h in ax.get_legend_handles_labels()[0]]
    if any(lent for _, sp in rows for *_, lent in sp):
        handles.append(mp.Patch(facecolor="#999999", hatch="///", edgecolor="white", label="lent train device"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path)
    return True


# ------------------------------------------------------------------------------------------ report
def _html(run: dict[str, Any], figs: list[tuple[str, str]], notes: list[str], source: Path) -> str:
    e = html.escape
    table = "".join(f"<tr><th>{e(str(k))}</th><td>{e(_fmt(v))}</td></tr>" for k, v in run["table"])
    body = "".join(f'<h2>{e(cap)}</h2>\n<img src="{e(name)}" alt="{e(cap)}">\n' for name, cap in figs)
    note = "".join(f"<li>{e(n)}</li>" for n in notes)
    return ("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" + e(run["title"]) + "</title>\n"
            "<style>body{font-family:sans-serif;max-width:1150px;margin:1em auto;padding:0 1em}"
            "table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:3px 10px;text-align:left}"
            "th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}</style></head><body>\n"
            f"<h1>{e(run['title'])}</h1>\n<p>source: <code>{e(str(source))}</code></p>\n"
            f"<table>{table}</table>\n" + (f"<ul>{note}</ul>\n" if note else "") + body + "</body></html>\n")


def write_report(path: Path, out_dir: Path | None = None, trace: Path | None = None) -> Path:
    """Write the PNGs and report.html for the run at `path`; returns report.html's path. `out_dir`
    defaults to the run directory, or `<result>-report/` beside a simulation result."""
    path = Path(path)
    run = load_run(path, trace)
    out = Path(out_dir) if out_dir is not None else (path if path.is_dir() else
                                                    path.with_name(path.stem + "-report"))
    out.mkdir(parents=True, exist_ok=True)
    rows = timeline_rows(run["trace"]) if run["trace"] else []
    plots = [("reward.png", "Reward", lambda p: _plot_reward(run, p)),
             ("throughput.png", "Throughput", lambda p: _plot_throughput(run, p)),
             ("staleness.png", "Staleness", lambda p: _plot_staleness(run, p)),
             ("utilisation.png", "Utilisation", lambda p: _plot_utilisation(run, rows, p)),
             ("timeline.png", "Role timeline", lambda p: _plot_timeline(run, rows, p))]
    figs, notes = [], []
    for name, cap, draw in plots:
        if draw(out / name):
            figs.append((name, cap))
        else:
            notes.append(f"no {cap.lower()} plot: " + _missing(run, name))
    if run["trace"] and len(rows) > MAX_ROWS:
        notes.append(f"the timeline shows the first {MAX_ROWS} of {len(rows)} rows")
    page = out / "report.html"
    page.write_text(_html(run, figs, notes, path), encoding="utf-8")
    return page


def _missing(run: dict[str, Any], name: str) -> str:
    if name == "reward.png" and run["kind"] == "sim":
        return "a simulation has no rewards"
    if name in ("timeline.png", "utilisation.png") and not run["trace"]:
        return "no trace (pearl simulate --trace PATH; trace.json in a train run directory)"
    return "the run has no such data"
