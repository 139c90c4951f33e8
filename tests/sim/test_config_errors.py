"""Scenario mistakes are a one-line ConfigError naming the field and the bad value."""
from __future__ import annotations

import pytest

from pearl.config import ScenarioConfig, parse_config
from pearl.errors import ConfigError
from pearl.runtime.sim import Simulator

DISAGG_8 = {"cluster": {"rollout_devices": 8}}


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(data, ScenarioConfig)
    msg = str(ei.value)
    assert "\n" not in msg and len(msg) < 300
    return msg


@pytest.mark.parametrize("data, names", [
    ({"clusterr": {}}, ["clusterr", "unknown field"]),
    ({"cluster": {"rollout_devicez": 3}}, ["cluster.rollout_devicez", "unknown field"]),
    ({"workload": {"profile": "game", "turnz": 3}}, ["workload.turnz"]),
])
def test_unknown_field_is_named_with_its_path(data, names):
    msg = error(data)
    assert all(n in msg for n in names), msg


@pytest.mark.parametrize("data, field, value", [
    ({"cluster": {"rollout_devices": -2}}, "cluster.rollout_devices", "-2"),
    ({"cluster": {"train_devices": 0}}, "cluster.train_devices", "0"),
    ({"rl": {"group_size": -1}}, "rl.group_size", "-1"),
    ({"layout": {"mode": "disaggregated", "prefill": -1, "decode": 3}}, "layout.prefill", "-1"),
    ({"engine": {"max_num_seqs": -8}}, "engine.max_num_seqs", "-8"),
])
def test_negative_count_names_field_and_value(data, field, value):
    msg = error(data)
    assert f"'{field}'" in msg and value in msg, msg


def test_pd_ratio_that_does_not_match_the_devices():
    msg = error({**DISAGG_8, "layout": {"mode": "disaggregated", "prefill": 1, "decode": 3}})
    assert "1P:3D" in msg and "cluster.rollout_devices" in msg and "8" in msg and "4 devices" in msg, msg


def test_pd_ratio_at_tp2_counts_devices_per_worker():
    ok = parse_config({**DISAGG_8, "engine": {"tp": 2}, "layout": {"mode": "disaggregated", "prefill": 1,
                                                                    "decode": 3}}, ScenarioConfig)
    assert ok.layout.prefill + ok.layout.decode == 4
    msg = error({**DISAGG_8, "engine": {"tp": 2}, "layout": {"mode": "disaggregated", "prefill": 2, "decode": 6}})
    assert "2P:6D" in msg and "tp=2" in msg and "16" in msg, msg


def test_disaggregated_layout_needs_both_roles():
    msg = error({**DISAGG_8, "layout": {"mode": "disaggregated", "prefill": 8, "decode": 0}})
    assert "'layout'" in msg and "8P:0D" in msg, msg


@pytest.mark.parametrize("where, path", [
    ({"workload": {"response_tokens": {"kind": "lognormal", "median": 100, "p90": 50}}}, "workload.response_tokens"),
    ({"workload": {"env_latency_s": {"median": 2.0, "p90": 1.0}}}, "workload.env_latency_s"),
    ({"cluster": {"elastic": {"lifetime_s": {"median": 3600, "p90": 60}}}}, "cluster.elastic.lifetime_s"),
])
def test_distribution_with_p90_below_median(where, path):
    msg = error(where)
    assert f"'{path}'" in msg and "p90" in msg and "median" in msg, msg
    assert any(v in msg for v in ("50", "1.0", "60")), msg


def test_uniform_distribution_with_high_below_low():
    msg = error({"workload": {"turns": {"kind": "uniform", "low": 5, "high": 2}}})
    assert "'workload.turns'" in msg and "5" in msg and "2" in msg, msg


def test_distribution_missing_its_parameter():
    msg = error({"workload": {"turns": {"kind": "geometric"}}})
    assert "'workload.turns'" in msg and "mean" in msg, msg


def test_wrong_type_names_field_and_value():
    msg = error({"cluster": {"rollout_devices": "many"}})
    assert "'cluster.rollout_devices'" in msg and "'many'" in msg, msg


def test_unknown_profile_is_a_config_error_listing_the_known_ones():
    cfg = parse_config({"workload": {"profile": "chess"}}, ScenarioConfig)
    with pytest.raises(ConfigError) as ei:
        Simulator(cfg)
    assert "'chess'" in str(ei.value) and "game" in str(ei.value) and "swe" in str(ei.value)


def test_scenario_level_error_is_not_prefixed_twice():
    msg = error({**DISAGG_8, "layout": {"mode": "disaggregated", "prefill": 1, "decode": 3}})
    assert not msg.startswith("config: config:"), msg


@pytest.mark.parametrize("data, field, value", [
    ({"policy": {"controller": {"explore_band": 2}}}, "policy.controller.explore_band", "2"),
    ({"policy": {"controller": {"wake_s": -1}}}, "policy.controller.wake_s", "-1"),
    ({"policy": {"controller": {"confirm": 0}}}, "policy.controller.confirm", "0"),
])
def test_controller_constants_are_validated_fields(data, field, value):
    msg = error(data)
    assert f"'{field}'" in msg and value in msg, msg


def test_a_controller_constant_changes_what_the_controller_does():
    # wake_s prices every start: a huge one makes PEARL keep its layout where it otherwise switches
    base = {"name": "k", "duration_s": 600, "cluster": {"rollout_devices": 4, "train_devices": 4},
            "workload": {"profile": "search"}, "rl": {"prompts_per_batch": 8, "group_size": 4},
            "policy": {"name": "pearl", "decision_interval_s": 20, "min_dwell_s": 30, "borrow": False}}
    quick = Simulator(parse_config(base, ScenarioConfig)).run()
    slow_cfg = {**base, "policy": {**base["policy"], "controller": {"wake_s": 1e6}}}
    slow = Simulator(parse_config(slow_cfg, ScenarioConfig)).run()
    assert quick["reconfiguration"]["switches"] >= 1
    assert slow["reconfiguration"]["switches"] < quick["reconfiguration"]["switches"]


@pytest.mark.parametrize("value, words", [
    (True, "got a boolean"), (8.0, "got a float"), ("8", "got a string"),
])
def test_a_count_takes_an_integer_only(value, words):
    msg = error({"cluster": {"rollout_devices": value}})
    assert "'cluster.rollout_devices'" in msg and repr(value) in msg and words in msg, msg


@pytest.mark.parametrize("data, field", [
    ({"cluster": {"rollout_devices": 10**9}}, "cluster.rollout_devices"),
    ({"cluster": {"elastic": {"max_devices": 10**6}}}, "cluster.elastic.max_devices"),
    ({"engine": {"max_num_seqs": 10**7}}, "engine.max_num_seqs"),
    ({"rl": {"group_size": 10**5}}, "rl.group_size"),
    ({"duration_s": 1e12}, "duration_s"),
    ({"policy": {"min_dwell_s": float("inf")}}, "policy.min_dwell_s"),
    ({"policy": {"controller": {"predict_reps": 10**6}}}, "policy.controller.predict_reps"),
])
def test_sizes_and_durations_are_bounded(data, field):
    assert f"'{field}'" in error(data)


def test_tps_are_distinct_powers_of_two_that_fit_a_node():
    assert "tensor-parallel size 3" in error({"policy": {"tps": [3]}})
    assert "distinct" in error({"policy": {"tps": [1, 1]}})
    assert "does not divide cluster.devices_per_node (4)" in error(
        {"cluster": {"devices_per_node": 4, "rollout_devices": 8}, "policy": {"tps": [8]}})
