"""Performance profiles: calibrated coefficients for one (model, hardware, tp), saved as JSON so that
`pearl profile` measures once and the simulator and controller reuse the fit.

File format (version 1):
    {"version": 1, "model": "qwen3-8b", "hardware": "h100", "tp": 1,
     "coeffs": {"mfu": ..., "bw_eff": ..., "step_overhead_s": ..., "seq_overhead_s": ...,
                "allreduce_latency_s": ..., "kv_eff": ..., "expert_eff": ..., "kv_setup_s": ...,
                "combine": "max"},
     "fitted_at": "2025-01-01T00:00:00+00:00", "n_samples": 200, "rmse": 0.0004}

A coefficient left out takes the `PerfCoeffs` default (the catalogue's fitted value; mfu and bw_eff: the
hardware's). Since the grounding (docs/perf_model.md), `allreduce_latency_s` is per ring hop.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pearl.errors import ConfigError
from pearl.perf.calibrate import Calibration
from pearl.perf.hardware import get_hardware
from pearl.perf.models import ModelShape, get_model
from pearl.perf.roofline import PerfCoeffs, PerfModel

PROFILE_VERSION = 1
_COEFF_FIELDS = {f.name for f in fields(PerfCoeffs)}


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

    @classmethod
    def from_calibration(cls, cal: Calibration, model: str, hardware: str, tp: int,
                         fitted_at: datetime | None = None) -> "Profile":
        when = (fitted_at or datetime.now(timezone.utc)).isoformat()
        return cls(model, hardware, tp, cal.coeffs, when, cal.n_samples, cal.rmse)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
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
            ok = isinstance(val, str) if key == "combine" else (
                isinstance(val, (int, float)) and not isinstance(val, bool))
            if not ok:
                raise ConfigError(f"{where}: field 'coeffs.{key}' = {val!r} has the wrong type")
        try:
            coeffs = PerfCoeffs(**c)
        except ValueError as e:
            raise ConfigError(f"{where}: field 'coeffs': {e}") from None
        return cls(d["model"], d["hardware"], d["tp"], coeffs, d["fitted_at"], d["n_samples"],
                   float(d["rmse"]), d["version"])

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
