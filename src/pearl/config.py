"""Typed, frozen, validated configuration.

Every component receives its own sub-config. User errors become a one-line `ConfigError` naming the
field (dotted path) and the bad value; `load_config` is the only place that reads YAML.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pearl.errors import ConfigError
from pearl.types import LayoutShape, Mode


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- distributions (workloads)
class Dist(Frozen):
    """A 1-D distribution for workload quantities.

    lognormal: `median`, `p90`; constant: `value`; uniform: `low`, `high`; geometric: `mean` (≥1).
    Every draw is clipped to [`min`, `cap`].
    """

    kind: Literal["lognormal", "constant", "uniform", "geometric"] = "lognormal"
    median: float | None = Field(default=None, gt=0)
    p90: float | None = Field(default=None, gt=0)
    value: float | None = Field(default=None, ge=0)
    low: float | None = Field(default=None, ge=0)
    high: float | None = Field(default=None, ge=0)
    mean: float | None = Field(default=None, ge=1)
    min: float = Field(default=0.0, ge=0)
    cap: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> "Dist":
        need = {"lognormal": ("median", "p90"), "constant": ("value",), "uniform": ("low", "high"),
                "geometric": ("mean",)}[self.kind]
        for f in need:
            if getattr(self, f) is None:
                raise ValueError(f"a {self.kind} distribution needs '{f}'")
        if self.kind == "lognormal" and self.p90 < self.median:  # type: ignore[operator]
            raise ValueError(f"p90 ({self.p90}) must be >= median ({self.median})")
        if self.kind == "uniform" and self.high < self.low:  # type: ignore[operator]
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.cap is not None and self.cap < self.min:
            raise ValueError(f"cap ({self.cap}) must be >= min ({self.min})")
        return self


class WorkloadConfig(Frozen):
    """A workload profile by name, with any field overridden (see `pearl.workloads.PROFILES`)."""

    profile: str = "swe"
    turns: Dist | None = None
    prompt_tokens: Dist | None = None  # first turn: system prompt + task
    response_tokens: Dist | None = None
    observation_tokens: Dist | None = None
    env_latency_s: Dist | None = None
    # Per-trajectory scale of response length (long-tail trajectories are long in every turn).
    trajectory_response_scale: Dist | None = None
    max_context: int | None = Field(default=None, gt=0)


# ---------------------------------------------------------------- cluster, engines, layout
class ElasticConfig(Frozen):
    """External devices: none, a synthetic generator, or a CSV trace (time_s,event,count[,notice_s])."""

    kind: Literal["none", "poisson", "csv"] = "none"
    arrival_rate_per_h: float = Field(default=4.0, ge=0)  # poisson: arrival bursts per hour
    burst: Dist = Dist(kind="constant", value=8)  # devices per arrival burst
    lifetime_s: Dist = Dist(kind="lognormal", median=3600, p90=12000)
    notice_s: float = Field(default=30.0, ge=0)  # revocation notice
    notice_probability: float = Field(default=0.7, ge=0, le=1)  # else abrupt loss
    max_devices: int = Field(default=16, ge=0)
    start_s: float = Field(default=0.0, ge=0)
    csv: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "ElasticConfig":
        if self.kind == "csv" and not self.csv:
            raise ValueError("elastic kind 'csv' needs 'csv' (a path)")
        return self


class ClusterConfig(Frozen):
    hardware: str = "h800"
    rollout_devices: int = Field(default=8, ge=0)
    train_devices: int = Field(default=8, ge=1)
    devices_per_node: int = Field(default=8, ge=1)
    elastic: ElasticConfig = ElasticConfig()


class EngineConfig(Frozen):
    tp: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=256, ge=1)
    max_batched_tokens: int = Field(default=8192, ge=16)  # chunked-prefill token budget per step
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_size: int = Field(default=16, ge=1)


class LayoutConfig(Frozen):
    """The initial (and, for fixed policies, the only) layout."""

    mode: Mode = Mode.COLOCATED
    prefill: int = Field(default=0, ge=0)  # disaggregated: number of prefill workers
    decode: int = Field(default=0, ge=0)  # disaggregated: number of decode workers

    @model_validator(mode="after")
    def _check(self) -> "LayoutConfig":
        if self.mode is Mode.DISAGGREGATED and (self.prefill < 1 or self.decode < 1):
            raise ValueError(f"a disaggregated layout needs prefill >= 1 and decode >= 1 "
                             f"(got {self.prefill}P:{self.decode}D)")
        return self

    def shape(self, n_devices: int, tp: int) -> LayoutShape:
        if self.mode is Mode.COLOCATED:
            return LayoutShape.colocated(n_devices // tp, tp)
        return LayoutShape.disaggregated(self.prefill, self.decode, tp)


class RLConfig(Frozen):
    prompts_per_batch: int = Field(default=32, ge=1)
    group_size: int = Field(default=8, ge=1)
    staleness: int = Field(default=1, ge=0)  # η: max policy versions a trajectory may lag
    max_concurrent_trajectories: int | None = Field(default=None, ge=1)
    train_mfu: float = Field(default=0.35, gt=0, le=1)
    train_passes: int = Field(default=1, ge=1)  # optimizer passes over each batch (ppo epochs)


class ControllerConfig(Frozen):
    """The controller's constants: every number `pearl.control.controller` uses that is not learned.

    Times are seconds. Defaults are the values the shipped scenarios were tuned and measured with."""

    # A worker whose weights are already in the device's memory (a lent train device, a role flip
    # after a restart) serves this long after it is asked to start.
    wake_s: float = Field(default=2.0, ge=0)
    # Time for a worker to change role with its weights resident.
    flip_s: float = Field(default=0.05, ge=0)
    # Time to stop a worker once its requests are gone (tear-down, memory release).
    stop_s: float = Field(default=0.5, ge=0)
    # Tokens of KV one migrated request is assumed to carry (prices a migration in a plan).
    migrate_tokens: int = Field(default=8192, ge=1)
    # Per-request bookkeeping when a borrowed worker is vacated (added to the trainer's wait).
    return_request_s: float = Field(default=0.001, ge=0)
    # Requests assumed in flight on a lent worker when pricing an immediate return.
    return_requests: int = Field(default=4, ge=0)
    # Predictions this close (relative) are within the model's error: measure the runner-up instead.
    explore_band: float = Field(default=0.05, ge=0, le=1)
    # An exploration is taken only if its transition costs less than this share of the window.
    explore_cost_share: float = Field(default=0.05, ge=0, le=1)
    # A measurement counts only while the pipeline is "full": the time-averaged trajectories in
    # flight are at least this share of the most the run has had (else it measures a batch's tail).
    full_pipeline_share: float = Field(default=0.7, ge=0, le=1)
    # A lend must save this many times what starting and vacating its workers cost (the model does
    # not see the slowdown of migrating their requests back).
    lend_gain_factor: float = Field(default=2.0, ge=0)
    # Slack a lend keeps before its deadline: a fixed part plus a share of the return's cost (the
    # estimate of vacating the devices can be off, proportionally and not).
    lend_safety_s: float = Field(default=0.25, ge=0)
    lend_safety_share: float = Field(default=0.2, ge=0)
    # Measured throughput corrects predictions (`control.refit`): smoothing weight of a new sample,
    # samples before a shape counts as measured, and the shortest interval that counts as a sample.
    refit_alpha: float = Field(default=0.3, gt=0, le=1)
    refit_min_samples: int = Field(default=2, ge=1)
    refit_min_seconds: float = Field(default=1.0, ge=0)
    # Expected stay of an elastic device without a notice, when the trace gives no median lifetime.
    elastic_stay_s: float = Field(default=3600.0, gt=0)
    # The switching gate: hysteresis band (relative), streak for marginal candidates, and how many
    # bands make a candidate "clear" (taken at once).
    hysteresis: float = Field(default=0.05, ge=0)
    confirm: int = Field(default=3, ge=1)
    clear: float = Field(default=3.0, ge=0)
    # Predictor resolution per decision: representative trajectories per class, events of the
    # batch's tail, grid points of its expected maximum, and the fixed-point tolerance.
    predict_reps: int = Field(default=32, ge=1)
    predict_events: int = Field(default=8, ge=1)
    predict_grid_points: int = Field(default=48, ge=8)
    predict_tol: float = Field(default=1e-2, gt=0, lt=1)


class PolicyConfig(Frozen):
    """Who decides the layout over time. `fixed`: the layout above, never changed."""

    name: Literal["fixed", "pearl", "rlboost+", "static-pd", "roll-partial"] = "fixed"
    # Controller knobs (issue 3); fixed policies ignore them.
    decision_interval_s: float = Field(default=30.0, gt=0)
    switch_margin: float = Field(default=0.1, ge=0)  # required relative gain over cost
    min_dwell_s: float = Field(default=60.0, ge=0)
    borrow: bool = True
    elastic: bool = True
    adapt_pd: bool = True
    incremental: bool = True
    cost_aware: bool = True
    return_bound_s: float = Field(default=5.0, ge=0)  # max trainer wait for a borrowed device
    horizon_s: float = Field(default=900.0, gt=0)  # how far ahead a switch's gain is counted
    # Tensor-parallel sizes PEARL may choose (None: every size in 1, 2, 4, 8 that fits a node and
    # the model's KV heads); baselines keep engine.tp.
    tps: list[int] | None = None
    controller: ControllerConfig = ControllerConfig()


class ScenarioConfig(Frozen):
    name: str = "scenario"
    seed: int = 0
    model: str = "qwen3-8b"  # a catalogue name or a path to a Hugging Face config.json
    duration_s: float = Field(default=3600.0, gt=0)  # virtual seconds to simulate
    max_train_steps: int | None = Field(default=None, ge=1)
    cluster: ClusterConfig = ClusterConfig()
    engine: EngineConfig = EngineConfig()
    layout: LayoutConfig = LayoutConfig()
    workload: WorkloadConfig = WorkloadConfig()
    rl: RLConfig = RLConfig()
    policy: PolicyConfig = PolicyConfig()

    @model_validator(mode="after")
    def _check(self) -> "ScenarioConfig":
        tp, n = self.engine.tp, self.cluster.rollout_devices
        if self.layout.mode is Mode.DISAGGREGATED:
            need = (self.layout.prefill + self.layout.decode) * tp
            if need != n:
                raise ValueError(f"layout {self.layout.prefill}P:{self.layout.decode}D at tp={tp} needs "
                                 f"{need} devices but cluster.rollout_devices is {n}")
        elif n % tp:
            raise ValueError(f"cluster.rollout_devices ({n}) is not a multiple of engine.tp ({tp})")
        return self


# ---------------------------------------------------------------- loading
T = TypeVar("T", bound=BaseModel)


def format_validation_error(err: ValidationError, what: str) -> str:
    """One line: the first problem, with its dotted field path and the bad value."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    msg = e["msg"].removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        return f"{what}: unknown field '{loc}'"
    val = e.get("input")
    shown = "" if isinstance(val, dict) or val is None else f" = {val!r}"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    if not loc:
        return f"{what}: {msg}{more}"
    return f"{what}: field '{loc}'{shown}: {msg}{more}"


def parse_config(data: dict[str, Any] | None, cls: type[T], what: str = "config") -> T:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, what)) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{p}:{where} is not valid YAML") from None
    return data or {}


def load_config(path: str | Path, cls: type[T], overrides: dict[str, Any] | None = None) -> T:
    data = read_yaml(path)
    if overrides:
        data = deep_merge(data, overrides)
    return parse_config(data, cls, str(path))


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
