"""Non-stationary workloads: how a workload's distributions shift over training (`workload.schedule`).

A schedule is a list of points, each a training step and multipliers of the profile's draws
(response tokens, turns, observation tokens, environment latency), strictly increasing in step.
Between two points the multipliers are interpolated linearly; before the first and after the last
they stay at the nearest point's values. `pearl.workloads.Workload.trajectory` applies them to the
trajectories drawn for a step (the simulator passes the batch a trajectory is admitted for, in
admission order, so every policy sees the same trajectories). Grounding: docs/scenarios.md.

Imported by `pearl.config` (so it cannot import it back): its models are strict pydantic models of
their own, as exact as `pearl.config.Frozen` (an integer is an integer, a number is finite).
"""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

__all__ = ["Schedule", "SchedulePoint", "factors"]

MAX_SCHEDULE_STEP = 10_000_000  # as pearl.config.MAX_STEPS
MAX_FACTOR = 1000.0
MAX_POINTS = 1000


class SchedulePoint(BaseModel):
    """At training step `step`, each quantity is its profile draw times this multiplier."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    step: int = Field(ge=0, le=MAX_SCHEDULE_STEP)
    response: float = Field(default=1.0, gt=0, le=MAX_FACTOR)  # response tokens per turn
    turns: float = Field(default=1.0, gt=0, le=MAX_FACTOR)  # turns per trajectory
    observation: float = Field(default=1.0, gt=0, le=MAX_FACTOR)  # observation tokens per turn
    env_latency: float = Field(default=1.0, gt=0, le=MAX_FACTOR)  # environment step latency


def _increasing(points: list[SchedulePoint]) -> list[SchedulePoint]:
    if not points:
        raise ValueError("a schedule needs at least one point (or leave it unset)")
    if len(points) > MAX_POINTS:
        raise ValueError(f"{len(points)} schedule points; the most is {MAX_POINTS}")
    for a, b in zip(points, points[1:]):
        if b.step <= a.step:
            raise ValueError(f"schedule steps must increase: step {b.step} follows step {a.step}")
    return points


Schedule = Annotated[list[SchedulePoint], AfterValidator(_increasing)]

QUANTITIES = ("response", "turns", "observation", "env_latency")


def factors(points: list[SchedulePoint] | None, step: float) -> dict[str, float]:
    """The multipliers at `step` (linear between points, flat outside them); all 1 without a schedule."""
    if not points:
        return dict.fromkeys(QUANTITIES, 1.0)
    if step <= points[0].step:
        return {q: getattr(points[0], q) for q in QUANTITIES}
    for a, b in zip(points, points[1:]):
        if step <= b.step:
            w = (step - a.step) / (b.step - a.step)
            return {q: getattr(a, q) + w * (getattr(b, q) - getattr(a, q)) for q in QUANTITIES}
    return {q: getattr(points[-1], q) for q in QUANTITIES}
