import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pearl.rl.trajectory import Status, Trajectory, load_jsonl, save_jsonl


def make(prompt=(1, 2, 3), start_version=2) -> Trajectory:
    t = Trajectory(id="g0-s1", group_id=0, sample_index=1, start_version=start_version)
    t.append_prompt(list(prompt))
    return t


def test_append_keeps_lists_aligned_and_masks_right():
    t = make()
    t.append_model([7, 8], [-0.5, -1.0], version=2)
    t.append_env([4, 5, 6])
    t.append_model([9], [-0.25], version=3)
    t.add_reward(0.5)
    t.finish()
    assert t.token_ids == [1, 2, 3, 7, 8, 4, 5, 6, 9]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 0, 1]
    assert t.logprobs == [0.0, 0.0, 0.0, -0.5, -1.0, 0.0, 0.0, 0.0, -0.25]
    assert t.versions == [-1, -1, -1, 2, 2, -1, -1, -1, 3]
    assert (t.turns, t.num_model_tokens, t.prompt_length, len(t)) == (2, 3, 3, 9)
    assert t.min_version == 2 and t.staleness(5) == 3
    assert t.ok and t.reward == 0.5


def test_per_token_versions_from_an_engine_that_swapped_weights_mid_response():
    t = make()
    t.append_model([7, 8, 9], [-0.1, -0.2, -0.3], version=[3, 3, 4])
    assert t.versions[-3:] == [3, 3, 4] and t.min_version == 3 and t.turns == 1
    with pytest.raises(ValueError, match="3 tokens but 2 versions"):
        t.append_model([7, 8, 9], [-0.1, -0.2, -0.3], version=[3, 4])
    with pytest.raises(ValueError, match="version"):
        t.append_model([7], [-0.1], version=[-2])


def test_min_version_without_model_tokens_is_start_version():
    assert make(start_version=4).min_version == 4


@pytest.mark.parametrize("call, match", [
    (lambda t: t.append_model([1, 2], [-0.1], 0), "log-probs"),
    (lambda t: t.append_model([], [], 0), "at least one token"),
    (lambda t: t.append_model([1], [-0.1], -1), "version"),
    (lambda t: t.append_model([1], [-0.1], True), "version"),
    (lambda t: t.append_model([1], [0.5], 0), "<= 0"),
    (lambda t: t.append_model([1], [float("nan")], 0), "finite"),
    (lambda t: t.append_model([-3], [-0.1], 0), ">= 0"),
    (lambda t: t.append_model([1.5], [-0.1], 0), "integers"),
    (lambda t: t.append_env(["a"]), "integers"),
    (lambda t: t.add_reward(float("inf")), "finite"),
])
def test_misuse_raises_value_error_and_leaves_lists_aligned(call, match):
    t = make()
    before = t.to_dict()
    with pytest.raises(ValueError, match=match):
        call(t)
    assert t.to_dict() == before


def test_order_rules():
    t = Trajectory(id="x", group_id=0)
    with pytest.raises(ValueError, match="prompt before"):
        t.append_model([1], [-0.1], 0)
    with pytest.raises(ValueError, match="append_prompt"):
        t.append_env([1])
    with pytest.raises(ValueError, match="without any model token"):
        t.finish()
    t.append_prompt([1])
    t.append_model([2], [-0.1], 0)
    with pytest.raises(ValueError, match="use append_env"):
        t.append_prompt([3])
    t.finish()
    with pytest.raises(ValueError, match="cannot grow"):
        t.append_env([3])


def test_fail_records_a_one_line_reason():
    t = make()
    t.fail("env gridworld:\n step timed out")
    assert t.status is Status.FAILED and t.reason == "env gridworld: step timed out" and not t.ok
    with pytest.raises(ValueError):
        t.append_env([1])


def test_json_round_trip_and_jsonl(tmp_path):
    t = make()
    t.append_model([7, 8], [-0.5, -1.0], version=2)
    t.add_reward(1.0)
    t.info["env"] = "gridworld"
    t.finish()
    d = json.loads(json.dumps(t.to_dict()))
    assert Trajectory.from_dict(d) == t
    f = tmp_path / "rollouts.jsonl"
    assert save_jsonl(f, [t, make()]) == 2
    back = load_jsonl(f)
    assert back[0] == t and back[1].status is Status.RUNNING


@pytest.mark.parametrize("patch, match", [
    ({"loss_mask": [0, 0]}, "loss_mask has 2"),
    ({"loss_mask": [0, 0, 2]}, "0 or 1"),
    ({"logprobs": [0.0, -1.0, 0.0]}, "masked token 1"),
    ({"status": "weird"}, "unknown status"),
    ({"extra": 1}, "unknown keys"),
    ({"schema": 99}, "schema"),
    ({"status": "failed", "reason": None}, "needs a reason"),
])
def test_from_dict_rejects_corrupt_records(patch, match):
    d = make().to_dict() | patch
    with pytest.raises(ValueError, match=match):
        Trajectory.from_dict(d)


def test_load_jsonl_names_the_bad_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(make().to_dict()) + "\n" + json.dumps({"id": "x"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*missing keys"):
        load_jsonl(f)


# One step of a random rollout: which append, and its arguments. Misuse is allowed on purpose.
_op = st.one_of(
    st.tuples(st.just("prompt"), st.lists(st.integers(0, 99), max_size=4)),
    st.tuples(st.just("env"), st.lists(st.integers(-1, 99), max_size=4)),
    st.tuples(st.just("model"), st.lists(st.integers(0, 99), max_size=4),
              st.lists(st.floats(-20, 0.01, allow_nan=False), max_size=4), st.integers(-1, 9)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_op, max_size=25))
def test_random_appends_keep_every_invariant(ops):
    t = Trajectory(id="h", group_id=3)
    model_tokens = 0
    for op in ops:
        try:
            if op[0] == "prompt":
                t.append_prompt(op[1])
            elif op[0] == "env":
                t.append_env(op[1])
            else:
                t.append_model(op[1], op[2], op[3])
                model_tokens += len(op[1])
        except ValueError:
            pass
        n = len(t.token_ids)
        assert len(t.loss_mask) == len(t.logprobs) == len(t.versions) == n
        assert sum(t.loss_mask) == model_tokens
        for m, lp, v in zip(t.loss_mask, t.logprobs, t.versions):
            assert (lp == 0.0 and v == -1) if m == 0 else (lp <= 0.0 and v >= 0)
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t
