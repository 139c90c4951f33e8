"""The controller's admission-control settings (`policy.controller.admission` in a scenario).

PEARL chooses the cap on trajectories in flight at run time (`pearl.control.admission`): it lowers the
cap when too many turns find their session's KV evicted (the cache thrashes: every evicted context is
recomputed), and raises it again while the cache is calm. Kept in its own module so that
`pearl.config` stays small; imported there by `ControllerConfig`.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["AdmissionConfig"]


class AdmissionConfig(BaseModel):
    """Additive increase, multiplicative decrease of the in-flight cap on the KV-eviction signal."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    # Evicted sessions per finished request above which the cap is lowered, and below which it may
    # be raised again (between the two it is held).
    high: float = Field(default=0.10, gt=0, le=1e6)
    low: float = Field(default=0.02, ge=0, le=1e6)
    # A lowered cap is this share of the trajectories in flight when the cache thrashed.
    decrease: float = Field(default=0.85, gt=0, lt=1)
    # The cap rises by this share of the staleness gate's level, (η + 1)·B (at least one group), after
    # `patience` calm intervals in a row in which the cap was reached.
    increase_share: float = Field(default=1 / 32, gt=0, le=1)
    patience: int = Field(default=2, ge=1, le=1_000_000)
    # The cap never goes below this share of (η + 1)·B (nor below one group).
    floor_share: float = Field(default=1 / 8, gt=0, le=1)
    # A rate is read only over at least this many finished requests (intervals are merged until then).
    min_requests: int = Field(default=32, ge=1, le=1 << 20)
