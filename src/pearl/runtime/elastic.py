"""Elastic device traces: when external devices arrive, get a revocation notice, and leave.

- `poisson`: bursts of `burst` devices arrive at `arrival_rate_per_h` (Poisson), each stays a
  `lifetime_s` draw; arrivals that would exceed `max_devices` are dropped.
- `spot`: a pool of `max_devices` devices in node slots of `burst` devices (a node: they arrive and
  leave together). A node stays a `lifetime_s` draw, then its slot waits an exponential time (mean
  1 / `arrival_rate_per_h`) for a new node. Each slot has a seeded generator of its own and runs
  from `SPOT_WARMUP_S` before `start_s`, so at `start_s` the pool is in its steady state (a node
  there then joins at `start_s`), not artificially full.
- `constant`: the control for `spot`: the same pool, every node present from `start_s` on, never
  revoked.
- `csv`: one row per burst, `t_add,t_remove,count,notice_s` (`notice_s` empty = abrupt loss).

Every removal but `constant`'s comes with a `notice_s` notice with probability
`notice_probability`, else it is abrupt. Pure: a list of `Burst`s from a config and a seed.
"""
from __future__ import annotations

import csv
import math
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
    if cfg.kind in ("spot", "constant"):
        return spot_trace(cfg, horizon_s, seed)
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


def node_slots(cfg: ElasticConfig) -> list[int]:
    """Devices per node slot of a `spot` / `constant` pool: `max_devices` in nodes of `burst` (its
    constant value, or its median) devices, the last slot holding the remainder."""
    b = cfg.burst
    size = max(1, int(round({"constant": b.value, "lognormal": b.median, "uniform": b.low, "geometric": b.mean}[b.kind]
                            or 1)))
    n, rest = divmod(cfg.max_devices, size)
    return [size] * n + ([rest] if rest else [])


SPOT_WARMUP_S = 24 * 3600.0  # a day of slot history before start_s: many lifetimes + waits


def spot_trace(cfg: ElasticConfig, horizon_s: float, seed: int) -> list[Burst]:
    """The `spot` (or `constant`) pool's bursts up to `horizon_s` (see the module docstring)."""
    out: list[Burst] = []
    refill = cfg.arrival_rate_per_h / 3600.0
    for k, count in enumerate(node_slots(cfg)):
        if cfg.kind == "constant":
            out.append(Burst(cfg.start_s, math.inf, count, None))
            continue
        rng = np.random.default_rng([seed, 31337, k])
        t = cfg.start_s - SPOT_WARMUP_S
        while t < horizon_s:
            life = float(draw(cfg.lifetime_s, rng))
            notice = cfg.notice_s if rng.random() < cfg.notice_probability else None
            if t + life > cfg.start_s:  # (a node gone before the run starts is not in the trace)
                out.append(Burst(max(t, cfg.start_s), t + life, count, notice))
            if refill <= 0:
                break
            t += life + float(rng.exponential(1.0 / refill))
    return sorted(out, key=lambda b: (b.t_add, b.t_remove))


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
