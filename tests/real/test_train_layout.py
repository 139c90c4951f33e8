"""`layout: auto` in the real training loop: the controller's selector picks the rollout layout, the
decision (with its reason and ranked predictions) is in summary.json, and the run uses it."""
import json

import pytest
from rich.console import Console

from pearl.errors import ConfigError
from pearl.runtime.train_config import load_train_config
from pearl.runtime.training import run_training

pytest.importorskip("transformers")

FAST = {"max_steps": 2, "prompts_per_step": 2, "group_size": 4, "layout": "auto"}
ALLOWED = {"colocated", "1P:1D"}


def _run(tmp_path, **over):
    return run_training(None, {**FAST, **over}, tmp_path, Console(file=open("/dev/null", "w")))


def test_auto_with_two_workers_selects_and_records_the_decision(tmp_path):
    s = _run(tmp_path, rollout_workers=2)
    assert s["steps"] == 2
    d = json.loads((tmp_path / "summary.json").read_text())["layout_decision"]
    assert d["requested"] == "auto" and d["chosen"] in ALLOWED and d["reason"].strip()
    assert 1 <= len(d["ranked"]) <= 3
    assert all(r["predicted_s"] > 0 for r in d["ranked"])
    assert d["ranked"][0]["score_s"] == min(r["score_s"] for r in d["ranked"])
    # the run used the chosen layout
    assert s["layout"].startswith(d["chosen"])
    assert ("prefill+decode" in s["layout"]) == (d["chosen"] == "1P:1D")


def test_auto_with_one_worker_is_colocated(tmp_path):
    s = _run(tmp_path, rollout_workers=1, max_steps=1)
    d = s["layout_decision"]
    assert d["chosen"] == "colocated" and "1 rollout worker" in d["reason"]
    assert s["layout"].startswith("colocated")


def test_auto_is_the_default():
    assert load_train_config(None).layout == "auto"


def test_bad_layout_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as e:
        load_train_config(None, {"layout": "2P:2D"})
    msg = str(e.value)
    assert "layout" in msg and "\n" not in msg


def test_missing_profile_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="profile"):
        _run(tmp_path, rollout_workers=2, profile=str(tmp_path / "nope.json"))
