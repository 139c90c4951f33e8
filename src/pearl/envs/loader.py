"""Finding environments by name or dotted path, and the contract every environment must meet.

`load_env("gridworld", size=5)` builds a built-in; `load_env("my_pkg.envs:MyEnv", **kwargs)` imports
a user's class (or factory function) and builds it. Every problem (unknown name, module or attribute
not found, bad arguments, an object that is not an environment) is a one-line `ConfigError`
(`UnknownNameError` for unknown built-in names), never a traceback.

`check_env` is the behavioural contract (used by the tests for every built-in, and available to
users for their own environments): it plays a few episodes and checks types, determinism per seed,
termination within `max_turns` and the bounds of the return.
"""
from __future__ import annotations

import importlib
import math
from typing import Any, Callable

from pearl.envs.base import Env, StepResult
from pearl.errors import ConfigError, UnknownNameError

BUILTIN_ENVS: dict[str, str] = {
    "arith": "pearl.envs.arith:ArithEnv",
    "calculator": "pearl.envs.calculator:CalculatorEnv",
    "dataset": "pearl.envs.dataset:DatasetEnv",
    "gridworld": "pearl.envs.gridworld:GridWorldEnv",
    "gridworld-shift": "pearl.envs.shift:ShiftingGridEnv",
    "guess": "pearl.envs.guess:GuessNumberEnv",
}

_REQUIRED = ("reset", "step", "max_turns", "system_prompt", "allowed_actions")


def resolve(spec: str) -> Callable[..., Any]:
    """The class or factory a spec names (a built-in name or 'package.module:Name')."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"env: expected a name or 'package.module:Class', got {spec!r}")
    spec = spec.strip()
    target = BUILTIN_ENVS.get(spec, spec)
    if ":" not in target and "." not in target:
        raise UnknownNameError("environment", spec, list(BUILTIN_ENVS))
    obj = import_object(target, f"env {spec!r}", "Class")
    if not callable(obj):
        attr = target.partition(":")[2] if ":" in target else target.rpartition(".")[2]
        raise ConfigError(f"env {spec!r}: {attr!r} is a {type(obj).__name__}, not a class or factory")
    return obj


def import_object(target: str, label: str, kind: str = "name") -> Any:
    """The object 'package.module:name' (or 'package.module.name', or 'path/to/file.py:name') names.
    Every problem is a one-line ConfigError starting with `label`."""
    if ":" in target:
        module_name, _, attr = target.rpartition(":")
    else:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{label}: expected 'package.module:{kind}'")
    try:
        if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
            module = _import_file(module_name)
        else:
            module = importlib.import_module(module_name)
    except FileNotFoundError:
        raise ConfigError(f"{label}: no such file {module_name!r}") from None
    except ImportError as err:
        raise ConfigError(f"{label}: cannot import module {module_name!r} ({_brief(err)})") from None
    except Exception as err:  # a user module that fails while importing
        raise ConfigError(f"{label}: importing {module_name!r} failed ({_brief(err)})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{label}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _import_file(path: str) -> Any:
    """A Python file imported as a module (once per resolved path; re-imported when it changes)."""
    import importlib.util
    import sys
    from pathlib import Path

    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(path)
    st = p.stat()
    name = f"_pearl_user_{abs(hash((str(p), st.st_mtime_ns, st.st_size)))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise ImportError(f"not a Python file: {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def load_env(spec: str, **kwargs: Any) -> Env:
    """Build an environment; the result is checked to have the protocol's members."""
    factory = resolve(spec)
    try:
        env = factory(**kwargs)
    except TypeError as err:
        raise ConfigError(f"env {spec!r}: bad arguments {sorted(kwargs)} ({_brief(err)})") from None
    except (ValueError, ConfigError) as err:
        raise ConfigError(f"env {spec!r}: {_brief(err, with_type=False)}") from None
    missing = protocol_gaps(env)
    if missing:
        raise ConfigError(f"env {spec!r}: {type(env).__name__} is not an environment "
                          f"(missing or wrong: {', '.join(missing)})")
    return env


def protocol_gaps(env: Any) -> list[str]:
    """The protocol members `env` lacks or has of the wrong type (empty when it conforms)."""
    gaps = [m for m in _REQUIRED if not hasattr(env, m)]
    if gaps:
        return gaps
    if not callable(env.reset):
        gaps.append("reset")
    if not callable(env.step):
        gaps.append("step")
    mt = env.max_turns
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        gaps.append(f"max_turns={mt!r}")
    if not isinstance(env.system_prompt, str):
        gaps.append("system_prompt")
    acts = env.allowed_actions
    if acts is not None and (not isinstance(acts, list) or not acts or len(set(acts)) != len(acts)
                             or not all(isinstance(a, str) and a for a in acts)):
        gaps.append("allowed_actions (None or a list of distinct non-empty strings)")
    return gaps


_PROBES = ["", "hello", "answer: 0", "calc: 1+1", "up", "1", "\n\n"]


def check_env(env: Any, seeds: tuple[int, ...] = (0, 1, 2), name: str | None = None) -> None:
    """Play episodes with probing actions and raise a one-line ConfigError on the first violation:
    protocol members; `reset(seed)` returns a non-empty str, the same one for the same seed; every
    step returns a StepResult with a finite float reward, a bool `done`, a dict `info` and a str
    observation while not done; every episode ends by itself within `max_turns`; the return lies in
    `reward_range` (default [0, 1]).
    """
    label = name or getattr(env, "name", type(env).__name__)

    def bad(msg: str) -> ConfigError:
        return ConfigError(f"env {label}: contract violated: {msg}")

    gaps = protocol_gaps(env)
    if gaps:
        raise bad(f"missing or wrong: {', '.join(gaps)}")
    def call(fn: Callable[[Any], Any], arg: Any, what: str) -> Any:
        try:
            return fn(arg)
        except Exception as err:
            raise bad(f"{what} raised {_brief(err)}") from None

    lo, hi = getattr(env, "reward_range", (0.0, 1.0))
    policies = [list(env.allowed_actions)] if env.allowed_actions else []
    policies += [_PROBES, _PROBES[::-1]]
    for seed in seeds:
        first = call(env.reset, seed, f"reset({seed})")
        if not isinstance(first, str) or not first:
            raise bad(f"reset({seed}) returned {first!r}, expected a non-empty str")
        for actions in policies:
            again = call(env.reset, seed, f"reset({seed})")
            if again != first:
                raise bad(f"reset({seed}) is not deterministic")
            total, done = 0.0, False
            for turn in range(env.max_turns):
                action = actions[turn % len(actions)]
                res = call(env.step, action, f"step({action!r})")
                _check_result(res, bad)
                total += float(res.reward)
                if res.done:
                    done = True
                    break
            if not done:
                raise bad(f"episode (seed {seed}) did not end within max_turns={env.max_turns}")
            if not lo - 1e-9 <= total <= hi + 1e-9:
                raise bad(f"episode return {total} (seed {seed}) outside reward_range [{lo}, {hi}]")


def _check_result(res: Any, bad: Callable[[str], ConfigError]) -> None:
    if not isinstance(res, StepResult):
        raise bad(f"step returned {type(res).__name__}, expected StepResult")
    r = res.reward
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
        raise bad(f"step returned reward {res.reward!r}, expected a finite float")
    if not isinstance(res.done, bool):
        raise bad(f"step returned done={res.done!r}, expected a bool")
    if not isinstance(res.info, dict):
        raise bad(f"step returned info of type {type(res.info).__name__}, expected dict")
    if not res.done and not isinstance(res.observation, str):
        raise bad("step returned no observation for an unfinished episode")


def _brief(err: BaseException, with_type: bool = True) -> str:
    msg = " ".join(str(err).split())
    return f"{type(err).__name__}: {msg}" if with_type else msg
