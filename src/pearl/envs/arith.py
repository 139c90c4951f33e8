"""`arith`: a single-turn arithmetic task with a verifiable, format-aware reward.

`reset(seed)` poses one problem ("What is 17 + 25? ..."), the model answers once, and `step` grades
the answer (the episode always ends there). The final answer is the number after the first `####`
(the GSM8K convention; what a small model babbles after it does not count). Rewards, from `arith_reward` (also usable on its own, e.g. as a dataset
reward function: `pearl.envs.arith:arith_reward`):

- 1.0: the number after `####` is right;
- `number_credit` (default 0.5): no `####` answer, but the last number in the text is right;
- `format_credit` (default 0.2): a number follows `####` but it is wrong (the format is learnt);
- 0.0 otherwise.

The defaults and the wording are tuned so that SmolLM2-135M-Instruct starts clearly above zero but
far from solved: it usually computes small sums right ("12 + 46 = 58") but rarely ends with
`#### 58` (measured with `benchmarks/arith_start.py`, figures in docs/results.md).

Problems are deterministic per seed. Held-out problems for evaluation are the seeds from
`HELDOUT_SEED` on (`heldout_seeds(n)`): `pearl train` draws its training seeds from
`seed * 100003 + group index`, far below it for any run of fewer than ~10^12 groups.
"""
from __future__ import annotations

import random
import re

from pearl.envs.base import BaseEnv, StepResult

HELDOUT_SEED = 1 << 40
_FINAL = re.compile(r"####\s*\**\s*(-?\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def heldout_seeds(n: int) -> list[int]:
    """`n` seeds no training run draws (see the module docstring)."""
    return [HELDOUT_SEED + i for i in range(n)]


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def final_answer(completion: str) -> float | None:
    """The number after the first `####` in `completion`, or None."""
    hit = _FINAL.search(completion)
    return _number(hit.group(1)) if hit else None


def arith_reward(completion: str, answer: float | int | str, format_credit: float = 0.2,
                 number_credit: float = 0.5, **_: object) -> float:
    """Grade `completion` against `answer` (see the module docstring). Extra row fields are ignored."""
    target = float(answer)
    got = final_answer(completion)
    if got is not None:
        return 1.0 if abs(got - target) < 1e-6 else format_credit
    numbers = _NUMBER.findall(completion)
    last = _number(numbers[-1]) if numbers else None
    return number_credit if last is not None and abs(last - target) < 1e-6 else 0.0


def make_problem(seed: int, max_value: int = 50, ops: str = "+-", n_operands: int = 2) -> tuple[str, int]:
    """The expression ("17 + 25") and its value for `seed`. Subtractions never go below zero."""
    rng = random.Random(seed)
    value = rng.randint(1, max_value)
    text = str(value)
    for _ in range(n_operands - 1):
        op, b = rng.choice(ops), rng.randint(1, max_value)
        if op == "-" and b > value:
            b = rng.randint(0, value)
        value = _OPS[op](value, b)
        text += f" {op} {b}"
    return text, value


class ArithEnv(BaseEnv):
    """One question, one answer. kwargs: operand range, operators, operand count, reward credits."""

    name = "arith"
    max_turns = 1
    allowed_actions = None
    reward_range = (0.0, 1.0)

    def __init__(self, max_value: int = 50, ops: str = "+-", n_operands: int = 2, format_credit: float = 0.2,
                 number_credit: float = 0.5):
        if not 1 <= max_value <= 10**6:
            raise ValueError(f"max_value must be in [1, 1e6], got {max_value}")
        if not ops or set(ops) - set(_OPS):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
        if not 2 <= n_operands <= 6:
            raise ValueError(f"n_operands must be in [2, 6], got {n_operands}")
        for field, v in (("format_credit", format_credit), ("number_credit", number_credit)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{field} must be in [0, 1], got {v}")
        self.max_value, self.ops, self.n_operands = max_value, ops, n_operands
        self.format_credit, self.number_credit = format_credit, number_credit
        self.system_prompt = "Answer with '#### <number>'."
        self.target = 0
        self._done = True

    def question(self, seed: int) -> tuple[str, int]:
        """The user message for `seed` and its answer."""
        expr, value = make_problem(seed, self.max_value, self.ops, self.n_operands)
        return f"What is {expr}? Give the final answer after ####.", value

    def reset(self, seed: int) -> str:
        text, self.target = self.question(seed)
        self._done = False
        return text

    def optimal_actions(self, seed: int) -> list[str]:
        """The right answer in the right format."""
        return [f"#### {self.question(seed)[1]}"]

    def step(self, model_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("step after the episode ended; call reset")
        self._done = True
        reward = arith_reward(model_text, self.target, self.format_credit, self.number_credit)
        got = final_answer(model_text)
        outcome = "correct" if reward >= 1.0 else ("wrong" if got is not None else "unformatted")
        return StepResult(None, reward, True, {"outcome": outcome, "answer": got, "target": self.target})


def example_rows(n: int, **kwargs: object) -> list[dict[str, object]]:
    """The first `n` problems (seeds 0..n-1) as dataset rows {"prompt", "answer"}: the built-in task as
    a JSONL file for `env: {name: dataset}` (examples/arith.jsonl is `example_rows(64)`)."""
    env = ArithEnv(**kwargs)  # type: ignore[arg-type]
    return [{"prompt": q, "answer": a} for q, a in (env.question(s) for s in range(n))]
