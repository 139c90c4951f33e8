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
Draws come from a generator seeded by the trajectory's index: the same inputs, the same answer.
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
    hazard = np.where(c, 0.0, 1.0 / at_risk)
    surv = np.cumprod(1.0 - hazard)
    mass = np.concatenate([[1.0], surv[:-1]]) - surv
    mass[-1] += surv[-1]
    keep = mass > 0
    return v[keep], mass[keep]


def _km_turns(ended: np.ndarray, reached: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Discrete Kaplan–Meier of the turn count: `ended` finished at that many turns, `reached` are
    known to reach at least that many (whether they end there is not known yet)."""
    top = int(max(ended.max(initial=1), reached.max(initial=1)))
    js = np.arange(1, top + 1)
    d = np.array([(ended == j).sum() for j in js], float)
    n = np.array([(ended >= j).sum() + (reached > j).sum() for j in js], float)
    h = np.divide(d, n, out=np.zeros_like(d), where=n > 0)
    surv = np.cumprod(1.0 - h)
    mass = np.concatenate([[1.0], surv[:-1]]) - surv
    mass[-1] += surv[-1]
    return js, mass


def _draw(rng: np.random.Generator, support: np.ndarray, mass: np.ndarray, at_least: float = -np.inf) -> float:
    """A draw from the distribution given `at_least` (that lower bound itself when nothing is above)."""
    m = np.where(support >= at_least, mass, 0.0)
    total = m.sum()
    if total <= 0:
        return float(at_least)
    return float(support[rng.choice(len(support), p=m / total)])


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
    r_sup, r_mass = _km(np.array(resp, float), np.array(cens, bool))
    t_sup, t_mass = _km_turns(np.array([f.turns for f in finished]), np.array([r.turns for r, _ in running]))
    obs = np.array([o for s in [*finished, *(r for r, _ in running)] for o in s.observations] or [0], float)
    env = np.array([e for f in finished for e in f.env_latency] or [0.0], float)
    out = []
    for r, partial in running:
        rng = np.random.default_rng([r.index, 7723])
        k = r.turns
        turns = max(k, int(_draw(rng, t_sup, t_mass, k)))
        last = max(r.responses[-1], int(_draw(rng, r_sup, r_mass, r.responses[-1]))) if partial else r.responses[-1]
        more = [max(1, int(_draw(rng, r_sup, r_mass))) for _ in range(turns - k)]
        o = list(r.observations) + [max(1, int(x)) for x in rng.choice(obs, turns - 1 - len(r.observations))]
        e = [x if x > 0 else float(rng.choice(env)) for x in r.env_latency[:k]]
        e += [float(x) for x in rng.choice(env, turns - len(e))]
        out.append(TrajectorySpec(r.index, r.group, r.prompt_tokens, (*r.responses[:-1], last, *more), tuple(o),
                                  tuple(e)))
    return out
