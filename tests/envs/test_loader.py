import random

import pytest

from pearl.envs import BUILTIN_ENVS, BaseEnv, StepResult, check_env, load_env
from pearl.envs.calculator import CalculatorEnv
from pearl.envs.gridworld import GridWorldEnv
from pearl.errors import ConfigError, UnknownNameError


class EchoEnv(BaseEnv):
    name = "echo"
    max_turns = 2

    def __init__(self, greeting: str = "hi"):
        self.greeting, self.t = greeting, 0

    def reset(self, seed):
        self.t = 0
        return f"{self.greeting} {seed}"

    def step(self, text):
        self.t += 1
        done = self.t >= self.max_turns
        return StepResult(None if done else text, 0.5 if done else 0.0, done)


def make_echo(**kwargs):
    return EchoEnv(**kwargs)


class NotAnEnv:
    def reset(self, seed):
        return "x"


class Forever(EchoEnv):
    def step(self, text):
        return StepResult("again", 0.0, False)


class Random(EchoEnv):
    def reset(self, seed):
        return str(random.random())


class TooRewarding(EchoEnv):
    def step(self, text):
        return StepResult(None, 5.0, True)


class Crashes(EchoEnv):
    def step(self, text):
        raise KeyError("oops")


class BadActions(EchoEnv):
    allowed_actions = ["up", "up"]


def test_builtins_load_and_take_kwargs():
    assert sorted(BUILTIN_ENVS) == ["arith", "calculator", "dataset", "gridworld", "gridworld-shift", "guess"]
    assert isinstance(load_env("gridworld", size=5), GridWorldEnv)
    assert load_env("gridworld", size=5).size == 5
    assert isinstance(load_env(" calculator "), CalculatorEnv)


def test_dotted_paths_load_classes_and_factories():
    assert load_env(f"{__name__}:EchoEnv", greeting="yo").reset(1) == "yo 1"
    assert load_env(f"{__name__}.make_echo").reset(2) == "hi 2"
    assert isinstance(load_env("pearl.envs.gridworld:GridWorldEnv"), GridWorldEnv)


@pytest.mark.parametrize("spec, kwargs, err, match", [
    ("chess", {}, UnknownNameError, "unknown environment 'chess'; known: arith, calculator, dataset, gridworld, gridworld-shift, guess"),
    ("no_such_pkg.envs:X", {}, ConfigError, "cannot import module 'no_such_pkg.envs'"),
    ("pearl.envs.gridworld:Nope", {}, ConfigError, "has no attribute 'Nope'"),
    ("pearl.envs.gridworld:MOVES", {}, ConfigError, "not a class or factory"),
    (f"{__name__}:NotAnEnv", {}, ConfigError, "is not an environment .missing or wrong: step"),
    (f"{__name__}:BadActions", {}, ConfigError, "allowed_actions"),
    ("gridworld", {"colour": 3}, ConfigError, r"bad arguments \['colour'\]"),
    ("gridworld", {"size": 1}, ConfigError, r"env 'gridworld': size must be in \[2, 12\], got 1"),
    (":X", {}, ConfigError, "expected 'package.module:Class'"),
    ("", {}, ConfigError, "expected a name"),
])
def test_loader_errors_are_one_line(spec, kwargs, err, match):
    with pytest.raises(err, match=match) as info:
        load_env(spec, **kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("cls, match", [
    (NotAnEnv, "missing or wrong: step, max_turns"),
    (Forever, "did not end within max_turns=2"),
    (Random, "not deterministic"),
    (TooRewarding, "outside reward_range"),
    (Crashes, r"step\(.*\) raised KeyError"),
])
def test_check_env_catches_violations(cls, match):
    with pytest.raises(ConfigError, match=match) as info:
        check_env(cls())
    assert "\n" not in str(info.value)


def test_check_env_accepts_a_user_env():
    check_env(EchoEnv())
