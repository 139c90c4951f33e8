"""Performance profiles: calibrated coefficients for one (model, hardware, tp), saved as JSON so that
`pearl profile` measures once and the simulator and controller reuse the fit.

File format (version 1):
    {"version": 1, "model": "qwen3-8b", "hardware": "h100", "tp": 1,
     "coeffs": {"mfu": ..., "bw_eff": ..., "step_overhead_s": ..., "seq_overhead_s": ...,
                "allreduce": "oneshot", "oneshot_latency_s": ..., "allreduce_latency_s": ..., "kv_eff": ...,
                "expert_eff": ..., "kv_setup_s": ..., "combine": "max"},
     "fitted_at": "2025-01-01T00:00:00+00:00", "n_samples": 200, "rmse": 0.0004}

A coefficient left out takes the `PerfCoeffs` default (the catalogue's fitted value; mfu and bw_eff: the
hardware's). Since the grounding (docs/perf_model.md), `allreduce_latency_s` is per ring hop; since the
engine's all-reduce form (2026-12-06), it counts only with "allreduce": "ring" (the default is "oneshot",
`oneshot_latency_s` per all-reduce).

Optional (`pearl profile` writes it; files without it still load): the trainer's cost,
    "trainer": {"fixed_s": ..., "per_token_s": ..., "per_pair_s": ..., "n_samples": 8, "rmse": 0.003, "clock": "cpu",
                "micro_batch_size": 32, "share_prompt": true, "threads": 1,
                "shared": [[1, 2.7, 2.4, 1.3, 1.2]], "log_s": 0.003, "checkpoint_s": 0.15}
one GRPO step (and the weight snapshot handed to the engines) taking fixed_s + per_token_s x the tokens
the trainer computes + per_pair_s x their causal attention pairs (`trainer_work`: a trained group's
shared prompt once, then every trained row's own tokens, padded to its micro-batch's longest row; rows
whose advantage is 0 are skipped; a profile without per_pair_s has 0);
`shared`: the shared-executor slowdowns (`pearl.runtime.twin_profile`); `log_s`, `checkpoint_s`: the
trainer thread's per-step logging and one checkpoint.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from pearl.errors import ConfigError
from pearl.perf.calibrate import Calibration
from pearl.perf.hardware import get_hardware
from pearl.perf.models import ModelShape, get_model
from pearl.perf.roofline import PerfCoeffs, PerfModel

PROFILE_VERSION = 1
_COEFF_FIELDS = {f.name for f in fields(PerfCoeffs)}


@dataclass(frozen=True)
class TrainerProfile:
    """A fitted trainer: seconds per step = fixed_s + per_token_s x tokens + per_pair_s x attention
    pairs, both from `trainer_work(...)` (the pairs term: long rows cost more per token)."""

    fixed_s: float
    per_token_s: float
    n_samples: int
    rmse: float  # seconds
    per_pair_s: float = 0.0
    clock: str = "cpu"  # "cpu" (process time) or "wall"
    micro_batch_size: int = 8
    share_prompt: bool = True
    threads: int = 1  # torch intra-op threads it was measured with
    # The executor (pearl train's local backend: one process, its cores and its GIL shared): for N rollout
    # workers, (N, engine step slowdown, trainer step slowdown while both work, engine step slowdown,
    # trainer step slowdown while the other side waits), each the wall time of a step over the CPU
    # time of its thread in a step alone (`pearl.runtime.twin_profile.measure_shared`).
    shared: tuple[tuple[float, ...], ...] = ()
    # pearl train's trainer thread besides the update, per step: its logs (metrics, samples,
    # trajectories) and one checkpoint (written every `checkpoint_every` steps), wall seconds
    log_s: float = 0.0
    checkpoint_s: float = 0.0

    def step_time(self, tokens: float, pairs: float = 0.0) -> float:
        return self.fixed_s + self.per_token_s * tokens + self.per_pair_s * pairs

    def shared_factors(self, workers: int) -> tuple[float, ...]:
        """(engine, trainer) slowdown while both run and (engine, trainer) while the other waits, for
        `workers` rollout workers (the nearest measured count; all 1 when none was measured)."""
        if not self.shared:
            return 1.0, 1.0, 1.0, 1.0
        s = min(self.shared, key=lambda s: (abs(s[0] - workers), -s[0]))
        return tuple(s[1:]) + (1.0, 1.0)[:5 - len(s)]

    @classmethod
    def from_dict(cls, d: Any, where: str) -> "TrainerProfile":
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: field 'trainer' must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        extra = sorted(set(d) - set(known))
        if extra:
            raise ConfigError(f"{where}: unknown field 'trainer.{extra[0]}'")
        for key in ("fixed_s", "per_token_s", "n_samples", "rmse"):
            if key not in d:
                raise ConfigError(f"{where}: missing field 'trainer.{key}'")
        kinds = {"fixed_s": (int, float), "per_token_s": (int, float), "per_pair_s": (int, float),
                 "rmse": (int, float), "n_samples": int,
                 "clock": str, "micro_batch_size": int, "share_prompt": bool, "threads": int, "shared": list,
                 "log_s": (int, float), "checkpoint_s": (int, float)}
        d = dict(d)
        shared = d.pop("shared", [])
        ok = isinstance(shared, list) and all(
            isinstance(x, list) and len(x) in (3, 5) and isinstance(x[0], int) and x[0] >= 1
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in x[1:]) for x in shared)
        if not ok:
            raise ConfigError(f"{where}: field 'trainer.shared' must be a list of [workers, engine, trainer, "
                              f"engine alone, trainer alone] (a count >= 1, then numbers > 0)")
        for key, val in d.items():
            bad = not isinstance(val, kinds[key]) or (isinstance(val, bool) and kinds[key] is not bool)
            if bad or (key != "clock" and not isinstance(val, bool) and val < 0):
                raise ConfigError(f"{where}: field 'trainer.{key}' = {val!r} has the wrong type or is negative")
        if d.get("clock", "cpu") not in ("cpu", "wall") or d.get("micro_batch_size", 1) < 1:
            raise ConfigError(f"{where}: field 'trainer': clock must be cpu or wall, micro_batch_size >= 1")
        return cls(**{k: (float(v) if kinds[k] == (int, float) else v) for k, v in d.items()},
                   shared=tuple((int(x[0]), *(float(v) for v in x[1:])) for x in shared))


def trainer_work(groups: Sequence[Sequence[tuple[int, int]]], micro_batch_size: int,
                 share_prompt: bool = True) -> tuple[int, float]:
    """(tokens, causal attention pairs) one GRPO step computes, from each group's trained rows as
    (prompt tokens, total tokens): rows are cut into micro-batches of `micro_batch_size` (per group with
    `share_prompt`, whose rows then run their common prompt once), each padded to its longest row; a
    token attends to every earlier one of its row (~n²/2 pairs for a row of n)."""
    total, pairs = 0, 0.0
    if not share_prompt:
        rows = [r for g in groups for r in g]
        groups = [rows[i:i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
    for g in groups:
        for i in range(0, len(g), micro_batch_size):
            mb = g[i:i + micro_batch_size]
            width = max(t for _, t in mb)
            pre = min(p for p, _ in mb) if share_prompt and len(mb) > 1 else 0
            total += pre + len(mb) * (width - pre)
            pairs += pre * pre / 2 + len(mb) * (width * width - pre * pre) / 2
    return total, pairs


def trainer_tokens(groups: Sequence[Sequence[tuple[int, int]]], micro_batch_size: int,
                   share_prompt: bool = True) -> int:
    """The tokens of `trainer_work`."""
    return trainer_work(groups, micro_batch_size, share_prompt)[0]


def fit_trainer(samples: Sequence[tuple[float, ...]], **kw: Any) -> TrainerProfile:
    """Non-negative least squares of (tokens, seconds) or (tokens, pairs, seconds) samples for
    seconds = fixed_s + per_token_s x tokens [+ per_pair_s x pairs], each relative to its own size
    (a long step's seconds should not drown a short one's)."""
    import numpy as np
    from scipy.optimize import nnls

    x = np.array([s[0] for s in samples], float)
    z = np.array([s[1] if len(s) == 3 else 0.0 for s in samples], float)
    y = np.array([s[-1] for s in samples], float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("fit_trainer needs samples at two or more token counts")
    cols = [np.ones_like(x), x] + ([z] if np.ptp(z / x) > 0 else [])
    w = 1.0 / np.maximum(y, 1e-9)
    coef = nnls(np.stack(cols, 1) * w[:, None], y * w)[0]
    a, b, c = float(coef[0]), float(coef[1]), float(coef[2]) if len(coef) > 2 else 0.0
    rmse = float(np.sqrt(np.mean((a + b * x + c * z - y) ** 2)))
    return TrainerProfile(a, b, len(x), rmse, per_pair_s=c, **kw)


@dataclass(frozen=True)
class Profile:
    model: str
    hardware: str
    tp: int
    coeffs: PerfCoeffs
    fitted_at: str  # ISO 8601, UTC
    n_samples: int
    rmse: float  # seconds
    version: int = PROFILE_VERSION
    trainer: TrainerProfile | None = None  # the trainer's fitted cost, when measured

    @classmethod
    def from_calibration(cls, cal: Calibration, model: str, hardware: str, tp: int,
                         fitted_at: datetime | None = None) -> "Profile":
        when = (fitted_at or datetime.now(timezone.utc)).isoformat()
        return cls(model, hardware, tp, cal.coeffs, when, cal.n_samples, cal.rmse)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["trainer"] is None:  # a profile without a trainer is written as before
            del d["trainer"]
        return {"version": d.pop("version"), **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "profile") -> "Profile":
        """Validate a parsed profile; every problem becomes a ConfigError naming the field."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("version") != PROFILE_VERSION:
            raise ConfigError(f"{where}: field 'version' = {d.get('version')!r}: unsupported "
                              f"(this PEARL reads version {PROFILE_VERSION})")
        known = {f.name for f in fields(cls)}
        extra = sorted(set(d) - known)
        if extra:
            raise ConfigError(f"{where}: unknown field '{extra[0]}'")
        types = {"model": str, "hardware": str, "tp": int, "fitted_at": str, "n_samples": int,
                 "rmse": (int, float), "coeffs": dict}
        for key, typ in types.items():
            if key not in d:
                raise ConfigError(f"{where}: missing field '{key}'")
            if not isinstance(d[key], typ) or isinstance(d[key], bool):
                raise ConfigError(f"{where}: field '{key}' = {d[key]!r} has the wrong type")
        if d["tp"] < 1 or d["n_samples"] < 0 or d["rmse"] < 0:
            raise ConfigError(f"{where}: tp must be >= 1 and n_samples, rmse >= 0")
        try:
            datetime.fromisoformat(d["fitted_at"])
        except ValueError:
            raise ConfigError(f"{where}: field 'fitted_at' = {d['fitted_at']!r} is not an ISO 8601 time") from None
        c = d["coeffs"]
        bad = sorted(set(c) - _COEFF_FIELDS)
        if bad:
            raise ConfigError(f"{where}: unknown field 'coeffs.{bad[0]}'")
        for key, val in c.items():
            ok = isinstance(val, str) if key in ("combine", "allreduce") else (
                isinstance(val, (int, float)) and not isinstance(val, bool))
            if not ok:
                raise ConfigError(f"{where}: field 'coeffs.{key}' = {val!r} has the wrong type")
        try:
            coeffs = PerfCoeffs(**c)
        except ValueError as e:
            raise ConfigError(f"{where}: field 'coeffs': {e}") from None
        trainer = TrainerProfile.from_dict(d["trainer"], where) if d.get("trainer") is not None else None
        return cls(d["model"], d["hardware"], d["tp"], coeffs, d["fitted_at"], d["n_samples"],
                   float(d["rmse"]), d["version"], trainer)

    def perf_model(self, model: ModelShape | None = None, memory_utilization: float = 0.9) -> PerfModel:
        """A PerfModel with these coefficients (the model looked up by name unless given)."""
        shape = model or get_model(self.model)
        return PerfModel(shape, get_hardware(self.hardware), self.tp, self.coeffs, memory_utilization)


def save_profile(profile: Profile, path: str | os.PathLike) -> Path:
    """Write atomically (a temp file renamed over the target) so readers never see half a profile."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(profile.to_dict(), indent=2) + "\n")
    os.replace(tmp, path)
    return path


def load_profile(path: str | os.PathLike) -> Profile:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"profile {str(path)!r}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"profile {str(path)!r}: not a readable JSON file ({e})") from None
    return Profile.from_dict(data, where=f"profile {str(path)!r}")
