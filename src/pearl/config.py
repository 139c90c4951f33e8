"""Typed, frozen, validated configuration.

Every component receives its own sub-config. User errors become a one-line `ConfigError` naming the
field (dotted path) and the bad value; `read_yaml` is the only place that reads a YAML config file.
Every field is exact and bounded (docs/bad-inputs.md): an integer field takes an integer (not a boolean,
float or string), a number field a finite number, a flag a boolean, and every size has an upper bound
(`MAX_*`), so a typo such as `rollout_devices: 1000000000` is an error, not a run whose memory grows."""
from __future__ import annotations

import math
import numbers
import types
import typing
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pearl.config_admission import AdmissionConfig
from pearl.config_estimate import EstimateConfig  # (both kept apart so that this module stays small)
from pearl.config_io import (MAX_CONFIG_BYTES, deep_merge, format_validation_error, load_config,  # noqa: F401
                             parse_config, read_yaml)  # (re-exported: the loading lives in config_io)
from pearl.config_layout import check_layout, check_layout_fits, check_rollout_mix, layout_shape, worker_sizes
from pearl.config_schedule import Schedule
from pearl.config_twin import TwinConfig
from pearl.errors import describe
from pearl.types import LayoutShape, Mode

# ---------------------------------------------------------------- bounds (checked before any work)
MAX_DEVICES = 65536  # devices in one pool (rollout, train, elastic); also `pearl plan --devices`
MAX_DEVICES_PER_NODE, MAX_TP = 256, 64  # devices per node, tensor-parallel size
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)  # tensor-parallel sizes a policy may choose (powers of two)
MAX_SEQS = 65536  # sequences an engine runs at once
MAX_TOKENS = 10_000_000  # a context, a token budget, a KV capacity
MAX_BATCH = 1 << 20  # trajectories in one RL batch (prompts x group size)
MAX_GROUP = 4096  # samples per prompt
MAX_STEPS, MAX_STALENESS = 10_000_000, 1000  # train steps, policy versions
MAX_DURATION_S = 365 * 24 * 3600.0  # every duration / time (a year: long virtual runs stop at max_train_steps)
MAX_QUANTITY = 1e9  # any value of a workload distribution (tokens, turns, seconds, devices)
MAX_SEED = 2**63 - 1


def _exact_kind(annotation: Any) -> str | None:
    """'int' / 'float' / 'bool' / 'ints' (a list of int) when a field, or its Optional, is exactly that."""
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    inner = [a for a in args if a is not type(None)] if args else [annotation]
    if len(inner) == 1 and typing.get_origin(inner[0]) is list and typing.get_args(inner[0]) == (int,):
        return "ints"
    return {int: "int", float: "float", bool: "bool"}.get(inner[0]) if len(inner) == 1 else None


def _check_exact(kind: str, v: Any) -> None:
    """No silent coercion: `yes` is not 1, `3.0` and `"3"` are not 3, `.inf` and `.nan` are not numbers."""
    if kind == "int" and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
        raise ValueError(f"expected an integer, got {describe(v)}")
    if kind == "bool" and not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {describe(v)}")
    if kind == "float":  # a numeric string is a number: YAML 1.1 reads `1e3` (no dot) as a string
        try:
            f = float(v) if isinstance(v, (numbers.Real, str)) and not isinstance(v, bool) else None
        except (ValueError, OverflowError):  # not a number; an integer too large for a float
            f = math.inf if isinstance(v, numbers.Integral) else None
        if f is None:
            raise ValueError(f"expected a number, got {describe(v)}")
        if not math.isfinite(f):
            raise ValueError("expected a finite number")


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _exact_scalars(cls, v: Any, info: ValidationInfo) -> Any:
        kind = _exact_kind(cls.model_fields[info.field_name].annotation) if info.field_name else None
        if kind == "ints" and isinstance(v, (list, tuple)):
            for x in v:
                _check_exact("int", x)
        elif kind is not None and v is not None:
            _check_exact(kind, v)
        return v


# ---------------------------------------------------------------- distributions (workloads)
class Dist(Frozen):
    """A 1-D distribution for workload quantities. lognormal: `median`, `p90`; constant: `value`;
    uniform: `low`, `high`; geometric: `mean` (≥1). Every draw is clipped to [`min`, `cap`]."""

    kind: Literal["lognormal", "constant", "uniform", "geometric"] = "lognormal"
    median: float | None = Field(default=None, gt=0, le=MAX_QUANTITY)
    p90: float | None = Field(default=None, gt=0, le=MAX_QUANTITY)
    value: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    low: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    high: float | None = Field(default=None, ge=0, le=MAX_QUANTITY)
    mean: float | None = Field(default=None, ge=1, le=MAX_QUANTITY)
    min: float = Field(default=0.0, ge=0, le=MAX_QUANTITY)
    cap: float | None = Field(default=None, gt=0, le=MAX_QUANTITY)

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
    trajectory_response_scale: Dist | None = None  # per trajectory: long-tail ones are long in every turn
    max_context: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    schedule: Schedule | None = None  # non-stationary: multipliers over training steps (config_schedule)


class ElasticConfig(Frozen):
    """External devices: none, Poisson bursts, spot node slots, a constant pool, or a CSV trace (runtime.elastic)."""

    kind: Literal["none", "poisson", "spot", "constant", "csv"] = "none"
    arrival_rate_per_h: float = Field(default=4.0, ge=0, le=1e6)  # poisson: arrival bursts per hour
    burst: Dist = Dist(kind="constant", value=8)  # devices per arrival burst
    lifetime_s: Dist = Dist(kind="lognormal", median=3600, p90=12000)
    notice_s: float = Field(default=30.0, ge=0, le=MAX_DURATION_S)  # revocation notice
    notice_probability: float = Field(default=0.7, ge=0, le=1)  # else abrupt loss
    max_devices: int = Field(default=16, ge=0, le=MAX_DEVICES)
    start_s: float = Field(default=0.0, ge=0, le=MAX_DURATION_S)
    cold_start_s: float = Field(default=30.0, ge=0, le=MAX_DURATION_S)  # process start + warm-up (+ weight pull)
    csv: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "ElasticConfig":
        if self.kind == "csv" and not self.csv:
            raise ValueError("elastic kind 'csv' needs 'csv' (a path)")
        try:  # a missing file is reported when the trace is read; a binary one here
            if self.kind == "csv" and Path(self.csv).is_file():  # type: ignore[arg-type]
                Path(self.csv).read_bytes()[:1 << 20].decode("utf-8")  # type: ignore[arg-type]
        except (UnicodeDecodeError, OSError):
            raise ValueError(f"csv {self.csv!r} is not a readable text file") from None
        return self


class ClusterConfig(Frozen):
    hardware: str = "h800"
    rollout_devices: int = Field(default=8, ge=0, le=MAX_DEVICES)
    train_devices: int = Field(default=8, ge=1, le=MAX_DEVICES)
    devices_per_node: int = Field(default=8, ge=1, le=MAX_DEVICES_PER_NODE)
    elastic: ElasticConfig = ElasticConfig()
    rollout_mix: dict[str, int] = {}  # {hardware: count}: the last rollout devices are of that kind


class EngineConfig(Frozen):
    tp: int = Field(default=1, ge=1, le=MAX_TP)
    max_num_seqs: int = Field(default=256, ge=1, le=MAX_SEQS)
    max_batched_tokens: int = Field(default=8192, ge=16, le=MAX_TOKENS)  # chunked-prefill token budget per step
    memory_utilization: float = Field(default=0.9, gt=0, le=1)
    block_size: int = Field(default=16, ge=1, le=4096)
    # KV tokens a worker holds at most (a configured pool, like pearl train's); None: what memory leaves
    kv_capacity_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)


class LayoutConfig(Frozen):
    """The initial (and, for fixed policies, the only) layout (its rules: `pearl.config_layout`)."""

    mode: Mode = Mode.COLOCATED
    prefill: int = Field(default=0, ge=0, le=MAX_DEVICES)  # disaggregated: number of prefill workers
    decode: int = Field(default=0, ge=0, le=MAX_DEVICES)  # disaggregated: number of decode workers
    prefill_tp: int | None = Field(default=None, ge=1, le=MAX_TP)  # disaggregated: prefill workers' tp (None: engine.tp)

    @model_validator(mode="after")
    def _check(self) -> "LayoutConfig":
        check_layout(self.mode, self.prefill, self.decode, self.prefill_tp)
        return self

    def shape(self, n_devices: int, tp: int) -> LayoutShape:
        return layout_shape(self.mode, self.prefill, self.decode, self.prefill_tp, n_devices, tp)


class RLConfig(Frozen):
    prompts_per_batch: int = Field(default=32, ge=1, le=MAX_BATCH)
    group_size: int = Field(default=8, ge=1, le=MAX_GROUP)
    staleness: int = Field(default=1, ge=0, le=MAX_STALENESS)  # η: max policy versions a trajectory may lag
    max_concurrent_trajectories: int | None = Field(default=None, ge=1, le=MAX_BATCH)
    train_mfu: float = Field(default=0.35, gt=0, le=1)
    train_passes: int = Field(default=1, ge=1, le=1000)  # optimizer passes over each batch (ppo epochs)


class ControllerConfig(Frozen):
    """The controller's constants: every number `pearl.control.controller` uses that is not learned.

    Times are seconds. Defaults are the values the shipped scenarios were tuned and measured with."""

    # A worker whose weights are already in the device's memory (a lent train device, a role flip
    # after a restart) serves this long after it is asked to start.
    wake_s: float = Field(default=2.0, ge=0, le=MAX_DURATION_S)
    flip_s: float = Field(default=0.05, ge=0, le=MAX_DURATION_S)  # a role change, weights resident
    # Time to stop a worker once its requests are gone (tear-down, memory release).
    stop_s: float = Field(default=0.5, ge=0, le=MAX_DURATION_S)
    # Tokens of KV one migrated request is assumed to carry (prices a migration in a plan).
    migrate_tokens: int = Field(default=8192, ge=1, le=MAX_TOKENS)
    # Per-request bookkeeping when a borrowed worker is vacated (added to the trainer's wait).
    return_request_s: float = Field(default=0.001, ge=0, le=MAX_DURATION_S)
    # Requests assumed in flight on a lent worker when pricing an immediate return.
    return_requests: int = Field(default=4, ge=0, le=MAX_SEQS)
    # Predictions this close (relative) are within the model's error: measure the runner-up instead.
    explore_band: float = Field(default=0.05, ge=0, le=1)
    # An exploration is taken only if its transition costs less than this share of the window.
    explore_cost_share: float = Field(default=0.05, ge=0, le=1)
    # A measurement counts only while the pipeline is "full": the time-averaged trajectories in
    # flight are at least this share of the most the run has had (else it measures a batch's tail).
    full_pipeline_share: float = Field(default=0.7, ge=0, le=1)
    # A lend must save this share of its workers' start + stop (its window leaves both out; unmodelled: migrating back).
    lend_gain_factor: float = Field(default=0.1, ge=0, le=1e6)
    # Slack a lend keeps before its deadline: a fixed part plus a share of the return's cost (the
    # estimate of vacating the devices can be off, proportionally and not).
    lend_safety_s: float = Field(default=0.25, ge=0, le=MAX_DURATION_S)
    lend_safety_share: float = Field(default=0.2, ge=0, le=1e6)
    # Measured throughput corrects predictions (`control.refit`): a shape counts as measured after
    # `refit_span_batches` predicted batch periods and `refit_min_samples` intervals; older intervals
    # fade with a half-life of `refit_half_life_batches` periods; shortest interval that counts.
    refit_span_batches: float = Field(default=1.0, ge=0, le=1e6)
    refit_half_life_batches: float = Field(default=2.0, gt=0, le=1e6)
    refit_min_samples: int = Field(default=2, ge=1, le=1_000_000)
    refit_min_seconds: float = Field(default=1.0, ge=0, le=MAX_DURATION_S)
    # Expected stay of an elastic device without a notice before any lifetime was observed (prior).
    elastic_stay_s: float = Field(default=3600.0, gt=0, le=MAX_DURATION_S)
    estimate: EstimateConfig = EstimateConfig()
    admission: AdmissionConfig = AdmissionConfig()  # the in-flight cap (`control.admission`)
    # The switching gate: hysteresis band (relative), streak for marginal ones, bands that make one "clear"
    hysteresis: float = Field(default=0.05, ge=0, le=1e6)
    confirm: int = Field(default=3, ge=1, le=1_000_000)
    clear: float = Field(default=3.0, ge=0, le=1e6)
    # Predictor resolution: reps per class, tail events, E[max] grid points, fixed-point tolerance.
    predict_reps: int = Field(default=32, ge=1, le=4096)
    predict_events: int = Field(default=8, ge=1, le=1024)
    predict_grid_points: int = Field(default=48, ge=8, le=4096)
    predict_tol: float = Field(default=1e-2, gt=0, lt=1)


class PolicyConfig(Frozen):
    """Who decides the layout over time. `fixed`: the layout above, never changed."""

    name: Literal["fixed", "pearl", "rlboost+", "static-pd", "roll-partial", "plan-static", "plan-warmup"] = "fixed"
    # Controller knobs (issue 3); fixed policies ignore them.
    decision_interval_s: float = Field(default=30.0, gt=0, le=MAX_DURATION_S)
    switch_margin: float = Field(default=0.1, ge=0, le=1e6)  # required relative gain over cost
    min_dwell_s: float = Field(default=60.0, ge=0, le=MAX_DURATION_S)
    borrow: bool = True
    elastic: bool = True
    adapt_pd: bool = True
    adapt_cap: bool = True  # PEARL chooses the cap on trajectories in flight (`control.admission`)
    incremental: bool = True
    cost_aware: bool = True
    return_bound_s: float = Field(default=5.0, ge=0, le=MAX_DURATION_S)  # max trainer wait for a borrowed device
    horizon_s: float = Field(default=900.0, gt=0, le=MAX_DURATION_S)  # how far ahead a switch's gain is counted
    # plan-warmup: run the configured layout this long, then plan from the workload observed (once)
    plan_after_s: float = Field(default=3600.0, gt=0, le=MAX_DURATION_S)
    # Tensor-parallel sizes PEARL may choose (None: each of 1, 2, 4, 8 that fits); baselines keep engine.tp.
    tps: list[int] | None = None
    # Let a disaggregated layout give its prefill workers a tp of their own (among `tps`): PEARL's
    # selector then ranks (prefill tp, decode tp) pairs, and the tuner gives static-pd and bound the same.
    per_role_tp: bool = False
    # Baselines (rlboost+): workers of this smaller tp on the devices of a node that engine.tp workers
    # cannot use (a spot VM of 6 beside tp 8). PEARL chooses its own; the tuner tunes it (None: none).
    side_tp: int | None = Field(default=None, ge=1, le=MAX_TP)
    controller: ControllerConfig = ControllerConfig()

    @field_validator("tps")
    @classmethod
    def _tps(cls, v: list[int] | None) -> list[int] | None:
        bad = [t for t in v or () if t not in TP_SIZES]
        if bad:
            raise ValueError(f"tensor-parallel size {bad[0]} is not one of {', '.join(map(str, TP_SIZES))}")
        if v is not None and (not v or len(set(v)) != len(v)):
            raise ValueError("give distinct tensor-parallel sizes, at least one (or leave tps unset)")
        return v


class ScenarioConfig(Frozen):
    name: str = "scenario"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    model: str = "qwen3-8b"  # a catalogue name or a path to a Hugging Face config.json
    duration_s: float = Field(default=3600.0, gt=0, le=MAX_DURATION_S)  # virtual seconds to simulate
    max_train_steps: int | None = Field(default=None, ge=1, le=MAX_STEPS)
    cluster: ClusterConfig = ClusterConfig()
    engine: EngineConfig = EngineConfig()
    layout: LayoutConfig = LayoutConfig()
    workload: WorkloadConfig = WorkloadConfig()
    rl: RLConfig = RLConfig()
    policy: PolicyConfig = PolicyConfig()
    twin: TwinConfig | None = None  # the digital twin of a real pearl train set-up (config_twin)

    @model_validator(mode="after")
    def _check(self) -> "ScenarioConfig":
        tp, n, lay = self.engine.tp, self.cluster.rollout_devices, self.layout
        node, b = self.cluster.devices_per_node, self.rl.prompts_per_batch * self.rl.group_size
        check_layout_fits(lay.mode, lay.prefill, lay.decode, lay.prefill_tp, tp, n, node)
        sizes = worker_sizes(lay.mode, lay.prefill, lay.decode, lay.prefill_tp, n, tp)
        check_rollout_mix(self.cluster.rollout_mix, n, sizes, self.policy.name)
        if tp > node:
            raise ValueError(f"engine.tp ({tp}) is larger than cluster.devices_per_node ({node})")
        bad = [t for t in self.policy.tps or () if node % t]
        if bad:
            raise ValueError(f"policy.tps: {bad[0]} does not divide cluster.devices_per_node ({node})")
        side = self.policy.side_tp
        if side is not None and (side >= tp or tp % side):
            raise ValueError(f"policy.side_tp ({side}) must divide engine.tp ({tp}) and be smaller")
        if b > MAX_BATCH:
            raise ValueError(f"rl.prompts_per_batch x rl.group_size = {b} trajectories per batch; the most is {MAX_BATCH}")
        return self
