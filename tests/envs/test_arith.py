"""The built-in single-turn `arith` task: problems per seed, the format-aware reward, and that the
example dataset task (examples/arith.jsonl + examples/arith_reward.py) grades the same way."""
import json
from pathlib import Path

import pytest

from pearl.envs import check_env, load_env
from pearl.envs.arith import ArithEnv, arith_reward, final_answer, heldout_seeds, make_problem
from pearl.envs.loader import import_object

ROOT = Path(__file__).resolve().parents[2]


def test_contract_and_determinism():
    check_env(load_env("arith"), seeds=(0, 1, 2, 3))
    check_env(load_env("arith", ops="*", max_value=12, n_operands=3), seeds=(0, 1))
    assert load_env("arith").reset(5) == load_env("arith").reset(5)
    assert load_env("arith").reset(5) != load_env("arith").reset(6)


def test_problems_are_right_and_never_negative():
    for seed in range(300):
        expr, value = make_problem(seed, 50, "+-", 2)
        assert eval(expr) == value >= 0  # plain integers and + -: eval is the reference here
    assert make_problem(1, ops="*")[0].count("*") == 1


@pytest.mark.parametrize("text, reward", [
    ("17 + 25 = 42\n#### 42", 1.0),
    ("#### **42**", 1.0),
    ("#### 42\n#### 41", 1.0),          # the first #### answer counts
    ("#### 41\n#### 42", 0.2),
    ("#### 42.0", 1.0),
    ("17 + 25 = 41\n#### 41", 0.2),     # formatted, wrong
    ("17 + 25 = 42.", 0.5),             # right number, no ####
    ("It is 41.", 0.0),
    ("", 0.0),
])
def test_reward_is_format_aware(text, reward):
    assert arith_reward(text, 42) == reward


def test_step_reports_outcome_and_ends():
    env = ArithEnv()
    question = env.reset(0)
    _, target = env.question(0)
    assert question.startswith("What is ") and "####" in question
    res = env.step(f"#### {target}")
    assert (res.reward, res.done, res.observation, res.info["outcome"]) == (1.0, True, None, "correct")
    with pytest.raises(RuntimeError):
        env.step("#### 1")
    env.reset(0)
    assert env.step("no idea").info["outcome"] == "unformatted"
    assert final_answer("#### -3") == -3.0


def test_heldout_seeds_are_not_training_seeds():
    # pearl train draws seed * 100003 + group index
    assert min(heldout_seeds(64)) > 1000 * 100_003 + 10**6


@pytest.mark.parametrize("kwargs, match", [
    ({"ops": "/"}, "ops must be"), ({"max_value": 0}, "max_value"), ({"n_operands": 1}, "n_operands"),
    ({"format_credit": 2}, "format_credit"),
])
def test_bad_kwargs_are_one_line(kwargs, match):
    from pearl.errors import ConfigError

    with pytest.raises(ConfigError, match=match):
        load_env("arith", **kwargs)


def test_example_dataset_is_the_builtin_task():
    """examples/arith.jsonl holds the built-in's first 64 problems, and the example reward function
    grades exactly like the built-in's."""
    rows = [json.loads(line) for line in (ROOT / "examples" / "arith.jsonl").read_text().splitlines()]
    env = ArithEnv()
    assert rows == [{"prompt": env.question(s)[0], "answer": env.question(s)[1]} for s in range(len(rows))]
    fn = import_object(str(ROOT / "examples" / "arith_reward.py") + ":exact_match", "reward")
    for text in ["#### 42", "#### 1,042", "x = 42", "#### 7 and then 42", "42 #### 41", "", "####"]:
        for answer in (42, 1042, 7):
            assert fn(text, answer=answer, prompt="q") == arith_reward(text, answer)
