"""The environment protocol, a base class with defaults, and `EnvRunner`, which contains failures.

An environment is a text game played in turns:

    obs = env.reset(seed)            # the first user message (str); same seed -> same episode
    res = env.step(model_text)       # StepResult(observation, reward, done, info)

`observation` is the next user message (None once `done`). Rewards may come at any step; the
episode return is their sum. Besides `reset`/`step`, an environment declares `name`, `max_turns`
(the most model turns an episode may take), `system_prompt`, and `allowed_actions` (a fixed list of
action strings, or None for free text) so that an engine may restrict sampling to those actions.
Environments see only text: tokenising and chat formatting belong to the agent loop.

`EnvRunner` is what the agent loop calls. It runs `step` with a timeout in a daemon thread (a hung
environment cannot be interrupted, but a daemon thread does not keep the process alive), turns an
exception, a timeout or a malformed result into `EnvironmentFailure` with a one-line reason (the
trajectory fails, the run goes on; a `TaskError`'s message is that reason as is), and truncates
episodes at `max_turns`.
"""
from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import math
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from pearl.errors import EnvironmentFailure, one_line


@dataclass(frozen=True)
class StepResult:
    observation: str | None  # the next user message; None when done
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Env(Protocol):
    name: str
    max_turns: int
    system_prompt: str
    allowed_actions: list[str] | None

    def reset(self, seed: int) -> str: ...

    def step(self, model_text: str) -> StepResult: ...


class TaskError(Exception):
    """Raised by an environment's `step` with a reason worth showing as is (say, "reward x:f raised
    KeyError: 'answer'"): `EnvRunner` fails the trajectory with exactly this message."""


def _in_daemon_thread(fn: Callable[..., Any], *args: Any) -> cf.Future:
    """Run fn(*args) in a fresh daemon thread. Not a thread pool: pool threads are joined at exit,
    so one environment that never returns would hang the whole process on shutdown."""
    fut: cf.Future = cf.Future()

    def run() -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            fut.set_result(fn(*args))
        except BaseException as err:  # handed to the caller, which decides what it means
            fut.set_exception(err)

    threading.Thread(target=run, daemon=True, name="pearl-env").start()
    return fut


class BaseEnv:
    """Defaults for the protocol; subclasses implement `reset` and `step`."""

    name: str = "env"
    max_turns: int = 8
    system_prompt: str = ""
    allowed_actions: list[str] | None = None
    reward_range: tuple[float, float] = (0.0, 1.0)  # bounds on an episode's return (contract-checked)

    def reset(self, seed: int) -> str:
        raise NotImplementedError

    def step(self, model_text: str) -> StepResult:
        raise NotImplementedError

    async def areset(self, seed: int) -> str:
        return await asyncio.wrap_future(_in_daemon_thread(self.reset, seed))

    async def astep(self, model_text: str) -> StepResult:
        """Default: `step` in a thread, so a slow environment does not block the event loop.
        Environments doing real I/O should override this with a native coroutine."""
        return await asyncio.wrap_future(_in_daemon_thread(self.step, model_text))


def _one_line(err: BaseException) -> str:
    msg = " ".join(str(err).split())
    return f"{type(err).__name__}: {msg}" if msg else type(err).__name__


def _native(env: Any, method: str) -> Callable[..., Any] | None:
    """The env's own coroutine `method`, if it has one that is not `BaseEnv`'s thread default."""
    fn = getattr(env, method, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        return None
    if getattr(type(env), method, None) is getattr(BaseEnv, method):
        return None
    return fn


class EnvRunner:
    """Calls one environment for one episode at a time, with a timeout and turn accounting.

    After a failure the environment's state is unknown (a timed-out step may still be running), so
    the runner refuses further calls until the next successful `reset`.
    """

    def __init__(self, env: Env, timeout_s: float | None = 30.0, name: str | None = None):
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 or None, got {timeout_s}")
        self.env = env
        self.timeout_s = timeout_s
        self.name = name or getattr(env, "name", type(env).__name__)
        self.turns = 0
        self.done = True  # until reset
        self.total_reward = 0.0
        self.failed: str | None = None

    # ------------------------------------------------------------ sync
    def reset(self, seed: int) -> str:
        self.turns, self.total_reward, self.failed, self.done = 0, 0.0, None, False
        return self._check_obs(self._call_sync("reset", self.env.reset, seed), "reset")

    def step(self, model_text: str) -> StepResult:
        self._ready()
        return self._account(self._call_sync("step", self.env.step, model_text))

    # ------------------------------------------------------------ async
    async def areset(self, seed: int) -> str:
        self.turns, self.total_reward, self.failed, self.done = 0, 0.0, None, False
        out = await self._call_async("reset", self.env.reset, _native(self.env, "areset"), seed)
        return self._check_obs(out, "reset")

    async def astep(self, model_text: str) -> StepResult:
        self._ready()
        out = await self._call_async("step", self.env.step, _native(self.env, "astep"), model_text)
        return self._account(out)

    # ------------------------------------------------------------ internals
    def _ready(self) -> None:
        if self.failed:
            raise EnvironmentFailure(f"env {self.name}: unusable after an earlier failure ({self.failed})")
        if self.done:
            raise RuntimeError(f"env {self.name}: step() before reset() or after the episode ended")

    def _fail(self, reason: str) -> EnvironmentFailure:
        self.failed = reason
        self.done = True
        return EnvironmentFailure(f"env {self.name}: {reason}")

    def _call_sync(self, what: str, fn: Callable[..., Any], arg: Any) -> Any:
        try:
            if self.timeout_s is None:
                return fn(arg)
            return _in_daemon_thread(fn, arg).result(timeout=self.timeout_s)
        except cf.TimeoutError:
            raise self._fail(f"{what} timed out after {self.timeout_s:g} s") from None
        except TaskError as err:
            raise self._fail(one_line(str(err))) from err
        except Exception as err:
            raise self._fail(f"{what} raised {_one_line(err)}") from err

    async def _call_async(self, what: str, fn: Callable[..., Any], native: Callable[..., Any] | None,
                          arg: Any) -> Any:
        aw = native(arg) if native is not None else asyncio.wrap_future(_in_daemon_thread(fn, arg))
        try:
            return await asyncio.wait_for(aw, self.timeout_s)
        except asyncio.TimeoutError:
            raise self._fail(f"{what} timed out after {self.timeout_s:g} s") from None
        except asyncio.CancelledError:
            raise
        except TaskError as err:
            raise self._fail(one_line(str(err))) from err
        except Exception as err:
            raise self._fail(f"{what} raised {_one_line(err)}") from err

    def _check_obs(self, obs: Any, what: str) -> str:
        if not isinstance(obs, str):
            raise self._fail(f"{what} returned {type(obs).__name__}, expected str")
        return obs

    def _account(self, res: Any) -> StepResult:
        if not isinstance(res, StepResult):
            raise self._fail(f"step returned {type(res).__name__}, expected StepResult")
        try:
            reward = float(res.reward)
        except (TypeError, ValueError):
            raise self._fail(f"step returned a non-numeric reward {res.reward!r}") from None
        if not math.isfinite(reward):
            raise self._fail(f"step returned a non-finite reward {res.reward!r}")
        done = bool(res.done)
        if not done and not isinstance(res.observation, str):
            raise self._fail("step returned no observation for an unfinished episode")
        self.turns += 1
        self.total_reward += reward
        info = dict(res.info) if isinstance(res.info, dict) else {}
        if not done and self.turns >= getattr(self.env, "max_turns", math.inf):
            done, info["truncated"] = True, True
        self.done = done
        return StepResult(res.observation if not done else None, reward, done, info)


def play_episode(env: Env, policy: Callable[[str], str], seed: int,
                 timeout_s: float | None = None) -> tuple[float, int, list[tuple[str, str]]]:
    """Play one episode with a text policy (observation -> model text). Returns the return, the
    number of turns and the transcript [(observation, action), ...]. For tests and scripted play."""
    runner = EnvRunner(env, timeout_s)
    obs = runner.reset(seed)
    transcript = []
    while not runner.done:
        action = policy(obs)
        transcript.append((obs, action))
        obs = runner.step(action).observation or ""  # a str while the episode goes on
    return runner.total_reward, runner.turns, transcript
