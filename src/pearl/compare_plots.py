"""The PNGs of `pearl compare` (matplotlib, Agg canvas): what `pearl.runtime.compare` measured.

- `throughput.png`: trained trajectories/s over virtual time (per training step, smoothed over 5
  steps), first seed, for the tuned baselines, PEARL and the bound (the side of its time-share with
  the larger share); a bar panel with every row's mean ± std over seeds.
- `timeline.png`: device x time, coloured by what each device did (`pearl.runtime.timeline.LABELS`),
  for PEARL, the best baseline (tuned or planned) and the bound (first seed).
- `utilisation.png`: busy share of each pool's available device-seconds, per row (first seed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

__all__ = ["COLORS", "plot_all"]

COLORS = {"prefill": "#1f77b4", "decode": "#ff7f0e", "mixed": "#2ca02c", "starting": "#bcbd22",
          "training": "#9467bd", "lent": "#d62728", "idle": "#e6e6e6"}
MAIN = ("fixed tuned", "static-pd tuned", "rlboost+ tuned", "roll-partial tuned", "plan-static", "plan-warmup",
        "pearl", "bound")


def _series(run: dict[str, Any], k: int = 5) -> tuple[list[float], list[float]]:
    """(t, trajectories/s) per training step, a rolling mean over `k` steps."""
    steps = run.get("per_step", [])
    ts, rates = [], []
    for i in range(k, len(steps)):
        span = steps[i]["t_end"] - steps[i - k]["t_end"]
        if span > 0:
            ts.append(steps[i]["t_end"])
            rates.append(sum(s["trajectories"] for s in steps[i - k + 1:i + 1]) / span)
    return ts, rates


def plot_throughput(rows: list[Any], path: Path) -> Path:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    for r in rows:
        if r.name in MAIN and r.runs:
            t, y = _series(r.runs[0])
            name = "bound (its larger-share side)" if r.name == "bound" else r.name
            ax.plot([x / 60 for x in t], y, label=name, lw=2.2 if r.name in ("pearl", "bound") else 1.3,
                    ls="--" if r.name == "bound" else "-")
    ax.set_xlabel("virtual time (min)")
    ax.set_ylabel("trained trajectories/s (5-step mean)")
    ax.set_title("throughput over time (first seed)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    names = [r.name for r in rows]
    means = [r.mean("throughput.trajectories_per_s") for r in rows]
    stds = [r.std("throughput.trajectories_per_s") for r in rows]
    colors = ["#d62728" if n == "pearl" else "#7f7f7f" if n == "bound" else
              "#9467bd" if n.startswith("pearl") else "#1f77b4" for n in names]
    bx.barh(range(len(rows)), means, xerr=stds, color=colors)
    bx.set_yticks(range(len(rows)), names, fontsize=8)
    bx.invert_yaxis()
    bx.set_xlabel(f"steady-state trajectories/s (mean ± std over {len(rows[0].runs)} seeds)")
    bx.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(rows: list[Any], path: Path, best: Any = None) -> Path:
    show = [r for r in rows if r.name == "pearl"] + ([best] if best else []) + [r for r in rows if r.name == "bound"]
    show = [r for r in show if r.runs and r.runs[0].get("roles")]
    fig, axes = plt.subplots(len(show), 1, figsize=(14, 3.2 * max(1, len(show))), squeeze=False)
    for ax, r in zip(axes[:, 0], show):
        ro = r.runs[0]["roles"]
        order = sorted(ro["devices"], key=lambda d: ({"rollout": 0, "elastic": 1, "train": 2}.get(d[1], 3), d[0]))
        y = {d[0]: i for i, d in enumerate(order)}
        by_label: dict[str, list] = {}
        for dev, a, b, lab in ro["intervals"]:
            by_label.setdefault(lab, []).append((dev, a, b))
        for lab, iv in by_label.items():
            ax.barh([y[d] for d, _, _ in iv], [(b - a) / 60 for _, a, b in iv], left=[a / 60 for _, a, _ in iv],
                    height=1.0, color=COLORS.get(lab, "k"), linewidth=0)
        ax.set_xlim(0, ro["T"] / 60)
        ax.set_ylim(len(order) - 0.5, -0.5)
        ticks = [i for i, d in enumerate(order) if i == 0 or order[i - 1][1] != d[1]]
        ax.set_yticks(ticks, [order[i][1] for i in ticks], fontsize=8)
        ax.set_ylabel("device")
        ax.set_title(f"{r.name}: what each device did (first seed)", fontsize=10)
    axes[-1, 0].set_xlabel("virtual time (min)")
    fig.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper right", ncol=7, fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_utilisation(rows: list[Any], path: Path) -> Path:
    pools = ("rollout", "train", "elastic")
    fig, ax = plt.subplots(figsize=(14, 4.5))
    w = 0.27
    for j, pool in enumerate(pools):
        vals = [r.runs[0]["utilisation"]["by_pool"].get(pool, 0.0) if r.runs else 0.0 for r in rows]
        ax.bar([i + (j - 1) * w for i in range(len(rows))], vals, w, label=pool)
    ax.set_xticks(range(len(rows)), [r.name for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("busy share of available device-seconds")
    ax.set_ylim(0, 1.05)
    ax.set_title("utilisation by pool (first seed; elastic: 0 where a policy leaves the spot pool unused)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_all(rows: list[Any], out_dir: Path, best: Any = None) -> list[Path]:
    """Every plot; `best`: the best baseline's row, shown in the timeline next to PEARL and the bound."""
    return [plot_throughput(rows, out_dir / "throughput.png"), plot_timeline(rows, out_dir / "timeline.png", best),
            plot_utilisation(rows, out_dir / "utilisation.png")]
