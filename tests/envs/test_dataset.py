"""`dataset` tasks: prompts from JSONL (and Parquet, with pyarrow), rewards from a function by dotted
path or file path, and every problem as one line (at construction) or as a failed trajectory (at step)."""
import json

import pytest

from pearl.envs import EnvRunner, check_env, load_env
from pearl.envs.dataset import DatasetEnv, load_rows
from pearl.errors import ConfigError, EnvironmentFailure

REWARDS = '''
def exact(completion, answer, **row):
    return float(completion.strip() == str(answer))

def needs_hint(completion, answer, hint):
    return 1.0

def boom(completion, **row):
    raise KeyError("answer")

def nan(completion, **row):
    return float("nan")

def text(completion, **row):
    return "high"

def yes(completion, **row):
    return completion == "yes"

NOT_A_FUNCTION = 3
'''


@pytest.fixture()
def task(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in [
        {"prompt": "1+1?", "answer": 2, "level": "easy"},
        {"prompt": "2+3?", "answer": 5, "level": "easy"},
        {"prompt": "7*6?", "answer": 42, "level": "hard"},
    ]) + "\n\n")
    (tmp_path / "rewards.py").write_text(REWARDS)
    return tmp_path


def make(task, reward="exact", **kw):
    return load_env("dataset", path=str(task / "q.jsonl"), reward=f"{task / 'rewards.py'}:{reward}", **kw)


def test_rows_in_order_and_graded(task):
    env = make(task)
    assert [env.reset(s) for s in (0, 1, 2, 3)] == ["1+1?", "2+3?", "7*6?", "1+1?"]
    env.reset(2)
    assert env.step("42").reward == 1.0
    env.reset(2)
    res = env.step("41")
    assert (res.reward, res.done, res.observation) == (0.0, True, None)
    check_env(env)
    assert isinstance(env, DatasetEnv) and env.max_turns == 1


def test_importable_module_and_fields(task, monkeypatch):
    monkeypatch.syspath_prepend(str(task))
    env = load_env("dataset", path=str(task / "q.jsonl"), reward="rewards:exact", fields=["answer"],
                   system_prompt="Be brief.")
    env.reset(0)
    assert env.step("2").reward == 1.0 and env.system_prompt == "Be brief."
    env = make(task, "yes")  # a bool counts as 0 or 1
    env.reset(0)
    assert env.step("yes").reward == 1.0


def test_rows_are_read_once(task):
    assert load_rows(str(task / "q.jsonl")) is load_rows(str(task / "q.jsonl"))


@pytest.mark.parametrize("kw, match", [
    ({"path": "nope.jsonl"}, "data 'nope.jsonl': no such file"),
    ({"prompt_field": "question"}, "no column 'question'; columns: prompt, answer, level"),
    ({"fields": ["answr"]}, "no column 'answr'"),
    ({"reward": "no_such_module_xyz:f"}, "reward 'no_such_module_xyz:f': cannot import module 'no_such_module_xyz'"),
    ({"reward": "{task}/rewards.py:missing"}, "has no attribute 'missing'"),
    ({"reward": "{task}/rewards.py:NOT_A_FUNCTION"}, "is a int, not a function"),
    ({"reward": "{task}/nope.py:f"}, "no such file"),
    ({"reward": "{task}/rewards.py:needs_hint"}, "does not accept .completion, prompt, answer, level.*hint"),
    ({"reward": "exact_match"}, "expected 'package.module:function'"),
])
def test_bad_inputs_are_one_line(task, kw, match):
    args = {"path": str(task / "q.jsonl"), "reward": f"{task / 'rewards.py'}:exact"}
    args.update({k: v.format(task=task) if isinstance(v, str) else v for k, v in kw.items()})
    with pytest.raises(ConfigError, match=match) as info:
        load_env("dataset", **args)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("content, match", [
    ('{"prompt": "a"}\nnot json\n', "line 2: not valid JSON"),
    ('["a"]\n', "line 1: expected a JSON object"),
    ("\n", "has no rows"),
    ('{"prompt": ""}\n', "must be a non-empty string"),
    ('{"prompt": "a"}\n{"question": "b"}\n', "row 2 has no column 'prompt'"),
])
def test_bad_files_are_one_line(tmp_path, content, match):
    (tmp_path / "d.jsonl").write_text(content)
    (tmp_path / "r.py").write_text(REWARDS)
    with pytest.raises(ConfigError, match=match):
        load_env("dataset", path=str(tmp_path / "d.jsonl"), reward=f"{tmp_path / 'r.py'}:text")


def test_unknown_format(tmp_path):
    (tmp_path / "d.csv").write_text("prompt\na\n")
    with pytest.raises(ConfigError, match="unknown format '.csv'; use .jsonl or .parquet"):
        load_rows(str(tmp_path / "d.csv"))


@pytest.mark.parametrize("reward, match", [
    ("boom", r"env dataset: reward .*:boom raised KeyError: 'answer'$"),
    ("nan", r"reward .*:nan returned nan, expected a finite number$"),
    ("text", r"reward .*:text returned 'high', expected a finite number$"),
])
def test_reward_failures_fail_the_trajectory(task, reward, match):
    runner = EnvRunner(make(task, reward), timeout_s=5)
    runner.reset(0)
    with pytest.raises(EnvironmentFailure, match=match) as info:
        runner.step("2")
    assert "\n" not in str(info.value) and runner.failed
    runner.reset(1)  # the next episode starts clean


def test_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"prompt": ["a?", "b?"], "answer": [1, 2]}), tmp_path / "d.parquet")
    (tmp_path / "r.py").write_text(REWARDS)
    env = load_env("dataset", path=str(tmp_path / "d.parquet"), reward=f"{tmp_path / 'r.py'}:exact")
    assert env.reset(1) == "b?" and env.step("2").reward == 1.0


def test_parquet_without_pyarrow_is_one_line(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ConfigError, match=r"reading Parquet needs pyarrow \(pip install 'pearl-rl\[data\]'\)"):
        load_rows(str(tmp_path / "d.parquet"))
