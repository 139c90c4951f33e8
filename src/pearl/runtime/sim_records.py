"""The simulator's in-flight trajectory: the progress of one sampled `TrajectorySpec` through its
turns (context, generated tokens, the workers holding its KV, the oldest policy version of its
tokens). The record family: `pearl.workloads.TrajectorySpec` (what a trajectory will be),
`SimTrajectory` here and the agent loop's `Episode` (where it is, simulated or real),
`pearl.rl.trajectory.Trajectory` (its tokens, for the trainer) and `pearl.rl.trajectory.Group`
(one prompt's trajectories, in both runtimes)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pearl.workloads import TrajectorySpec

__all__ = ["SimTrajectory"]


@dataclass(slots=True, eq=False)
class SimTrajectory:
    spec: TrajectorySpec
    id: str
    t_start: float
    turn: int = 0
    ctx: int = 0  # tokens in context now
    min_version: int = 1 << 30
    home: Any = None  # the decode / mixed EmulatedEngine holding its KV
    pre_home: Any = None  # the prefill EmulatedEngine holding its prefix
    generated: int = 0
    req: Any = None  # the request of the turn in progress (or the last one)
    in_env: bool = False
    t_end: float = 0.0
    migrations: int = 0
    recomputes: int = 0
