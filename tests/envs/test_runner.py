import asyncio
import threading

import pytest

from pearl.envs.base import BaseEnv, EnvRunner, StepResult, play_episode
from pearl.errors import EnvironmentFailure
from pearl.rl.trajectory import Trajectory

RELEASE = threading.Event()  # lets hung env threads finish when the test module is done


@pytest.fixture(autouse=True, scope="module")
def _release_hung_threads():
    yield
    RELEASE.set()


class Scripted(BaseEnv):
    """Behaves per the text it gets: 'boom' raises, 'hang' blocks, 'nan' returns a NaN reward."""

    name = "scripted"
    max_turns = 3

    def reset(self, seed):
        if seed < 0:
            raise RuntimeError("bad seed")
        return f"start {seed}"

    def step(self, text):
        if text == "boom":
            raise ValueError("boom\nsecond line")
        if text == "hang":
            RELEASE.wait(30)
            return StepResult("late", 0.0, False)
        if text == "nan":
            return StepResult("x", float("nan"), False)
        if text == "dict":
            return {"observation": "x"}
        if text == "none":
            return StepResult(None, 0.0, False)
        if text == "end":
            return StepResult(None, 1.0, True, {"outcome": "goal"})
        return StepResult(f"echo {text}", 0.25, False)


class NativeAsync(Scripted):
    async def astep(self, text):
        if text == "hang":
            await asyncio.sleep(30)
        await asyncio.sleep(0)
        return self.step(text)


def test_normal_episode_and_truncation_at_max_turns():
    r = EnvRunner(Scripted(), timeout_s=5)
    assert r.reset(1) == "start 1"
    assert r.step("a") == StepResult("echo a", 0.25, False, {})
    r.step("b")
    last = r.step("c")  # the third turn hits max_turns=3: the runner ends the episode
    assert last.done and last.observation is None and last.info["truncated"]
    assert (r.turns, r.total_reward, r.done) == (3, 0.75, True)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        r.step("d")


@pytest.mark.parametrize("timeout", [5.0, None])
def test_exception_becomes_one_line_environment_failure(timeout):
    r = EnvRunner(Scripted(), timeout_s=timeout)
    r.reset(0)
    with pytest.raises(EnvironmentFailure) as err:
        r.step("boom")
    assert str(err.value) == "env scripted: step raised ValueError: boom second line"
    assert r.failed and r.done
    with pytest.raises(EnvironmentFailure, match="unusable after an earlier failure"):
        r.step("a")
    assert r.reset(2) == "start 2"  # a fresh episode works again
    assert r.step("a").reward == 0.25


def test_reset_failure_is_reported():
    with pytest.raises(EnvironmentFailure, match="reset raised RuntimeError: bad seed"):
        EnvRunner(Scripted(), timeout_s=5).reset(-1)


def test_hang_becomes_timeout_failure():
    r = EnvRunner(Scripted(), timeout_s=0.2)
    r.reset(0)
    with pytest.raises(EnvironmentFailure, match=r"^env scripted: step timed out after 0.2 s$"):
        r.step("hang")


@pytest.mark.parametrize("text, match", [
    ("nan", "non-finite reward"),
    ("dict", "returned dict, expected StepResult"),
    ("none", "no observation"),
])
def test_malformed_results_fail_the_trajectory(text, match):
    r = EnvRunner(Scripted(), timeout_s=5)
    r.reset(0)
    with pytest.raises(EnvironmentFailure, match=match):
        r.step(text)


def test_async_default_thread_and_native_coroutine():
    async def main():
        out = []
        for env in (Scripted(), NativeAsync()):
            r = EnvRunner(env, timeout_s=0.2)
            assert await r.areset(3) == "start 3"
            out.append(await r.astep("x"))
            with pytest.raises(EnvironmentFailure, match="timed out after 0.2 s"):
                await r.astep("hang")
            await r.areset(0)
            with pytest.raises(EnvironmentFailure, match="raised ValueError: boom"):
                await r.astep("boom")
        # many episodes concurrently: the event loop is not blocked by a slow step
        runners = [EnvRunner(Scripted(), timeout_s=5) for _ in range(8)]
        await asyncio.gather(*(r.areset(i) for i, r in enumerate(runners)))
        res = await asyncio.gather(*(r.astep("end") for r in runners))
        return out, res

    out, res = asyncio.run(main())
    assert out[0] == out[1] == StepResult("echo x", 0.25, False, {})
    assert all(r.done and r.reward == 1.0 for r in res)


def test_base_env_astep_default():
    env = Scripted()
    env.reset(0)
    assert asyncio.run(env.astep("q")).observation == "echo q"


def test_failure_reason_lands_on_the_trajectory():
    t = Trajectory(id="x", group_id=0)
    t.append_prompt([1])
    t.append_model([2], [-0.3], 0)
    r = EnvRunner(Scripted(), timeout_s=0.2)
    r.reset(0)
    try:
        r.step("hang")
    except EnvironmentFailure as err:
        t.fail(str(err))
    assert not t.ok and "timed out" in t.reason


def test_play_episode():
    ret, turns, transcript = play_episode(Scripted(), lambda obs: "end" if "echo" in obs else "a", seed=0)
    assert (ret, turns) == (1.25, 2)
    assert transcript == [("start 0", "a"), ("echo a", "end")]


def test_bad_timeout():
    with pytest.raises(ValueError):
        EnvRunner(Scripted(), timeout_s=0)
