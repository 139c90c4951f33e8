"""Admission control: PEARL's in-flight cap from the KV-eviction signal (`pearl.control.admission`)."""
from __future__ import annotations

from pearl.config_admission import AdmissionConfig
from pearl.control.admission import AdmissionControl

K = AdmissionConfig()  # high 10%, low 2%, decrease 0.85, step 1/32 of the pipeline, floor 1/8, patience 2


def _ctl(ceiling=None) -> AdmissionControl:
    return AdmissionControl(K, pipeline=512, group=8, ceiling=ceiling)  # step 16, floor 64


class Feed:
    """Counters that grow by `evict` evictions per 100 finished requests each 30-s reading."""

    def __init__(self, ctl: AdmissionControl, devices: int = 8):
        self.ctl, self.t, self.ev, self.req, self.traj, self.devices = ctl, 0.0, 0, 0, 0, devices

    def __call__(self, evict: int, in_flight: float, steady: bool = True, traj: int = 20):
        self.t += 30
        self.ev, self.req, self.traj = self.ev + evict, self.req + 100, self.traj + traj
        return self.ctl.observe(self.t, self.ev, self.req, self.traj, in_flight, steady, self.devices)


def test_a_calm_cache_is_never_capped():
    ctl = _ctl()
    feed = Feed(ctl)
    assert all(feed(evict=1, in_flight=512) is None for _ in range(50))
    assert ctl.cap is None


def test_thrashing_lowers_the_cap_to_a_share_of_what_was_in_flight_then_waits_for_the_drain():
    ctl = _ctl()
    feed = Feed(ctl)
    assert feed(0, 500) is None  # the first reading only marks the counters
    cap, reason = feed(evict=40, in_flight=400)
    assert cap == ctl.cap == 340 and "40% of finished requests" in reason and "at most 340" in reason
    assert feed(evict=40, in_flight=390) is None  # still 390 in flight: the cap has not bitten yet
    cap, _ = feed(evict=40, in_flight=345)
    assert cap == int(0.85 * 340)
    for _ in range(40):  # it never goes below the floor, whatever the signal
        feed(evict=90, in_flight=ctl.cap)
    assert ctl.cap == 64


def test_a_calm_cache_raises_the_cap_step_by_step_once_a_trajectory_life_has_passed():
    ctl = _ctl()
    feed = Feed(ctl)
    feed(0, 500)
    feed(evict=50, in_flight=200)
    assert ctl.cap == 170
    # life by Little's law: 170 in flight, 20 trajectories per 30 s -> 255 s; two calm readings are not enough
    assert feed(0, 170) is None and feed(0, 170) is None
    got = [feed(0, 170) for _ in range(8)]
    raised = [g for g in got if g is not None]
    assert raised and raised[0][0] == 186 and "a trajectory's mean life" in raised[0][1]
    # at the gate's level the cap is lifted altogether
    for _ in range(400):
        feed(0, ctl.cap if ctl.cap is not None else 512)
        if ctl.cap is None:
            break
    assert ctl.cap is None


def test_a_configured_cap_is_a_ceiling():
    ctl = _ctl(ceiling=256)
    feed = Feed(ctl)
    assert ctl.cap == 256
    feed(0, 256)
    assert feed(evict=30, in_flight=256)[0] == int(0.85 * 256)
    for _ in range(400):
        feed(0, ctl.cap)
    assert ctl.cap == 256  # back up to the ceiling, never None, never above


def test_an_interval_with_a_layout_change_is_not_read():
    ctl = _ctl()
    feed = Feed(ctl)
    feed(0, 500)
    assert feed(evict=80, in_flight=500, steady=False) is None  # a switch or a lend evicted by itself
    assert ctl.cap is None
    assert feed(evict=1, in_flight=500) is None and ctl.cap is None


def test_steady_intervals_between_changes_add_up_to_a_reading():
    """A real run lends the trainer's device at every step: each steady interval alone holds too few
    finished requests to read, but the steady ones around the changes add up (the CI run in which the
    cap never moved read nothing because every change restarted the count)."""
    ctl = AdmissionControl(AdmissionConfig(min_requests=150), pipeline=512, group=8)
    feed = Feed(ctl)
    feed(0, 500)
    assert feed(evict=30, in_flight=500) is None  # 100 finished requests: too few
    assert feed(evict=90, in_flight=500, steady=False) is None  # skipped, not a restart
    cap, reason = feed(evict=30, in_flight=500)  # 200 steady requests, 60 evictions: 30%
    assert cap == int(0.85 * 500) and "30% of finished requests" in reason


def test_the_cap_scales_with_the_devices_that_hold_kv():
    ctl = _ctl()
    feed = Feed(ctl, devices=8)
    feed(0, 500)
    feed(evict=50, in_flight=200)
    assert ctl.cap == 170
    feed.devices = 16  # the trainer's 8 devices lent: twice the KV
    cap, reason = feed(evict=1, in_flight=170)
    assert cap == 340 and "16 devices hold KV (were 8)" in reason
    feed.devices = 8  # handed back
    assert feed(evict=1, in_flight=300)[0] == 170


def test_pearl_caps_a_thrashing_simulation_and_the_gate_follows():
    """s1-swe (512 trajectories in flight on 8 devices: the KV cache thrashes): PEARL lowers the cap
    (decisions of kind "admission"), the simulator's gate holds the last cap, nothing is lost; with
    `policy.adapt_cap: false` nothing is capped."""
    from pathlib import Path

    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.sim import Simulator
    from tests.control.test_policies_sim import live_trajectories

    root = Path(__file__).resolve().parents[2]
    over = {"duration_s": 1500, "policy": {"name": "pearl", "borrow": False}}
    sim = Simulator(load_config(root / "scenarios" / "s1-swe-qwen3-8b.yaml", ScenarioConfig, over))
    sim.run()
    caps = [d for d in sim.driver.decisions if d["kind"] == "admission"]
    assert any("evicted a session's KV" in d["reason"] for d in caps)  # (others: scaled to a new layout's devices)
    assert sim.gate.max_concurrent == int(caps[-1]["chosen"]) < 512
    assert sim.next_traj == sim.trained_trajs + sim.discarded + len(live_trajectories(sim))
    over["policy"]["adapt_cap"] = False
    off = Simulator(load_config(root / "scenarios" / "s1-swe-qwen3-8b.yaml", ScenarioConfig, over))
    off.run()
    assert off.gate.max_concurrent is None and not [d for d in off.driver.decisions if d["kind"] == "admission"]


def test_the_cap_never_goes_below_one_group():
    """The gate admits whole groups: a cap below one would admit nothing, ever (a hang)."""
    ctl = AdmissionControl(K, pipeline=24, group=4)  # 1/8 of the pipeline is 3 < 4
    feed = Feed(ctl)
    feed(0, 24)
    for _ in range(30):
        feed(evict=90, in_flight=ctl.cap or 24)
    assert ctl.cap == 4


def test_layouts_are_ranked_at_the_capped_concurrency():
    """s1-swe on 8 devices, colocated×8 against colocated×2@tp4. With all 512 trajectories in flight
    the predictor ranks colocated×8 first, at most 128 in flight colocated×2@tp4, as the simulator
    measures (`benchmarks/predictor_accuracy.py`'s swe cells, mean of 2 seeds: 4012 vs 4097 s at 512,
    2838 vs 2475 s at 128). Once the cap is set the controller predicts at it (predicting at the
    gate's level made PEARL flap between layouts on s1-swe). Once its admission control has set a
    cap, it ranks each layout at the cap that layout would settle at, so at 448 it keeps
    colocated×2@tp4, where a fixed cap of 448 ranks colocated×8 first."""
    from pathlib import Path

    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.sim import Simulator
    from pearl.types import LayoutShape

    root = Path(__file__).resolve().parents[2]
    narrow, wide = LayoutShape.colocated(2, 4), LayoutShape.colocated(8, 1)

    def controller(adapt_cap: bool):
        sim = Simulator(load_config(root / "scenarios" / "s1-swe-qwen3-8b.yaml", ScenarioConfig,
                                    {"policy": {"name": "pearl", "adapt_cap": adapt_cap}}))
        ctl = sim.control.setup().controller  # (not run: the controller as the run would start it)
        specs = [sim.workload.trajectory(i, i // 8) for i in range(512)]  # as if one pipeline had finished
        ctl.workload.observe(specs, len(specs))
        ctl._repredict()
        return ctl

    def first(ctl, cur=narrow):
        return [s for s, _ in ctl._rank([8], [1, 2, 4], cur) if s in (narrow, wide)][0]

    fixed_cap = controller(False)  # no admission control: ranked where it runs
    assert first(fixed_cap) == wide
    fixed_cap._recap(448)
    assert first(fixed_cap) == wide
    whole = fixed_cap._predict([narrow])[0].completion_s
    fixed_cap._recap(128)
    assert fixed_cap.batch.size == 128 and first(fixed_cap) == narrow
    # still the pipeline's completion (512 trajectories), at the capped concurrency
    assert fixed_cap._predict([narrow])[0].completion_s > 0.5 * whole
    adaptive = controller(True)
    assert first(adaptive) == wide  # no cap yet: nothing measured says the cache thrashes
    adaptive.admission.cap = 448  # (as its first thrash reading would set it)
    adaptive._recap(448)
    assert first(adaptive) == narrow


def test_a_configured_cap_is_predicted_from_the_start():
    """`rl.max_concurrent_trajectories` below the gate's level: the controller (and `plan-static`,
    which ranks with it) predicts at that concurrency from the first decision on."""
    from pathlib import Path

    from pearl.config import ScenarioConfig, load_config
    from pearl.runtime.sim import Simulator

    root = Path(__file__).resolve().parents[2]
    for name in ("pearl", "plan-static"):
        sim = Simulator(load_config(root / "scenarios" / "s1-swe-qwen3-8b.yaml", ScenarioConfig,
                                    {"policy": {"name": name}, "rl": {"max_concurrent_trajectories": 128}}))
        ctl = sim.control.setup().controller
        assert ctl.batch.size == 128 and ctl.pipeline == 512


def test_the_cap_stays_within_its_bounds_whatever_the_counters_do():
    """Random ticks (counters that grow by any amount, steady or not, lent devices coming and going):
    the cap is None or between the floor and the gate's level, never above a configured ceiling nor
    None with one, never below one group, and every change it reports is the cap it now holds."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    tick = st.tuples(st.floats(0.1, 120), st.integers(0, 200), st.integers(0, 200), st.integers(0, 50),
                     st.floats(0, 600), st.booleans(), st.sampled_from([0, 4, 8, 16]))

    @settings(max_examples=200, deadline=None)
    @given(st.lists(tick, max_size=60), st.sampled_from([None, 100, 300]), st.sampled_from([4, 8, 64]))
    def run(ticks, ceiling, group):
        ctl = AdmissionControl(K, pipeline=512, group=group, ceiling=ceiling)
        t = ev = req = traj = 0
        for dt, de, dr, dn, flight, steady, devices in ticks:
            t, ev, req, traj = t + dt, ev + de, req + dr, traj + dn
            got = ctl.observe(t, ev, req, traj, flight, steady, devices)
            if got is not None:
                assert got[0] == ctl.cap and got[1].startswith("cap: ")
            if ceiling is not None:
                assert ctl.cap is not None and ctl.cap <= ceiling
            if ctl.cap is not None:
                assert max(group, ctl.floor) <= ctl.cap <= ctl.top

    run()


def test_the_caps_a_layout_is_ranked_at_stay_within_the_floor_and_the_ceiling():
    assert AdmissionControl(K, pipeline=512, group=8).caps() == [128, 192, 256]
    assert AdmissionControl(K, pipeline=512, group=8, ceiling=160).caps() == [128, 160]
    assert AdmissionControl(K, pipeline=24, group=8).caps() == [8, 9, 12]  # never below one group
