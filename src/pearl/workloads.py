"""Agentic workload profiles and deterministic trajectory sampling.

A profile gives, per trajectory, the distributions of turns, first-prompt tokens, response tokens,
observation tokens and environment latency (see ../shared/WORKLOADS.md for the grounding of each
number). Every trajectory is drawn from its own RNG seeded by (scenario seed, trajectory index), so
two policies simulated on the same seed see exactly the same trajectories.

A non-stationary workload (`workload.schedule`, `pearl.config_schedule`) multiplies the draws of a
trajectory by the schedule's factors at the training step it is drawn for (`trajectory(..., step=)`;
step 0, the schedule's start, when not given: what a predictor knows before the run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pearl.config import Dist, WorkloadConfig
from pearl.config_schedule import factors
from pearl.errors import UnknownNameError

Z90 = 1.2815515655446004  # standard normal 90th percentile


def _ln(median: float, p90: float, cap: float, lo: float = 1) -> Dist:
    return Dist(kind="lognormal", median=median, p90=p90, cap=cap, min=lo)


# Grounding per profile: WORKLOADS.md table "Workload profiles".
PROFILES: dict[str, dict[str, Dist | int]] = {
    # SWE: observation-heavy, long environment waits (commands LN(0.5 s, 10 s); test runs 10-300 s).
    "swe": dict(turns=_ln(25, 60, 100), prompt_tokens=_ln(1500, 4000, 8000),
                response_tokens=_ln(250, 1200, 2048), observation_tokens=_ln(600, 4000, 16000),
                env_latency_s=_ln(2.0, 20.0, 300, lo=0.05), max_context=65536),
    # Search: observation-heavy (3-5 retrieved passages), short waits, 2-4 turns.
    "search": dict(turns=Dist(kind="uniform", low=2, high=5, cap=10, min=1),
                   prompt_tokens=_ln(300, 600, 2000), response_tokens=_ln(300, 1500, 4096),
                   observation_tokens=_ln(400, 1000, 4000), env_latency_s=_ln(0.3, 1.5, 30, lo=0.01),
                   max_context=32768),
    # Game (Sokoban/FrozenLake): short and fast, in-process environment.
    "game": dict(turns=Dist(kind="uniform", low=2, high=11, cap=10, min=1),
                 prompt_tokens=_ln(200, 400, 1000), response_tokens=_ln(60, 128, 400),
                 observation_tokens=_ln(100, 150, 400), env_latency_s=Dist(kind="constant", value=0.001),
                 max_context=8192),
    # Math with a code tool: decode-heavy long reasoning, 1 + geometric(mean 2) tool calls.
    "math-tool": dict(turns=Dist(kind="geometric", mean=3, cap=16, min=1), prompt_tokens=_ln(200, 500, 2000),
                      response_tokens=_ln(1500, 6000, 16384), observation_tokens=_ln(50, 400, 1024),
                      env_latency_s=_ln(0.5, 2.0, 30, lo=0.01), max_context=32768),
    # Web (WebShop/ALFWorld): pages of 300-1500 tokens, short responses.
    "web": dict(turns=_ln(5, 10, 15), prompt_tokens=_ln(500, 1000, 3000), response_tokens=_ln(80, 256, 1024),
                observation_tokens=_ln(600, 1500, 4000), env_latency_s=_ln(0.3, 1.0, 10, lo=0.01),
                max_context=16384),
}


def draw(d: Dist, rng: np.random.Generator, size: int | None = None):
    """Draw from a Dist, clipped to [min, cap]."""
    if d.kind == "constant":
        x = np.full(size, d.value) if size else d.value
    elif d.kind == "uniform":
        x = rng.uniform(d.low, d.high, size)
    elif d.kind == "geometric":
        x = rng.geometric(1.0 / d.mean, size)
    else:
        mu = math.log(d.median)
        sigma = max(1e-9, (math.log(d.p90) - mu) / Z90)
        x = rng.lognormal(mu, sigma, size)
    hi = d.cap if d.cap is not None else np.inf
    if size:  # np.clip's result, without its per-call overhead (hot: three draws per trajectory)
        return np.minimum(np.maximum(x, d.min), hi)
    return float(min(max(float(x), d.min), hi))


def dist_mean(d: Dist, samples: int = 20000, seed: int = 12345) -> float:
    """Mean of the clipped distribution (Monte Carlo, deterministic)."""
    return float(np.mean(draw(d, np.random.default_rng(seed), samples)))


@dataclass(frozen=True, slots=True)
class TrajectorySpec:
    """What one trajectory will do: token counts and latencies per turn, fixed in advance."""

    index: int
    group: int
    prompt_tokens: int
    responses: tuple[int, ...]  # response tokens per turn
    observations: tuple[int, ...]  # observation tokens after each turn but the last
    env_latency: tuple[float, ...]  # environment step latency after each turn

    @property
    def turns(self) -> int:
        return len(self.responses)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + sum(self.responses) + sum(self.observations)


_DRAWN: dict[tuple[int, str], dict] = {}  # (seed, workload config) -> its draws, this process's
DRAWN_KEPT = 4  # workloads whose draws a process keeps (a comparison: its seeds and the tuning seed)
DRAWN_MAX = 200_000  # draws kept per workload; beyond that its memo starts again (bounded memory)


def _drawn(seed: int, cfg_json: str) -> dict:
    """The memo of one workload's draws (`Workload.trajectory`): shared by every `Workload` of the same
    seed and configuration in this process. Only the `DRAWN_KEPT` most recently used are kept, each
    emptied when it reaches `DRAWN_MAX` draws. A draw is a pure function of the seed, the
    configuration and its arguments, so the memo changes no result."""
    key = (seed, cfg_json)
    memo = _DRAWN.pop(key, None)
    _DRAWN[key] = memo = {} if memo is None else memo
    while len(_DRAWN) > DRAWN_KEPT:
        del _DRAWN[next(iter(_DRAWN))]
    return memo


class Workload:
    """A resolved workload: the profile's distributions with the scenario's overrides."""

    FIELDS = ("turns", "prompt_tokens", "response_tokens", "observation_tokens", "env_latency_s")

    def __init__(self, cfg: WorkloadConfig, seed: int = 0):
        if cfg.profile not in PROFILES:
            raise UnknownNameError("workload profile", cfg.profile, list(PROFILES))
        base = PROFILES[cfg.profile]
        self.name = cfg.profile
        self.dists: dict[str, Dist] = {f: getattr(cfg, f) or base[f] for f in self.FIELDS}  # type: ignore[misc]
        self.scale = cfg.trajectory_response_scale
        self.schedule = cfg.schedule
        self.max_context = int(cfg.max_context or base["max_context"])
        self._cfg_json = cfg.model_dump_json()
        self.seed = seed
        self._means: dict[str, float] | None = None

    @property
    def seed(self) -> int:
        return self._seed

    @seed.setter
    def seed(self, seed: int) -> None:
        """A new seed (a copy re-seeded to sample, `WorkloadStats.from_workload`) draws from its own memo."""
        self._seed = seed
        self._drawn = _drawn(seed, self._cfg_json)

    def trajectory(self, index: int, group: int, group_prompt_tokens: int | None = None,
                   step: float = 0) -> TrajectorySpec:
        """Trajectory `index` of prompt group `group`, drawn for training step `step` (the schedule's
        factors there scale turns, responses, observations and environment latency). Memoised per
        process (`_drawn`): the same seed and workload draw the same trajectories in every run."""
        key = (index, group, group_prompt_tokens, step)
        spec = self._drawn.get(key)
        if spec is None:
            if len(self._drawn) >= DRAWN_MAX:
                self._drawn.clear()
            spec = self._drawn[key] = self._draw(index, group, group_prompt_tokens, step)
        return spec

    def _draw(self, index: int, group: int, group_prompt_tokens: int | None, step: float) -> TrajectorySpec:
        rng = np.random.default_rng([self.seed, 7919, index])
        d, f = self.dists, factors(self.schedule, step)
        prompt = group_prompt_tokens or max(1, int(draw(d["prompt_tokens"], rng)))
        turns = max(1, int(round(draw(d["turns"], rng) * f["turns"])))
        scale = (draw(self.scale, rng) if self.scale else 1.0) * f["response"]
        resp = np.maximum(1, (draw(d["response_tokens"], rng, turns) * scale)).astype(int)
        obs = np.maximum(1, (draw(d["observation_tokens"], rng, turns) * f["observation"]).astype(int))
        lat = draw(d["env_latency_s"], rng, turns) * f["env_latency"]
        # The context limit ends a trajectory early, as in real RL configs.
        resp_l, obs_l = resp.tolist(), obs.tolist()  # Python ints: the same values, faster to walk
        ctx, keep = prompt, 0
        for k in range(turns):
            ctx += resp_l[k]
            keep = k + 1
            if k + 1 < turns:
                ctx += obs_l[k]
            if ctx >= self.max_context:
                break
        return TrajectorySpec(index, group, prompt, tuple(resp_l[:keep]), tuple(obs_l[:keep - 1]),
                              tuple(np.asarray(lat[:keep], dtype=float).tolist()))

    def group_prompt_tokens(self, group: int) -> int:
        key = ("prompt", group)
        n = self._drawn.get(key)
        if n is None:
            rng = np.random.default_rng([self.seed, 104729, group])
            n = self._drawn[key] = max(1, int(draw(self.dists["prompt_tokens"], rng)))
        return n

    def trained(self, spec: TrajectorySpec) -> bool:
        """Whether the trainer computes this trajectory (always, for a drawn workload)."""
        return True

    def means(self) -> dict[str, float]:
        """Mean of each quantity (cached): what a predictor needs before it has observed anything."""
        if self._means is None:
            self._means = {f: dist_mean(d) for f, d in self.dists.items()}
        return self._means


class RecordedWorkload:
    """The trajectories a real run recorded (`trajectories.jsonl` of `pearl train`), replayed: group g
    of the simulation is the run's g-th recorded group (cycling), its k-th trajectory that group's k-th
    row, with the turns, token counts and environment seconds it had. `trained(spec)`: whether the
    trainer computed the trajectory (its GRPO advantage, reward minus its group's mean, was not 0)."""

    def __init__(self, rows: list[dict], name: str = "recorded"):
        groups: dict[int, dict[int, dict]] = {}
        for r in rows:  # a step trained again after a resume: its last record counts
            groups.setdefault(int(r["group"]), {})[int(r["sample"])] = r
        if not groups:
            raise ValueError("no trajectories recorded")
        self.name, self.schedule = name, None
        self.groups = [[g[k] for k in sorted(g)] for _, g in sorted(groups.items())]
        self.idle: set[tuple[int, int]] = set()  # (recorded group, row) whose advantage was 0
        for gi, g in enumerate(self.groups):
            ok = [r for r in g if r.get("ok", True)]
            mean = sum(float(r["reward"]) for r in ok) / max(len(ok), 1)
            self.idle |= {(gi, k) for k, r in enumerate(g) if not r.get("ok", True) or abs(float(r["reward"]) - mean) < 1e-9}
        self.max_context = max(_total(r) for g in self.groups for r in g)
        self._means: dict[str, float] | None = None

    def _row(self, index: int, group: int) -> tuple[int, int]:
        gi = group % len(self.groups)
        return gi, index % len(self.groups[gi])

    def trajectory(self, index: int, group: int, group_prompt_tokens: int | None = None,
                   step: float = 0) -> TrajectorySpec:
        gi, k = self._row(index, group)
        r = self.groups[gi][k]
        resp = tuple(max(1, int(x)) for x in r["responses"]) or (1,)
        obs = tuple(int(x) for x in r["observations"])[:len(resp) - 1]
        obs += (0,) * (len(resp) - 1 - len(obs))
        env = tuple(float(x) for x in r.get("env_s", []))[:len(resp)]
        env += (0.0,) * (len(resp) - len(env))
        return TrajectorySpec(index, group, max(1, int(r["prompt"])), resp, obs, env)

    def group_prompt_tokens(self, group: int) -> int:
        return max(1, int(self.groups[group % len(self.groups)][0]["prompt"]))

    def trained(self, spec: TrajectorySpec) -> bool:
        return self._row(spec.index, spec.group) not in self.idle

    def means(self) -> dict[str, float]:
        """Mean of each quantity over the recorded trajectories."""
        if self._means is None:
            specs = [self.trajectory(k, g) for g in range(len(self.groups)) for k in range(len(self.groups[g]))]
            n = len(specs)
            turns = [s.turns for s in specs]
            self._means = {"turns": sum(turns) / n, "prompt_tokens": sum(s.prompt_tokens for s in specs) / n,
                           "response_tokens": sum(sum(s.responses) for s in specs) / max(sum(turns), 1),
                           "observation_tokens": sum(sum(s.observations) for s in specs)
                           / max(sum(turns) - n, 1),
                           "env_latency_s": sum(sum(s.env_latency) for s in specs) / max(sum(turns), 1)}
        return self._means


def _total(r: dict) -> int:
    return int(r["prompt"]) + sum(int(x) for x in r["responses"]) + sum(int(x) for x in r["observations"])


def load_recorded(path: str) -> RecordedWorkload:
    """A run's trajectories.jsonl as a `RecordedWorkload`; a missing, empty or malformed file is a
    one-line ConfigError naming it."""
    import json
    from pathlib import Path

    from pearl.errors import ConfigError

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"trajectories {path!r}: no such file (a pearl train run directory's trajectories.jsonl)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"trajectories {path!r}: cannot be read ({e})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            _total(r), int(r["group"]), int(r["sample"]), float(r["reward"]), [float(x) for x in r.get("env_s", [])]
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"trajectories {path!r}: line {n} is not a recorded trajectory ({type(e).__name__}: {e})") from None
        rows.append(r)
    if not rows:
        raise ConfigError(f"trajectories {path!r}: no trajectories recorded (did the run train a step?)")
    return RecordedWorkload(rows, name=f"recorded:{p.name}")
