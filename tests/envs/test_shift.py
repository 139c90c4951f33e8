"""`gridworld-shift`: gridworld's game whose observations grow after a number of episodes, so a real
run's workload shifts mid-run (the controller's side: tests/real/test_workload_shift.py)."""
import pytest

from pearl.envs import load_env
from pearl.errors import ConfigError


def test_observations_grow_after_shift_after_episodes_and_the_game_is_unchanged():
    envs = [load_env("gridworld-shift", shift_after=2, pad=300, run="unit-a") for _ in range(4)]
    plain = load_env("gridworld")
    first = [e.reset(0) for e in envs]
    assert first[:2] == [plain.reset(0)] * 2  # before the shift: gridworld as is
    assert all(len(o) >= len(plain.reset(0)) + 300 and o.endswith(plain.reset(0)) for o in first[2:])
    a, b = envs[3].step("right"), plain.step("right")
    assert (a.reward, a.done) == (b.reward, b.done) and a.observation.endswith(b.observation)
    assert len(a.observation) > len(b.observation) + 300  # every later turn's observation too


def test_observations_may_shrink_instead():
    envs = [load_env("gridworld-shift", shift_after=1, pad=0, pad_before=500, run="unit-d") for _ in range(2)]
    plain = load_env("gridworld").reset(0)
    first, second = envs[0].reset(0), envs[1].reset(0)
    assert len(first) >= len(plain) + 500 and first.endswith(plain)
    assert second == plain


def test_each_run_key_has_its_own_clock():
    load_env("gridworld-shift", shift_after=1, run="unit-b").reset(0)
    other = load_env("gridworld-shift", shift_after=1, pad=50, run="unit-c")
    assert other.reset(0) == load_env("gridworld").reset(0)  # unit-b's episode does not count here


def test_bad_arguments_are_one_line_config_errors():
    with pytest.raises(ConfigError) as e:
        load_env("gridworld-shift", shift_after=-1)
    assert "shift_after" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="pad_before must be in"):
        load_env("gridworld-shift", pad_before=-5)
