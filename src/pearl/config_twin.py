"""`TwinConfig`: what makes a scenario the digital twin of a real `pearl train` set-up
(`ScenarioConfig.twin`; built by `pearl.runtime.twin.build_twin` from a train config, a calibrated
profile and a finished run's directory). Every field is optional: a scenario without `twin:` simulates
exactly as before.

- `engine_coeffs`: the engine's calibrated `pearl.perf.roofline.PerfCoeffs` fields (a `pearl profile`
  file's `coeffs`), used instead of the catalogue's for every worker;
- `trainer`: the trainer's calibrated cost (the profile's `trainer`): a step takes
  fixed_s + per_token_s x the tokens + per_pair_s x the attention pairs it computes
  (`pearl.perf.profile.trainer_work`), instead of the roofline's `train_step_time` at `rl.train_mfu`;
- `trajectories`: a run's `trajectories.jsonl` (`pearl.runtime.observe.RunLog.trajectories`): group g's
  trajectories are that run's group g (turns, token counts, environment seconds; cycling when the
  simulation admits more groups), and a trajectory whose GRPO advantage was 0 costs the trainer nothing;
- `batch_order`: `ready` (the simulator's own rule: the oldest finished groups) or `admission` (pearl
  train's: the next `prompts_per_batch` groups in admission order, once all of them have finished);
- `shared`: the rollout workers and the trainer share one process's cores and GIL (pearl train's
  local backend). One entry per number of rollout workers at work (`workers`; the nearest is used):
  an engine step planned while the trainer works takes `engine` times the profile's time
  (`engine_alone` while it waits), and the trainer advances `trainer` times slower while the rollout
  works (`trainer_alone` while it waits) (`pearl.runtime.sim_trainer`; measured by `pearl profile`).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["TwinConfig", "TwinShared", "TwinTrainer"]


class Frozen(BaseModel):  # imported by pearl.config, so not its Frozen: strict pydantic instead
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class TwinTrainer(Frozen):
    fixed_s: float = Field(ge=0, le=1e6)
    per_token_s: float = Field(ge=0, le=1e3)
    per_pair_s: float = Field(default=0.0, ge=0, le=1e3)  # per causal attention pair (long rows)
    micro_batch_size: int = Field(default=8, ge=1, le=1 << 20)
    share_prompt: bool = True


class TwinShared(Frozen):
    workers: int = Field(default=1, ge=1, le=1 << 20)
    engine: float = Field(default=1.0, ge=1, le=1000)
    trainer: float = Field(default=1.0, ge=1, le=1000)
    engine_alone: float = Field(default=1.0, ge=1, le=1000)  # while the other side waits
    trainer_alone: float = Field(default=1.0, ge=1, le=1000)


class TwinConfig(Frozen):
    engine_coeffs: dict[str, float | str] | None = None
    trainer: TwinTrainer | None = None
    trajectories: str | None = Field(default=None, min_length=1)
    batch_order: Literal["ready", "admission"] = "ready"

    def shared_factors(self, workers: int) -> tuple[float, float, float, float]:
        """(engine, trainer) slowdowns with `workers` rollout workers at work while both sides work,
        then each while the other waits; all 1 without `shared`."""
        if not self.shared:
            return 1.0, 1.0, 1.0, 1.0
        s = min(self.shared, key=lambda x: (abs(x.workers - workers), -x.workers))
        return s.engine, s.trainer, s.engine_alone, s.trainer_alone
    shared: list[TwinShared] | None = None
