"""`TrainConfig`: the frozen, validated configuration of a real training run (`pearl train`).

One YAML file (the embedded default is `pearl/data/train_default.yaml`) plus `--set a.b=v`
overrides. A bad field is a one-line `ConfigError` naming it (via `parse_config`); unknown model and
environment names are checked by `check_names` before anything heavy is loaded.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from pearl.config import Frozen, parse_config
from pearl.rl.trainer import TrainerConfig


class EnvSpec(Frozen):
    """A built-in environment name or 'package.module:Class', its constructor kwargs, a step timeout."""

    name: str = "gridworld"
    kwargs: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float | None = Field(default=10.0, gt=0)
    use_system_prompt: bool = True  # the env's system prompt heads every trajectory


class SamplingConfig(Frozen):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=32, ge=1)  # per turn; 1 when sampling is action-restricted
    restrict_actions: bool = True  # sample only the env's allowed actions when each is one token


class EngineSettings(Frozen):
    max_num_seqs: int = Field(default=64, ge=1)
    max_batched_tokens: int = Field(default=1024, ge=16)
    kv_capacity_tokens: int = Field(default=65536, ge=64)


class TrainConfig(Frozen):
    name: str = Field(default="gridworld-tiny", min_length=1)
    model: str = "tiny"
    env: EnvSpec = EnvSpec()
    max_steps: int = Field(default=40, ge=1)
    prompts_per_step: int = Field(default=2, ge=1)  # groups per trainer batch
    group_size: int = Field(default=16, ge=1)  # samples per prompt (GRPO group)
    staleness: int = Field(default=1, ge=0)  # η: the most versions a trained token may lag
    sampling: SamplingConfig = SamplingConfig()
    trainer: TrainerConfig = TrainerConfig(lr=5e-4, micro_batch_size=32)
    engine: EngineSettings = EngineSettings()
    seed: int = 0
    rollout_workers: int = Field(default=1, ge=1)
    # auto: with >= 2 rollout workers, the controller's selector picks colocated or 1P:(N-1)D from a
    # PerfModel of this model on hardware "cpu" (see pearl.runtime.real.choose_layout); 1 worker: colocated
    layout: Literal["auto", "colocated", "1P:1D"] = "auto"
    profile: str | None = None  # a saved profile (`pearl profile`) for layout auto; else a quick calibration
    backend: Literal["local", "ray"] = "local"  # ray: each rollout worker is a Ray actor (may span machines)
    out_dir: str | None = None  # default runs/train-<name>
    metrics_file: str = "metrics.jsonl"
    summary_file: str = "summary.json"
    log_every: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> "TrainConfig":
        if self.layout == "1P:1D" and self.rollout_workers < 2:
            raise ValueError("layout '1P:1D' needs rollout_workers >= 2")
        return self

    @property
    def batch_size(self) -> int:
        """Trajectories per trainer step (the staleness gate's B)."""
        return self.prompts_per_step * self.group_size


def parse_train_config(data: dict[str, Any] | None, what: str = "train config") -> TrainConfig:
    return parse_config(data, TrainConfig, what)


def check_names(cfg: TrainConfig) -> None:
    """Unknown model / environment -> UnknownNameError / ConfigError, before any loading."""
    from pearl.envs.loader import resolve
    from pearl.real.models import MODELS
    from pearl.errors import UnknownNameError

    if cfg.model not in MODELS:
        raise UnknownNameError("model", cfg.model, list(MODELS))
    resolve(cfg.env.name)
