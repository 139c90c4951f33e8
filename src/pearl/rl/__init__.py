"""RL: trajectories, the GRPO loss and the trainer.

Exports are resolved lazily so that `pearl.rl.trajectory` (no torch) can be imported by the simulator
and the controller without paying for torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trajectory": "trajectory", "Status": "trajectory", "save_jsonl": "trajectory",
    "load_jsonl": "trajectory",
    "group_advantages": "grpo", "policy_loss": "grpo", "token_logprobs": "grpo", "k3_kl": "grpo",
    "GRPOTrainer": "trainer", "TrainerConfig": "trainer", "build_batch": "trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pearl.rl' has no attribute {name!r}")
    return getattr(importlib.import_module(f"pearl.rl.{_EXPORTS[name]}"), name)
