"""Trajectories still running, as the workload estimate can use them: right-censored observations.

Early in a run the trajectories that have finished are the short ones: a long one is still running,
so an estimate from the finished alone is biased short (the first decisions of a run are taken on
it). A trajectory in flight says something all the same: it has at least the turns it has started,
and the turn in progress has at least the tokens generated so far. `complete` turns each one into a
whole trajectory drawn from the Kaplan–Meier estimates of the two distributions that censoring cuts:

- turns per trajectory (discrete): a finished trajectory ended at its turn count; one in flight is
  known to reach at least the turns it started, and its outcome after them is unknown;
- response tokens per turn: every completed turn is an observation, the turn in progress is censored
  at the tokens it has so far.

Each trajectory in flight keeps what it ran and draws the rest conditionally: its turn count given
at least the turns started, the turn in progress given at least its tokens so far, later turns from
the whole response distribution, their observations and environment latencies from those seen.
Beyond the largest value seen the estimates put the remaining mass at that value (a lower bound).
Draws come from a generator seeded by the trajectories in flight: the same inputs, the same answer.
Pure: no clocks, no I/O.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from pearl.workloads import TrajectorySpec

__all__ = ["Running", "complete"]

Running = tuple[TrajectorySpec, bool]  # a trajectory as far as it ran; True: its last turn is in progress


def _km(values: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kaplan–Meier over continuous values (censored: the true value is at least this): the support
    and its masses, what survives the largest event put on the largest value seen."""
    order = np.lexsort((censored, values))  # at a tie, events before censorings
    v, c = values[order], censored[order]
    at_risk = len(v) - np.arange(len(v))
    mass = _masses(np.where(c, 0.0, 1.0 / at_risk))
    keep = mass > 0
    return v[keep], mass[keep]


def _km_turns(ended: np.ndarray, reached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Discrete Kaplan–Meier of the turn count: `ended` finished at that many turns, `reached` are
    known to reach at least that many (whether they end there is not known yet)."""
    top = int(max(ended.max(initial=1), reached.max(initial=1)))
    js = np.arange(1, top + 1)
    d = np.array([(ended == j).sum() for j in js], float)
    n = np.array([(ended >= j).sum() + (reached > j).sum() for j in js], float)
    return js, _masses(np.divide(d, n, out=np.zeros_like(d), where=n > 0))


def _masses(hazard: np.ndarray) -> np.ndarray:
    """The masses a sequence of hazards leaves at each point, what survives the last put on it."""
    surv = np.cumprod(1.0 - hazard)
    mass = np.concatenate([[1.0], surv[:-1]]) - surv
    mass[-1] += surv[-1]
    return mass


class _Dist:
    """A discrete distribution (sorted support, masses), drawn from by inverse CDF, many at once."""

    def __init__(self, support: np.ndarray, mass: np.ndarray):
        self.support, self.cdf = support, np.cumsum(mass)

    def draw(self, rng: np.random.Generator, at_least: np.ndarray) -> np.ndarray:
        """One draw per lower bound in `at_least`, given it (the bound itself where nothing is above)."""
        at_least = np.asarray(at_least, float)
        i = np.searchsorted(self.support, at_least, side="left")
        below = np.where(i > 0, self.cdf[np.maximum(i - 1, 0)], 0.0)
        left = self.cdf[-1] - below
        u = below + rng.random(len(at_least)) * left
        j = np.minimum(np.searchsorted(self.cdf, u, side="right"), len(self.support) - 1)
        return np.where((i < len(self.support)) & (left > 1e-12), self.support[j], at_least)


def complete(finished: list[TrajectorySpec], running: Iterable[Running]) -> list[TrajectorySpec]:
    """The trajectories in flight, each completed by conditional draws (module docstring)."""
    running = [(r, partial) for r, partial in running if r.turns > 0]
    if not running:
        return []
    resp, cens = [], []
    for f in finished:
        resp += f.responses
        cens += [False] * f.turns
    for r, partial in running:
        resp += r.responses
        cens += [False] * (r.turns - 1) + [partial]
    r_dist = _Dist(*_km(np.array(resp, float), np.array(cens, bool)))
    k = np.array([r.turns for r, _ in running])
    t_dist = _Dist(*_km_turns(np.array([f.turns for f in finished]), k))
    obs = np.array([o for s in [*finished, *(r for r, _ in running)] for o in s.observations] or [0], float)
    env = np.array([e for f in finished for e in f.env_latency] or [0.0], float)
    rng = np.random.default_rng([len(running), sum(r.index for r, _ in running), 7723])
    turns = np.maximum(k, t_dist.draw(rng, k).astype(int))
    last = np.array([r.responses[-1] for r, _ in running], float)
    partial = np.array([p for _, p in running])
    last = np.where(partial, np.maximum(last, r_dist.draw(rng, np.where(partial, last, -np.inf))), last).astype(int)
    more = np.maximum(1, r_dist.draw(rng, np.full(int((turns - k).sum()), -np.inf))).astype(int).tolist()
    n_obs = turns - 1 - np.array([len(r.observations) for r, _ in running])
    new_obs = np.maximum(1, obs[rng.integers(len(obs), size=int(n_obs.sum()))]).astype(int).tolist()
    new_env = env[rng.integers(len(env), size=int(turns.sum()))].tolist()
    out, m, o, e = [], 0, 0, 0
    for (r, _), n, x, b, lst in zip(running, turns.tolist(), k.tolist(), n_obs.tolist(), last.tolist()):
        envs = [v if v > 0 else new_env[e + i] for i, v in enumerate(r.env_latency[:x])] + new_env[e + x:e + n]
        out.append(TrajectorySpec(r.index, r.group, r.prompt_tokens, (*r.responses[:-1], lst, *more[m:m + n - x]),
                                  (*r.observations, *new_obs[o:o + b]), tuple(envs)))
        m, o, e = m + n - x, o + b, e + n
    return out
