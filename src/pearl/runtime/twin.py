"""The digital twin of a real `pearl train` run: the simulator's scenario for the same set-up.

    prof = calibrate(cfg, "runs/profile.json")          # `pearl profile` (runtime.twin_profile)
    run = read_run("runs/my-run")                        # what `pearl train --out runs/my-run` wrote
    scn = build_twin(run.config, prof, run)              # a ScenarioConfig (its `twin:` section)
    sim = simulate_twin(scn)                             # the simulator's result (runtime.results)
    real_figures(run), sim_figures(sim)                  # trajectories/s and trainer idle share, alike

The scenario keeps the run's batch (prompts_per_step x group_size), staleness η, rollout workers and
layout (the one the run started with: colocated, or 1P:(N-1)D), its policy, and describes the rest
as it really is: hardware "cpu" with the profile's engine coefficients, the trainer's calibrated cost
(`twin.trainer`), pearl train's batch rule (the next groups in admission order,
`twin.batch_order: admission`), the slowdowns of the process the trainer and the rollout workers
share (`twin.shared`, local backend) and the run's own trajectories (`twin.trajectories`: turns, token
counts, measured environment seconds, which trajectories the trainer computed). Figures are taken over
the same steady state on both sides: from the end of the first training step to the end of the last.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pearl.config import ScenarioConfig, parse_config
from pearl.errors import ConfigError
from pearl.perf.profile import Profile
from pearl.runtime.train_config import TrainConfig

__all__ = ["RunRecords", "read_run", "build_twin", "simulate_twin", "real_figures", "sim_figures"]


@dataclass(frozen=True)
class RunRecords:
    """A finished run's directory: its config, per-step metrics, summary and trajectories file."""

    path: Path
    config: TrainConfig
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def trajectories(self) -> Path:
        return self.path / "trajectories.jsonl"

    @property
    def layout(self) -> str:
        """The layout the run started with (colocated or 1P:1D)."""
        return str((self.summary.get("layout_decision") or {}).get("chosen") or self.config.layout)


def _json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"run directory {str(path.parent)!r}: no {what} (not a finished pearl train run)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"run directory {str(path.parent)!r}: {what} is not readable JSON ({e})") from None


def read_run(run_dir: str | Path) -> RunRecords:
    """Read a finished `pearl train` run directory; anything missing or malformed is a one-line
    ConfigError naming the directory and the file."""
    from pearl.config import read_yaml
    from pearl.runtime.train_config import parse_train_config

    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError(f"run directory {str(d)!r}: " + ("not a directory" if d.exists() else "no such directory"))
    if not (d / "config.yaml").is_file():
        raise ConfigError(f"run directory {str(d)!r}: no config.yaml (not a pearl train run directory)")
    cfg = parse_train_config(read_yaml(d / "config.yaml"), str(d / "config.yaml"))
    summary = _json(d / "summary.json", "summary.json")
    try:
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    except FileNotFoundError:
        raise ConfigError(f"run directory {str(d)!r}: no metrics.jsonl (not a finished pearl train run)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"run directory {str(d)!r}: metrics.jsonl is not readable JSON lines ({e})") from None
    if len(rows) < 2 or not isinstance(summary, dict):
        raise ConfigError(f"run directory {str(d)!r}: the run trained {len(rows)} step(s); a twin needs at least 2")
    if not (d / "trajectories.jsonl").is_file():
        raise ConfigError(f"run directory {str(d)!r}: no trajectories.jsonl (recorded by pearl train since the "
                          "digital twin; run it again)")
    return RunRecords(d, cfg, rows, summary)


def build_twin(cfg: TrainConfig, profile: Profile, run: RunRecords) -> ScenarioConfig:
    """The simulator's scenario of `cfg` as run in `run`, priced by `profile` (which must hold the
    trainer's cost: `pearl profile` writes it; with the local backend, its shared-executor factors)."""
    if profile.trainer is None:
        raise ConfigError("profile: no trainer cost in it (written by an older pearl profile); run pearl profile again")
    if profile.hardware != "cpu" or profile.tp != 1:
        raise ConfigError(f"profile: measured on {profile.hardware!r} at tp {profile.tp}; pearl train's twin needs "
                          "a profile of the cpu engine at tp 1 (pearl profile)")
    if profile.model != cfg.model:
        raise ConfigError(f"profile: measured for model {profile.model!r}, the run trains {cfg.model!r}")
    n = cfg.rollout_workers
    layout = {"mode": "colocated"} if run.layout != "1P:1D" else {"mode": "disaggregated", "prefill": 1, "decode": n - 1}
    coeffs = {k: v for k, v in asdict(profile.coeffs).items() if v is not None}
    tr = profile.trainer
    keys = ("workers", "engine", "trainer", "engine_alone", "trainer_alone")
    shared = [dict(zip(keys, s)) for s in tr.shared] if cfg.backend == "local" else None
    policy = cfg.policy.model_dump(mode="json")
    model = cfg.model if cfg.model in ("tiny", "smollm2-135m") else str(Path(cfg.model) / "config.json")
    data = {
        "name": f"twin-{cfg.name}", "seed": cfg.seed, "model": model, "duration_s": 7 * 86400.0,
        "max_train_steps": len(run.metrics),
        "cluster": {"hardware": "cpu", "rollout_devices": n, "train_devices": 1, "devices_per_node": max(n, 1)},
        "engine": {"tp": 1, "max_num_seqs": cfg.engine.max_num_seqs, "max_batched_tokens": cfg.engine.max_batched_tokens,
                   "kv_capacity_tokens": cfg.engine.kv_capacity_tokens},
        "layout": layout, "workload": {"profile": "game"},
        "rl": {"prompts_per_batch": cfg.prompts_per_step, "group_size": cfg.group_size, "staleness": cfg.staleness},
        "policy": policy,
        "twin": {"engine_coeffs": coeffs, "trajectories": str(run.trajectories), "batch_order": "admission",
                 "shared": shared,
                 "trainer": {"fixed_s": tr.fixed_s + tr.log_s + tr.checkpoint_s / cfg.checkpoint_every,
                             "per_token_s": tr.per_token_s, "per_pair_s": tr.per_pair_s,
                             "micro_batch_size": cfg.trainer.micro_batch_size,
                             "share_prompt": cfg.trainer.share_prompt}},
    }
    return parse_config(data, ScenarioConfig, f"twin of {run.path}")


def simulate_twin(scn: ScenarioConfig) -> dict[str, Any]:
    """The simulator's result for a twin scenario (`pearl.runtime.results.collect`)."""
    from pearl.runtime.sim import Simulator

    return Simulator(scn).run()


def real_figures(run: RunRecords) -> dict[str, float]:
    """Trajectories/s (trained or failed: every one the trainer took) and the trainer's idle share
    (waiting for its batch), from the end of the first step to the end of the last."""
    m = run.metrics
    span = max(float(m[-1]["elapsed_s"]) - float(m[0]["elapsed_s"]), 1e-9)
    trajs = sum(int(x.get("trained", 0)) + int(x.get("failed", 0)) for x in m[1:])
    idle = sum(float(x.get("wait_for_batch_s", 0.0)) for x in m[1:])
    return {"trajectories_per_s": trajs / span, "trainer_idle": idle / span, "steady_s": span}


def sim_figures(res: dict[str, Any]) -> dict[str, float]:
    """The same figures from a simulator result."""
    steps = res["per_step"]
    if len(steps) < 2:
        raise ConfigError(f"the twin trained {len(steps)} step(s) in its virtual time; it needs at least 2")
    span = max(steps[-1]["t_end"] - steps[0]["t_end"], 1e-9)
    idle = sum(s["trainer_idle_s"] for s in steps[1:])
    return {"trajectories_per_s": sum(s["trajectories"] for s in steps[1:]) / span, "trainer_idle": idle / span,
            "steady_s": span}
