"""The controller is one object for both runtimes: a recorded stream of observations gives the same
effects and decisions whichever runtime's driver carries it (virtual or wall clock), and the same
decisions the simulator made when it recorded them; it does no I/O and never reads a runtime."""
from __future__ import annotations

import pytest

from pearl.config import ScenarioConfig, parse_config
from pearl.control.controller import Controller
from pearl.control.observation import Effects, Redecide
from pearl.control.policies import StaticController, make_controller
from pearl.runtime.clock import VirtualClock, WallClock
from pearl.runtime.driver import ControlDriver
from pearl.runtime.sim import Simulator

SCENARIO = dict(
    name="trace", seed=3, duration_s=600, model="qwen3-8b",
    cluster=dict(hardware="h800", rollout_devices=4, train_devices=4,
                 elastic=dict(kind="poisson", arrival_rate_per_h=12, burst=dict(kind="constant", value=4),
                              lifetime_s=dict(kind="lognormal", median=240, p90=600), notice_s=30,
                              notice_probability=0.5, max_devices=8)),
    workload=dict(profile="search"), rl=dict(prompts_per_batch=8, group_size=4, staleness=1),
    policy=dict(name="pearl", decision_interval_s=20, min_dwell_s=30))


class Recorder:
    """Wraps a controller: records every call with its observation and the effects it returned."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.static = inner.name, inner.static

    def first_tick_t(self):
        return self.inner.first_tick_t()

    def on_tick(self, obs):
        eff = self.inner.on_tick(obs)
        self.calls.append(("tick", None, obs, eff))
        return eff

    def on_event(self, ev, obs):
        eff = self.inner.on_event(ev, obs)
        self.calls.append(("event", ev, obs, eff))
        return eff


class LogActuators:
    def __init__(self):
        self.log = []

    def __getattr__(self, name):
        return lambda *args: self.log.append((name, args))


def _record(policy: str = "pearl"):
    cfg = parse_config({**SCENARIO, "policy": {**SCENARIO["policy"], "name": policy}}, ScenarioConfig)
    sim = Simulator(cfg)
    orig = sim.control.setup

    def setup():
        driver = orig()
        driver.controller = Recorder(driver.controller)
        return driver

    sim.control.setup = setup
    res = sim.run()
    return sim, res, driver_setting(sim)


def driver_setting(sim):
    return sim.driver.controller.inner.setting


def _replay(sim, setting, clock):
    """Feed the recorded observations, in order, to a fresh controller through a ControlDriver."""
    ctl = make_controller(sim.cfg.policy, setting)
    calls = list(sim.driver.controller.calls)
    act = LogActuators()
    obs_iter = iter([c[2] for c in calls])
    driver = ControlDriver(ctl, clock, act, lambda tick: next(obs_iter))
    effects = []
    for kind, ev, obs, _ in calls:
        # each recorded call is replayed on its own (follow-ups were recorded as calls of their own)
        eff = ctl.on_tick(next(obs_iter)) if kind == "tick" else ctl.on_event(ev, next(obs_iter))
        then, eff.then = eff.then, None
        driver.apply(eff)
        effects.append((eff.actions, [d.to_dict() for d in eff.decisions], eff.next_tick_t, then, eff.trainer_wait_s))
    return effects, act.log, driver.decisions


@pytest.mark.parametrize("policy", ["pearl", "rlboost+", "roll-partial"])
def test_a_recorded_trace_gives_identical_effects_through_either_runtime_driver(policy):
    sim, res, setting = _record(policy)
    calls = sim.driver.controller.calls
    assert len(calls) >= 10 and any(k == "event" for k, *_ in calls)
    virt = _replay(sim, setting, VirtualClock())
    wall = _replay(sim, setting, WallClock())
    assert virt[0] == wall[0]  # the same actions, decisions, next ticks, follow-ups and waits
    assert [n for n, _ in virt[1]] == [n for n, _ in wall[1]]  # the same immediate actuator calls
    assert virt[2] == wall[2] == res["decisions"]  # and the decisions the simulator itself recorded
    recorded = [(e.actions, [d.to_dict() for d in e.decisions], e.next_tick_t, e.then, e.trainer_wait_s)
                for *_, e in calls]
    assert virt[0] == recorded


def test_the_pearl_trace_switches_borrows_and_keeps_with_reasons():
    sim, res, _ = _record("pearl")
    rules = {d["rule"] for d in res["decisions"]}
    assert "keep" in rules and res["reconfiguration"]["switches"] >= 1
    for d in res["decisions"]:
        assert d["reason"].startswith(d["rule"]) and d["trigger"]
        if d["kind"] == "layout" and d["switch"]:
            assert d["plan"] is not None and d["candidates"]


def test_static_policies_ignore_everything():
    ctl = make_controller(parse_config({"policy": {"name": "fixed"}}, ScenarioConfig).policy, None)
    assert isinstance(ctl, StaticController) and ctl.first_tick_t() is None
    assert ctl.on_event(Redecide("x"), None) == Effects()


def test_the_controller_module_imports_no_runtime():
    import ast
    import inspect

    import pearl.control.controller as mod
    names = {n.module for n in ast.walk(ast.parse(inspect.getsource(mod))) if isinstance(n, ast.ImportFrom)}
    assert not {n for n in names if n and (n.startswith("pearl.runtime") or n.split(".")[0] in
                                           ("torch", "ray", "asyncio", "time", "threading"))}
    assert Controller.on_tick.__doc__
