"""`guess`: guess a secret number in [low, high]; the environment answers "higher" or "lower".

A fixed action set (the numbers themselves, `allowed_actions`, when the range has at most 64
values) and feedback that makes the optimal policy a binary search: ceil(log2(n + 1)) turns at
most. The secret is drawn from the episode seed. Rewards (the return is in [0, 1]):

- a correct guess on turn k earns 1 - turn_penalty * (k - 1): guessing right is always worth the
  most, and fewer turns are worth more, which is what rewards search over enumeration;
- running out of turns earns `progress_reward * (1 - |last guess - secret| / (high - low))`, so
  even a random policy gets a graded signal.

Guesses outside the range or unparseable replies are invalid turns (no guess, no information).
"""
from __future__ import annotations

import math
import random
import re

from pearl.envs.base import BaseEnv, StepResult

_INT = re.compile(r"-?\d+")


class GuessNumberEnv(BaseEnv):
    name = "guess"

    def __init__(self, low: int = 1, high: int = 16, max_turns: int | None = None,
                 turn_penalty: float = 0.05, progress_reward: float = 0.3):
        if high <= low:
            raise ValueError(f"high ({high}) must be > low ({low})")
        n = high - low + 1
        search = math.ceil(math.log2(n + 1))  # the worst case of a binary search
        self.max_turns = max_turns if max_turns is not None else search + 1
        if self.max_turns < search:
            raise ValueError(f"max_turns ({self.max_turns}) is below a binary search's worst case "
                             f"({search})")
        if not 0 <= turn_penalty * (self.max_turns - 1) < 1 - progress_reward:
            raise ValueError("turn_penalty is too large: a late right guess must beat any wrong one")
        self.low, self.high = low, high
        self.turn_penalty, self.progress_reward = turn_penalty, progress_reward
        self.allowed_actions = [str(i) for i in range(low, high + 1)] if n <= 64 else None
        self.system_prompt = (f"I am thinking of a whole number between {low} and {high}. Guess it: "
                              f"reply with one number. I will say 'higher' or 'lower'.")
        self.secret = low
        self._turn = 0
        self._last: int | None = None
        self._done = True

    def reset(self, seed: int) -> str:
        self.secret = random.Random(seed).randint(self.low, self.high)
        self._turn, self._last, self._done = 0, None, False
        return f"Guess the number between {self.low} and {self.high}."

    def step(self, model_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("step after the episode ended; call reset")
        self._turn += 1
        m = _INT.search(model_text)
        guess = int(m.group()) if m else None
        info: dict = {"guess": guess}
        if guess is None or not self.low <= guess <= self.high:
            info["invalid"] = True
            obs = f"Reply with one number between {self.low} and {self.high}."
        elif guess == self.secret:
            return self._end(1.0 - self.turn_penalty * (self._turn - 1), info | {"outcome": "correct"})
        else:
            self._last = guess
            obs = "higher" if guess < self.secret else "lower"
        if self._turn >= self.max_turns:
            return self._end(self._progress(), info | {"outcome": "timeout"})
        return StepResult(obs, 0.0, False, info)

    def optimal_actions(self, seed: int) -> list[str]:
        """The binary search for episode `seed` (what a scripted optimal policy says)."""
        secret = random.Random(seed).randint(self.low, self.high)
        lo, hi, out = self.low, self.high, []
        while True:
            mid = (lo + hi) // 2
            out.append(str(mid))
            if mid == secret:
                return out
            lo, hi = (mid + 1, hi) if mid < secret else (lo, mid - 1)

    def _progress(self) -> float:
        if self._last is None:
            return 0.0
        return self.progress_reward * (1 - abs(self._last - self.secret) / (self.high - self.low))

    def _end(self, reward: float, info: dict) -> StepResult:
        self._done = True
        return StepResult(None, reward, True, info)
