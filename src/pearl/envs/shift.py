"""`gridworld-shift`: the gridworld whose observations grow mid-run, so that the workload shifts.

The game, actions and rewards are `gridworld`'s. After `shift_after` episodes were reset, every
observation (the first one included) carries `pad` extra characters of filler ("a log of the lake")
before the grid, and `pad_before` (default 0) until then: the same game, with turns that grow (or,
with `pad_before` > `pad`, shrink) from one regime to another. It exists to show
the controller learning a workload that changes during a run (tests/real/test_workload_shift.py).

Environments are not told the trainer's step or policy version, and the agent loop builds one
environment per episode, so the clock is the number of episodes reset so far *in this process*
under the same `run` key (a class-level counter). Two runs in one process that must not share the
clock give different `run` keys; `shift_after=0` shifts from the first episode.
"""
from __future__ import annotations

import threading
from collections import Counter

from pearl.envs.base import StepResult
from pearl.envs.gridworld import GridWorldEnv

_FILLER = "the ice creaks. "


class ShiftingGridEnv(GridWorldEnv):
    name = "gridworld-shift"
    _resets: Counter = Counter()  # run key -> episodes reset so far in this process
    _lock = threading.Lock()

    def __init__(self, shift_after: int = 64, pad: int = 600, run: str = "", pad_before: int = 0, **grid):
        if shift_after < 0:
            raise ValueError(f"shift_after must be >= 0, got {shift_after}")
        for name, v in (("pad", pad), ("pad_before", pad_before)):
            if not 0 <= v <= 100_000:
                raise ValueError(f"{name} must be in [0, 100000], got {v}")
        super().__init__(**grid)
        self.shift_after, self.pad, self.pad_before, self.run = shift_after, pad, pad_before, str(run)
        self.shifted = False

    def reset(self, seed: int) -> str:
        with self._lock:
            n = self._resets[self.run]
            self._resets[self.run] = n + 1
        self.shifted = n >= self.shift_after
        return self._grow(super().reset(seed))

    def step(self, model_text: str) -> StepResult:
        res = super().step(model_text)
        if res.observation is None:
            return res
        return StepResult(self._grow(res.observation), res.reward, res.done, res.info)

    def _grow(self, obs: str) -> str:
        n = self.pad if self.shifted else self.pad_before
        if n == 0:
            return obs
        filler = (_FILLER * (n // len(_FILLER) + 1))[:n]
        return f"{filler}\n{obs}"
