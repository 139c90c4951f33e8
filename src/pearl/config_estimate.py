"""The controller's online estimator settings (`policy.controller.estimate` in a scenario).

PEARL is not told the workload or how long elastic devices live: `pearl.control.estimate` learns both
from what it observes, starting from the declared prior below. The prior is deliberately generic (it
is not any shipped profile): a user who knows better declares it. Every field is exact and bounded,
as in `pearl.config` (strict pydantic: an integer field takes an integer, a number a finite number).
Kept in its own module so that `pearl.config` stays small; imported there by `ControllerConfig`.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["EstimateConfig"]

_MAX_Q = 1e9  # any workload quantity (tokens, turns, seconds), as MAX_QUANTITY in pearl.config
_MAX_N = 1 << 20  # trajectories counted (as MAX_BATCH in pearl.config)


class EstimateConfig(BaseModel):
    """The workload prior (medians; each quantity lognormal with p90 = `prior_spread` x its median),
    its weight in trajectories, and the window of finished trajectories the estimate is built from."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    # The prior's medians: model turns per trajectory, first-prompt tokens, response tokens per turn,
    # observation tokens after a turn, environment latency per step (seconds).
    prior_turns: float = Field(default=4.0, ge=1, le=_MAX_Q)
    prior_prompt_tokens: float = Field(default=500.0, ge=1, le=_MAX_Q)
    prior_response_tokens: float = Field(default=500.0, ge=1, le=_MAX_Q)
    prior_observation_tokens: float = Field(default=500.0, ge=1, le=_MAX_Q)
    prior_env_latency_s: float = Field(default=1.0, gt=0, le=_MAX_Q)
    # p90 / median of every prior quantity (1: no spread).
    prior_spread: float = Field(default=3.0, ge=1, le=1000)
    # How many observed trajectories the prior counts as (it is blended in until the window holds
    # this many times more observed ones; 0: the prior is used only before the first one finishes).
    prior_weight: int = Field(default=16, ge=0, le=_MAX_N)
    # The estimate uses the last `window` finished trajectories (older ones are forgotten, so a
    # workload whose lengths drift is tracked), and is rebuilt once `refresh` new ones finished.
    # A batch's completion is its slowest trajectories: a window smaller than the trajectories in
    # flight cuts the tail at its longest one (the maximum of 512 draws from 256 samples is their
    # maximum 86% of the time), so the default holds several batches (benchmarks/predictor_accuracy.py).
    window: int = Field(default=2048, ge=1, le=_MAX_N)
    refresh: int = Field(default=32, ge=1, le=_MAX_N)
    # An elastic device's expected lifetime before any was observed counts as this many lifetimes of
    # `ControllerConfig.elastic_stay_s` (the lifetime estimate's prior).
    lifetime_prior_weight: float = Field(default=1.0, ge=0, le=_MAX_N)
