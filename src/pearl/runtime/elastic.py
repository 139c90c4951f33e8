"""Elastic device traces: when external devices arrive, get a revocation notice, and leave.

Synthetic (Poisson bursts of a node's worth of devices with lognormal lifetimes, a notice that is
sometimes missing) or read from a CSV with one row per burst: `t_add,t_remove,count,notice_s`
(`notice_s` empty = abrupt loss). Pure: a list of `Burst`s from a config and a seed.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pearl.config import ElasticConfig
from pearl.errors import ConfigError
from pearl.workloads import draw


@dataclass(frozen=True, slots=True)
class Burst:
    t_add: float
    t_remove: float
    count: int
    notice_s: float | None  # None: abrupt loss


def trace(cfg: ElasticConfig, horizon_s: float, seed: int) -> list[Burst]:
    if cfg.kind == "none":
        return []
    if cfg.kind == "csv":
        return read_csv(Path(cfg.csv or ""))
    rng = np.random.default_rng([seed, 31337])
    out: list[Burst] = []
    t = cfg.start_s
    rate = cfg.arrival_rate_per_h / 3600.0
    present: list[Burst] = []
    while rate > 0:
        t += rng.exponential(1.0 / rate)
        if t >= horizon_s:
            break
        count = int(max(1, round(draw(cfg.burst, rng))))
        life = float(draw(cfg.lifetime_s, rng))
        notice = cfg.notice_s if rng.random() < cfg.notice_probability else None
        present = [b for b in present if b.t_remove > t]
        room = cfg.max_devices - sum(b.count for b in present)
        if room <= 0:
            continue
        b = Burst(float(t), float(t + life), min(count, room), notice)
        present.append(b)
        out.append(b)
    return out


def read_csv(path: Path) -> list[Burst]:
    if not path.is_file():
        raise ConfigError(f"cluster.elastic.csv: file not found: {path}")
    out = []
    with path.open() as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                n = row.get("notice_s") or ""
                b = Burst(float(row["t_add"]), float(row["t_remove"]), int(row["count"]),
                          float(n) if n.strip() else None)
            except (KeyError, ValueError, TypeError):
                raise ConfigError(f"{path}:{i}: expected columns t_add,t_remove,count,notice_s with numbers, "
                                  f"got {dict(row)}") from None
            if b.t_remove <= b.t_add or b.count < 1:
                raise ConfigError(f"{path}:{i}: need t_remove > t_add and count >= 1, got {dict(row)}")
            out.append(b)
    return sorted(out, key=lambda b: b.t_add)
