"""`pearl train` ticks the same controller as the simulator on the wall clock: decisions, "keep"
included, land in summary.json with their reasons; a worse starting layout is switched for real (role
flips on live engines) and no trajectory is lost; the trainer's staleness discard is counted once."""
import json
from types import SimpleNamespace

import pytest
from rich.console import Console

from pearl.control.staleness import StalenessGate
from pearl.errors import ConfigError
from pearl.runtime.real import split_batch
from pearl.runtime.train_config import load_train_config
from pearl.runtime.training import run_training
from tests.helpers import tiny_cpu_profile

pytest.importorskip("transformers")

FAST = {"max_steps": 6, "prompts_per_step": 2, "group_size": 4, "rollout_workers": 2,
        "policy": {"decision_interval_s": 0.5, "min_dwell_s": 1.0}}


def _run(tmp_path, **over):
    return run_training(None, {**FAST, **over}, tmp_path, Console(file=open("/dev/null", "w")))


def _books_balance(s):
    t = s["trajectories"]
    assert t["ok"] + t["failed"] + t["stale"] + s["trajectories_unfinished"] == s["trajectories_admitted"]


def test_two_workers_tick_the_controller_and_save_every_decision(tmp_path):
    s = _run(tmp_path)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["controller"]["policy"] == "pearl" and saved["controller"]["ticks"] >= 1
    assert saved["decisions"] and len(saved["decisions"]) == saved["controller"]["decisions"]
    for d in saved["decisions"]:
        assert d["trigger"] == "periodic" and d["reason"].startswith(d["rule"])
        assert d["candidates"] and d["current"]
    _books_balance(s)


def test_a_worse_start_is_switched_for_real_and_nothing_is_lost(tmp_path):
    # 1P:1D is predicted slower than two colocated workers for gridworld's one-token turns (by 30-41%
    # on the recorded calibration, 2026-12-06); one tick that sees it switches (the run lasts 2-3 ticks)
    run = tmp_path / "run"
    s = _run(run, layout="1P:1D", profile=tiny_cpu_profile(tmp_path / "tiny.json"),
             policy={**FAST["policy"], "controller": {"confirm": 1}})
    switched = [d for d in s["decisions"] if d["switch"]]
    assert switched, [d["reason"] for d in s["decisions"]]
    assert switched[0]["current"] == "1P:1D" and switched[0]["chosen"] == "colocated×2"
    assert switched[0]["plan"]["flips"] >= 1 and switched[0]["gain_s"] > 0
    assert s["controller"]["layout_final"] == "colocated×2"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["layout"] == "colocated×2"
    assert s["steps"] == 6 and s["trajectories"]["failed"] == 0
    _books_balance(s)
    # the trace shows it: worker role spans go prefill/decode -> mixed, the switch is an instant
    ev = json.loads((run / "trace.json").read_text())["traceEvents"]
    roles = [e["name"] for e in ev if e["ph"] == "X" and e.get("cat") == "role"]
    assert {"prefill", "decode", "mixed", "training"} <= set(roles)
    assert any(e["ph"] == "i" and e["name"] == "switch" for e in ev)


def test_fixed_policy_keeps_the_layout_and_decides_nothing(tmp_path):
    s = _run(tmp_path, layout="1P:1D", max_steps=2, policy={"name": "fixed"})
    assert s["decisions"] == [] and s["controller"]["layout_final"] == "1P:1D"


def test_policy_elastic_without_an_elastic_source_is_refused_in_one_line():
    with pytest.raises(ConfigError) as e:
        load_train_config(None, {"policy": {"elastic": True}})
    assert "policy.elastic" in str(e.value) and "\n" not in str(e.value)


def _traj(version, ok=True):
    return SimpleNamespace(ok=ok, staleness=lambda v, _x=version: v - _x, reason=None if ok else "x")


def test_a_group_finishing_after_later_ones_is_discarded_as_stale_and_its_slots_return():
    # η = 1: the trainer is at version 3; a group sampled at version 1 finished late (after groups of
    # versions 2 and 3): its trajectories are stale and are discarded, the rest train
    eta, gate = 1, StalenessGate(batch_size=4, eta=1)
    gate.on_start(12)
    gate.on_finish(6, accepted=True)  # the three groups below reached the trainer
    late = SimpleNamespace(trajs=[_traj(1), _traj(1)])
    fresh = [SimpleNamespace(trajs=[_traj(2), _traj(3)]), SimpleNamespace(trajs=[_traj(3), _traj(3, ok=False)])]
    batch, stale, failed = split_batch([*fresh, late], trainer_version=3, eta=eta)
    assert stale == 2 and len(failed) == 1 and len(batch) == 3
    assert max(t.staleness(3) for t in batch) <= eta
    before = gate.capacity(3)
    gate.on_discard(stale)
    assert gate.capacity(3) == before + stale  # the discarded trajectories' slots come back


class SlowTurns:
    """Three turns of 0.2 s: the rollout, not the trainer, is the bottleneck, so the trainer idles."""

    name, max_turns, allowed_actions, system_prompt = "slow", 3, ["U", "D"], ""

    def __init__(self, **kwargs):
        self.turn = 0

    def reset(self, seed: int) -> str:
        self.turn = 0
        return "go"

    def step(self, text: str):
        import time

        from pearl.envs import StepResult

        time.sleep(0.2)
        self.turn += 1
        return StepResult("go", float(text == "U"), self.turn >= 3, {})


def test_the_trainers_device_is_lent_while_it_waits_and_back_before_it_trains(tmp_path):
    # any predicted gain pays (lend_gain_factor 0): the mechanism, not the economics, is under test
    s = _run(tmp_path, rollout_workers=1, max_steps=5,
             env={"name": f"{__name__}:SlowTurns", "kwargs": {}, "use_system_prompt": False},
             policy={"borrow": True, "decision_interval_s": 0.5, "controller": {"lend_gain_factor": 0.0}})
    rules = [d["rule"] for d in s["decisions"] if d["trigger"] == "trainer idle"]
    assert "lend" in rules, [d["reason"] for d in s["decisions"]]
    assert any(d["trigger"] == "borrowed devices returned" for d in s["decisions"])
    assert s["trainer_device_wait_max_s"] < 5.0  # policy.return_bound_s
    assert s["steps"] == 5 and s["trajectories"]["failed"] == 0
    _books_balance(s)
    ev = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["name"] == "lent" for e in ev)


@pytest.mark.parametrize("tp2_eff", [3.0, 0.05])
def test_a_lent_core_serves_as_a_second_thread_or_a_second_worker_as_predicted(tmp_path, monkeypatch, tp2_eff):
    """Both ways of lending the trainer's core, each taken when the models say it is faster
    (a recorded calibration, the two-thread model's efficiency scaled to force each way: the mechanism is under test)."""
    from tests.real.test_tp_switch import scale_two_threads

    scale_two_threads(monkeypatch, tp2_eff)
    s = _run(tmp_path, rollout_workers=1, max_steps=4,
             env={"name": f"{__name__}:SlowTurns", "kwargs": {}, "use_system_prompt": False},
             policy={"borrow": True, "decision_interval_s": 0.5, "controller": {"lend_gain_factor": 0.0}})
    lends = [d for d in s["decisions"] if d["rule"] == "lend"]
    assert lends, [d["reason"] for d in s["decisions"]]
    wide = tp2_eff > 1
    for d in lends:
        assert (", not colocated×2 (" in d["reason"]) == wide, d["reason"]
    spans = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
             if e["ph"] == "X" and e.get("cat") == "role"]
    on_core = [e for e in spans if e["args"].get("pool") == "train" and e["name"] == "mixed"]  # the trainer's core
    assert on_core and {e["args"]["worker"] for e in on_core} == ({0} if wide else set(range(1, len(lends) + 1)))
    assert s["controller"]["workers_started"] == (1 if wide else 1 + len(lends))
    assert s["trainer_device_wait_max_s"] < 5.0 and s["steps"] == 4 and s["trajectories"]["failed"] == 0
    _books_balance(s)


def test_a_thrashing_kv_cache_is_capped_for_real(tmp_path):
    """A KV cache of 2000 tokens for 24 gridworld trajectories allowed in flight (η = 2): the engine
    evicts idle sessions, PEARL lowers the cap on trajectories in flight (`control.admission`) on the
    real staleness gate, the decision is saved with its reason, and nothing is lost."""
    s = _run(tmp_path, rollout_workers=1, staleness=2, engine={"kv_capacity_tokens": 2000},
             policy={**FAST["policy"], "decision_interval_s": 0.25, "controller": {"admission": {"min_requests": 8}}})
    caps = [d for d in s["decisions"] if d["kind"] == "admission"]
    assert caps and "evicted a session's KV" in caps[0]["reason"]
    assert int(caps[0]["chosen"]) < 24
    assert all(int(d["chosen"]) >= 4 for d in caps)  # never below a group: the gate admits whole groups
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert [d for d in saved["decisions"] if d["kind"] == "admission"] == caps
    assert s["steps"] == 6
    _books_balance(s)
