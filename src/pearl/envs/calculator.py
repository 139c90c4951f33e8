"""`calculator`: an arithmetic task with a calculator tool, the smallest multi-turn tool-use loop.

The first observation poses a problem ("Compute 12*7+5."). Each turn the model either calls the
tool with `calc: <expression>` (the observation is `result: <value>` or `error: <why>`) or answers
with `answer: <number>`, which ends the episode. Rewards (the return is in [0, 1]):

- 1.0 for the right answer;
- a wrong but well-formed answer earns 0.1 + 0.1 * closeness, with
  closeness = max(0, 1 - |error| / max(10, |target|)), so a model that has learnt the format (and
  roughly the magnitude) already sees a signal;
- nothing for running out of turns or for tool calls (a reward per call would be farmed).

Expressions are evaluated by a small AST walker (numbers, + - * / // % **, parentheses, unary
signs) with bounds on length, exponent and magnitude: never `eval`.
"""
from __future__ import annotations

import ast
import math
import operator
import random
import re

from pearl.envs.base import BaseEnv, StepResult

_MAX_EXPR_CHARS = 200
_MAX_MAGNITUDE = 1e15
_MAX_EXPONENT = 64

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}

_ANSWER = re.compile(r"answer\s*:\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_CALC = re.compile(r"calc\s*:\s*([^\n]*)", re.IGNORECASE)


class CalcError(ValueError):
    """An expression the calculator refuses (shown to the model as `error: ...`)."""


def safe_eval(expr: str) -> int | float:
    """Evaluate a plain arithmetic expression; anything else raises `CalcError`."""
    expr = expr.strip()
    if not expr:
        raise CalcError("empty expression")
    if len(expr) > _MAX_EXPR_CHARS:
        raise CalcError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr.replace("^", "**"), mode="eval")
    except SyntaxError:
        raise CalcError("not an arithmetic expression") from None
    value = _eval(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > _MAX_EXPONENT or (left == 0 and right < 0)):
            raise CalcError("exponent out of range")
        try:
            return _bounded(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except (OverflowError, TypeError):
            raise CalcError("result out of range") from None
    raise CalcError("only numbers, + - * / // % ** and parentheses are allowed")


def _bounded(v: int | float) -> int | float:
    # The magnitude test first: it is exact for huge ints, which float() (in isfinite) cannot take.
    if isinstance(v, complex) or abs(v) > _MAX_MAGNITUDE or not math.isfinite(v):
        raise CalcError("result out of range")
    return v


def format_number(v: int | float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.6g}"


class CalculatorEnv(BaseEnv):
    name = "calculator"
    allowed_actions = None

    def __init__(self, n_operands: int = 3, max_value: int = 20, ops: str = "+-*", max_turns: int = 4):
        if not 2 <= n_operands <= 8:
            raise ValueError(f"n_operands must be in [2, 8], got {n_operands}")
        if not 1 <= max_value <= 10**6:
            raise ValueError(f"max_value must be in [1, 1e6], got {max_value}")
        if not ops or set(ops) - set("+-*"):
            raise ValueError(f"ops must be a non-empty subset of '+-*', got {ops!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.n_operands, self.max_value, self.ops, self.max_turns = n_operands, max_value, ops, max_turns
        self.system_prompt = ("Solve the arithmetic problem. You may use a calculator by replying "
                              "'calc: <expression>'; it replies 'result: <value>'. When you know the "
                              "result, reply 'answer: <number>'.")
        self.problem = ""
        self.target: int | float = 0
        self._turn = 0
        self._done = True

    def make_problem(self, seed: int) -> str:
        rng = random.Random(seed)
        parts = [str(rng.randint(1, self.max_value))]
        for _ in range(self.n_operands - 1):
            parts += [rng.choice(self.ops), str(rng.randint(1, self.max_value))]
        return "".join(parts)

    def reset(self, seed: int) -> str:
        self.problem = self.make_problem(seed)
        self.target = safe_eval(self.problem)
        self._turn, self._done = 0, False
        return f"Compute {self.problem}."

    def step(self, model_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("step after the episode ended; call reset")
        self._turn += 1
        ans = _ANSWER.search(model_text)
        if ans:
            value = float(ans.group(1))
            if math.isclose(value, self.target, rel_tol=1e-9, abs_tol=1e-6):
                return self._end(1.0, {"outcome": "correct", "answer": value})
            # Relative error, but on a scale of at least 10 so that small targets still grade answers.
            closeness = max(0.0, 1 - abs(value - self.target) / max(10.0, abs(self.target)))
            return self._end(0.1 + 0.1 * closeness, {"outcome": "wrong", "answer": value})
        call = _CALC.search(model_text)
        if call:
            try:
                obs = f"result: {format_number(safe_eval(call.group(1)))}"
                info = {"tool": "calc"}
            except CalcError as err:
                obs, info = f"error: {err}", {"tool": "calc", "tool_error": str(err)}
        else:
            obs = "Reply with 'calc: <expression>' or 'answer: <number>'."
            info = {"invalid": True}
        if self._turn >= self.max_turns:
            return self._end(0.0, info | {"outcome": "timeout"})
        return StepResult(obs, 0.0, False, info)

    def optimal_actions(self, seed: int) -> list[str]:
        """A scripted solution: one tool call, then the answer it returned."""
        problem = self.make_problem(seed)
        return [f"calc: {problem}", f"answer: {format_number(safe_eval(problem))}"]

    def _end(self, reward: float, info: dict) -> StepResult:
        self._done = True
        return StepResult(None, reward, True, info)
