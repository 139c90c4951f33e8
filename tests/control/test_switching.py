"""Tests of pearl.control.switching: each rule decides on its own, noise does not make the gate
oscillate, a clearly better candidate is taken once the dwell has passed, a short window vetoes."""
from __future__ import annotations

import math
import random

import pytest

from pearl.config import PolicyConfig
from pearl.control.switching import SwitchGate

INF = math.inf


def run_ticks(gate, ticks, dt, current_of, candidate_of, cost, last=None, start="A"):
    """Drive the gate over `ticks` decisions between layouts A and B; returns the switch times."""
    cur, switched = start, []
    for k in range(ticks):
        now = k * dt
        other = "B" if cur == "A" else "A"
        v = gate.decide(now, current_of(cur, now), candidate_of(other, now), cost, INF, last, other)
        if v.switch:
            cur, last = other, now
            switched.append(now)
    return switched


@pytest.mark.parametrize("seed", range(5))
def test_no_oscillation_under_noisy_predictions(seed):
    # Two near-equal layouts (B 1% faster), each prediction off by up to ±5%, a cheap transition
    # (role flips): over 1000 decisions the gate switches at most a handful of times.
    rng = random.Random(seed)
    true = {"A": 300.0, "B": 297.0}
    noisy = lambda name, now: true[name] * (1 + rng.uniform(-0.05, 0.05))  # noqa: E731
    switches = run_ticks(SwitchGate(margin=0.1, min_dwell_s=60, hysteresis=0.05), 1000, 10.0,
                         noisy, lambda n, t: noisy(n, t) + 0.05, cost=0.2)
    assert len(switches) <= 4, switches


def test_noise_would_oscillate_without_the_streak():
    # The same noise with confirm=1 switches often: the streak is what holds it back.
    rng = random.Random(0)
    noisy = lambda name, now: 300.0 * (1 + rng.uniform(-0.05, 0.05))  # noqa: E731
    switches = run_ticks(SwitchGate(0.1, 60, 0.05, confirm=1), 1000, 10.0, noisy, noisy, cost=0.2)
    assert len(switches) > 20


def test_clear_candidate_is_taken_right_after_the_dwell():
    gate = SwitchGate(margin=0.1, min_dwell_s=60, hysteresis=0.05)
    seen = []
    for k in range(10):
        now = 10.0 * k
        v = gate.decide(now, 300.0, 200.0, 5.0, INF, last_switch_t=0.0, candidate="B")
        seen.append((now, v.switch, v.rule))
        if v.switch:
            break
    assert seen[-1] == (60.0, True, "switch")
    assert all(rule == "dwell" for _, _, rule in seen[:-1])


def test_marginal_candidate_needs_consecutive_confirmations():
    gate = SwitchGate(margin=0.1, min_dwell_s=0, hysteresis=0.05, confirm=3)
    rules = [gate.decide(t, 100.0, 92.0, 1.0, INF, None, "B").rule for t in range(4)]
    assert rules == ["confirm", "confirm", "switch", "confirm"]  # the streak restarts after a switch


def test_streak_is_per_candidate_and_broken_by_a_failing_tick():
    gate = SwitchGate(margin=0.1, min_dwell_s=0, hysteresis=0.05, confirm=2)
    assert gate.decide(0, 100.0, 92.0, 1.0, candidate="B").rule == "confirm"
    assert gate.decide(1, 100.0, 92.0, 1.0, candidate="C").rule == "confirm"  # another candidate
    assert gate.decide(2, 100.0, 99.0, 1.0, candidate="C").rule == "hysteresis"
    assert gate.decide(3, 100.0, 92.0, 1.0, candidate="C").rule == "confirm"
    assert gate.decide(4, 100.0, 92.0, 1.0, candidate="C").switch


def test_short_window_vetoes_and_break_even_is_cost_over_rate():
    gate = SwitchGate(margin=0.1, min_dwell_s=0, hysteresis=0.05, confirm=1)
    # gain 100 s over a 400 s candidate: 0.25 s saved per second; cost 10 s pays back in 40 s
    v = gate.evaluate(0, 500.0, 400.0, 10.0, window_s=30.0)
    assert (v.switch, v.rule, v.gain_s, v.cost_s) == (False, "window", 100.0, 10.0)
    assert v.break_even_s == pytest.approx(40.0)
    assert gate.evaluate(0, 500.0, 400.0, 10.0, window_s=41.0).switch
    assert gate.evaluate(0, 500.0, 400.0, 10.0).switch  # stable devices: window inf


def test_each_rule_names_itself():
    gate = SwitchGate(margin=0.5, min_dwell_s=60, hysteresis=0.1, confirm=1)
    assert gate.evaluate(0, 100.0, 100.0, 0.0).rule == "no-gain"
    assert gate.evaluate(0, 100.0, 120.0, 0.0).break_even_s == INF
    assert gate.evaluate(0, 100.0, 95.0, 0.0).rule == "hysteresis"
    v = gate.evaluate(0, 100.0, 80.0, 14.0)  # gain 20 <= 14 * 1.5
    assert v.rule == "cost" and "does not beat" in v.reason
    assert gate.evaluate(0, 100.0, 80.0, 13.0).switch  # 20 > 19.5
    assert gate.evaluate(30, 100.0, 80.0, 13.0, last_switch_t=0).rule == "dwell"
    assert gate.evaluate(60, 100.0, 80.0, 13.0, last_switch_t=0).switch


def test_from_policy_and_validation():
    gate = SwitchGate.from_policy(PolicyConfig(switch_margin=0.3, min_dwell_s=5))
    assert (gate.margin, gate.min_dwell_s) == (0.3, 5)
    with pytest.raises(ValueError, match="margin"):
        SwitchGate(margin=-1)
    with pytest.raises(ValueError, match="confirm"):
        SwitchGate(confirm=0)
