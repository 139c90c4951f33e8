"""Online estimates of what PEARL is not told: the workload's statistics and elastic lifetimes.

The controller predicts with `WorkloadStats`; nobody hands it the true distribution. Before any
trajectory has finished it uses a declared prior (`EstimateConfig`: generic medians with a spread, or
a prior the runtime measured, e.g. `pearl train`'s environment probe). From then on it uses the last
`window` finished trajectories the runtime reports (`Observation.finished`), blended with the prior
while the window is not yet full. Early in a run the finished ones are the short ones (the long ones
are still running), so while the window is not full the trajectories in flight count too, as far as
they ran (`Observation.running`), each completed by draws from the censored estimates
(`pearl.control.censored`). Only recent trajectories count, so a workload whose responses or
observations grow during training is tracked (`WorkloadEstimator.version` moves, and the controller
re-predicts every shape). Rebuilds happen after 1, 2, 4, ... new trajectories (a bad prior is left
quickly), then every `refresh`.

Elastic lifetimes: every elastic device the controller has seen arrive is exposure time; each one
gone is a lifetime ended. The expected stay is the exponential model's estimate with a prior of
`lifetime_prior_weight` lifetimes of `ControllerConfig.elastic_stay_s` (a Gamma prior on the rate):
(w·prior + exposure) / (w + ended), with devices that arrived together counted as one lifetime.
Pure: no clocks, no I/O.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable

import numpy as np

from pearl.config_estimate import EstimateConfig
from pearl.control.censored import Running, complete
from pearl.control.predictor import WorkloadStats
from pearl.types import DeviceStatus, Pool
from pearl.workloads import TrajectorySpec

__all__ = ["LifetimeEstimator", "WorkloadEstimator", "prior_stats"]

_Z90 = 1.2815515655446004  # standard normal 90th percentile


def prior_stats(cfg: EstimateConfig, samples: int = 256, seed: int = 4242) -> WorkloadStats:
    """The declared prior as samples: each quantity lognormal (median as given, p90 = spread x it)."""
    rng = np.random.default_rng(seed)
    sig = math.log(cfg.prior_spread) / _Z90

    def ln(median: float, size: int | None = None):
        return median * np.exp(sig * rng.standard_normal(size))

    specs = []
    for i in range(samples):
        k = int(min(max(round(float(ln(cfg.prior_turns))), 1), 10 * cfg.prior_turns + 1))
        resp = np.maximum(1, ln(cfg.prior_response_tokens, k)).astype(int)
        obs = np.maximum(1, ln(cfg.prior_observation_tokens, k - 1)).astype(int)
        specs.append(TrajectorySpec(i, i, max(1, int(ln(cfg.prior_prompt_tokens))), tuple(int(x) for x in resp),
                                    tuple(int(x) for x in obs),
                                    tuple(float(x) for x in ln(cfg.prior_env_latency_s, k))))
    return WorkloadStats.from_samples(specs)


class WorkloadEstimator:
    """The workload statistics from the trajectories seen finishing (module docstring)."""

    def __init__(self, cfg: EstimateConfig, prior: WorkloadStats | None = None):
        self.cfg = cfg
        self.prior = prior if prior is not None else prior_stats(cfg)
        self.window: deque[TrajectorySpec] = deque(maxlen=cfg.window)
        self.seen = 0  # finished trajectories consumed (the runtime's counter)
        self.pending = 0  # observed since the last rebuild
        self.version = 0  # bumped on every rebuild of `stats`
        self.used = 0  # observed trajectories `stats` was built from
        self.used_running = 0  # of which in flight (completed by `censored.complete`)
        self._summary: tuple[int, dict] = (-1, {})  # (version, summary)
        self.stats = self.prior

    def observe(self, finished: Iterable[TrajectorySpec], count: int, running: Iterable[Running] = ()) -> bool:
        """Take the runtime's most recent finished trajectories (`finished`, oldest first), its counter
        of all finished so far and the trajectories in flight as far as they ran (`running`: each with
        whether its last turn is still in progress); True when `stats` was rebuilt."""
        new = count - self.seen
        if new <= 0:
            self.seen = min(self.seen, count)
            return False
        recent = list(finished)[-new:]
        self.window.extend(s for s in recent if s.turns > 0)
        self.seen, self.pending = count, self.pending + len(recent)
        n = len(self.window)
        if not n or self.pending < min(self.cfg.refresh, max(1, n // 2)):
            return False
        w = round(self.cfg.prior_weight * max(0.0, 1.0 - n / self.cfg.window))
        more = complete(list(self.window), running) if n < self.cfg.window else []
        self.stats = WorkloadStats.from_samples([*self.window, *more], self.prior, w)
        self.pending, self.version, self.used, self.used_running = 0, self.version + 1, n + len(more), len(more)
        return True

    def summary(self) -> dict[str, float]:
        """Means of the current estimate (what a decision record shows; computed once per rebuild)."""
        if self._summary[0] != self.version:
            s = self.stats
            self._summary = (self.version, {
                "trajectories": self.used, "in_flight": self.used_running, "turns": round(s.mean("turns"), 2),
                "response_tokens": round(s.mean("response_tokens"), 1),
                "observation_tokens": round(s.mean("observation_tokens"), 1),
                "env_latency_s": round(s.mean("env_latency_s"), 3)})
        return dict(self._summary[1])


class LifetimeEstimator:
    """Expected stay of an elastic device, from the arrivals and removals observed (module docstring)."""

    def __init__(self, prior_s: float, prior_weight: float):
        self.prior_s, self.prior_w = prior_s, prior_weight
        self.arrived: dict[int, tuple[float, float]] = {}  # device -> (arrival t, weight 1/burst size)
        self.ended_exposure, self.ended = 0.0, 0.0

    def observe(self, t: float, devices: Iterable) -> None:
        """`devices`: the observation's `DeviceObs`; elastic ones not seen before arrived now, known
        ones now gone (or no longer listed) ended now."""
        live = {d.id for d in devices if d.pool is Pool.ELASTIC and d.status is not DeviceStatus.GONE}
        new = [d for d in live if d not in self.arrived]
        for d in new:
            self.arrived[d] = (t, 1.0 / len(new))
        for d in [d for d in self.arrived if d not in live]:
            t0, w = self.arrived.pop(d)
            self.ended_exposure += w * (t - t0)
            self.ended += w

    def expected_stay_s(self, t: float) -> float:
        if self.prior_w + self.ended <= 0:
            return self.prior_s
        alive = sum(w * (t - t0) for t0, w in self.arrived.values())
        return (self.prior_w * self.prior_s + self.ended_exposure + alive) / max(self.prior_w + self.ended, 1e-9)
