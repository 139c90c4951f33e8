"""Tests of pearl.control.state: each transition, each illegal one, the invariant checker, and a
hypothesis state machine driving random legal and illegal sequences."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pearl.control.state import ClusterState, StateError
from pearl.types import DeviceStatus, LayoutShape, Mode, Pool, Role, WorkerPhase

T, R, E = Pool.TRAIN, Pool.ROLLOUT, Pool.ELASTIC


def make(train=2, rollout=2, elastic=2, node_of=lambda pool, i: 0) -> ClusterState:
    s = ClusterState()
    for pool, n in ((T, train), (R, rollout), (E, elastic)):
        for i in range(n):
            s.add_device(0.0, pool, node=node_of(pool, i))
    return s  # devices: train 0..1, rollout 2..3, elastic 4..5


def raises(rule: str, fn, *args):
    with pytest.raises(StateError) as ei:
        fn(*args)
    assert ei.value.rule == rule and f"[{rule}]" in str(ei.value)
    return ei.value


def free(s: ClusterState, pools=None) -> list[int]:
    """FREE devices (usable for a new worker), optionally only from `pools`, by id."""
    return [d.id for d in s.devices.values() if d.status is DeviceStatus.FREE and (pools is None or d.pool in pools)]


def live(s: ClusterState) -> list:
    """Workers holding devices (every phase but STOPPED), by id."""
    return [w for w in s.workers.values() if w.phase is not WorkerPhase.STOPPED]


def snapshot(s: ClusterState):
    return copy.deepcopy((s.devices, s.workers, s.events, s._next_dev, s._next_worker, s._now))


# ------------------------------------------------------------------ device transitions

def test_add_device_defaults_ids_and_events():
    s = make()
    assert [s.devices[d].status for d in range(6)] == [DeviceStatus.TRAINING] * 2 + [DeviceStatus.FREE] * 4
    assert s.devices_of(T) == [0, 1] and s.devices_of(R) == [2, 3] and s.devices_of(E) == [4, 5]
    assert [e.kind for e in s.events] == ["device_added"] * 6
    assert s.budget() == 4 and free(s) == [2, 3, 4, 5] and free(s, {E}) == [4, 5]
    assert s.add_device(1.0, R, status=DeviceStatus.FREE) == 6


@pytest.mark.parametrize("pool,status", [(T, DeviceStatus.FREE), (R, DeviceStatus.TRAINING), (E, DeviceStatus.GONE)])
def test_add_device_bad_status(pool, status):
    s = ClusterState()
    assert "starts" in str(raises("add-status", s.add_device, 0.0, pool, 0, status))
    assert not s.devices and not s.events


def test_lend_and_reclaim():
    s = make()
    s.lend(1.0, 0, 10.0)
    d = s.devices[0]
    assert (d.status, d.lease_deadline) == (DeviceStatus.FREE, 10.0)
    assert s.lent_devices() == [0] and s.budget() == 5 and free(s, {T}) == [0]
    s.reclaim(12.5, 0)
    assert (d.status, d.lease_deadline) == (DeviceStatus.TRAINING, None) and s.lent_devices() == []
    assert s.events[-1].kind == "reclaimed" and s.events[-1].data["late"] == 2.5
    assert s.events[-2].kind == "lent"


def test_lend_illegal():
    s = make()
    raises("lend-training-only", s.lend, 1.0, 2, 5.0)  # rollout device
    s.lend(1.0, 0, 5.0)
    raises("lend-training-only", s.lend, 1.0, 0, 5.0)  # already lent
    raises("lease-future", s.lend, 2.0, 1, 1.5)
    s.set_training(2.0, [1], True)
    e = raises("lend-idle-only", s.lend, 2.0, 1, 9.0)
    assert "device 1" in str(e)
    raises("unknown-device", s.lend, 2.0, 99, 9.0)


def test_a_worker_takes_a_lent_device_and_gives_it_back_without_a_restart():
    s = make(node_of=lambda pool, i: 1 if pool is E else 0)
    w = s.start_worker(0.0, (2,), Role.MIXED, 0)
    s.worker_ready(0.0, w)
    s.lend(1.0, 0, 5.0)
    s.resize_worker(1.0, w, (2, 0))  # tp 1 -> 2 on the lent device
    assert s.workers[w].devices == (2, 0) and s.devices[0].worker == w and s.shape() == LayoutShape.colocated(1, 2)
    assert s.workers[w].phase is WorkerPhase.SERVING and s.events[-1].kind == "worker_resized"
    raises("reclaim-not-serving", s.reclaim, 2.0, 0)
    s.resize_worker(3.0, w, (2,))  # back: the lent device is free again, its lease kept
    assert s.devices[0].status is DeviceStatus.FREE and s.devices[0].lease_deadline == 5.0
    s.reclaim(3.0, 0)
    assert s.devices[0].status is DeviceStatus.TRAINING and s.shape() == LayoutShape.colocated(1, 1)
    raises("resize-onto-free", s.resize_worker, 4.0, w, (2, 1))  # the trainer's, not lent
    raises("resize-onto-free", s.resize_worker, 4.0, w, (2, 4))  # another node
    raises("resize-live", s.resize_worker, 4.0, w, ())
    s.stop_worker(5.0, w)
    raises("resize-live", s.resize_worker, 6.0, w, (2,))


def test_reclaim_illegal():
    s = make()
    raises("reclaim-lent-only", s.reclaim, 1.0, 0)  # not lent
    raises("reclaim-lent-only", s.reclaim, 1.0, 2)  # rollout
    s.lend(1.0, 0, 5.0)
    w = s.start_worker(1.0, (0,), Role.PREFILL, 0)
    e = raises("reclaim-not-serving", s.reclaim, 2.0, 0)
    assert f"worker {w}" in str(e)
    s.stop_worker(3.0, w)
    assert s.devices[0].lease_deadline == 5.0  # the lease outlives the worker
    s.reclaim(3.0, 0)


def test_set_training():
    s = make()
    s.set_training(1.0, [0, 1], True)
    assert all(s.devices[d].trainer_busy for d in (0, 1)) and s.events[-1].data == {"devs": [0, 1], "training": True}
    s.set_training(2.0, (0, 1), False)
    s.lend(2.0, 0, 9.0)
    raises("train-unlent-only", s.set_training, 3.0, [0, 1], True)  # 0 is lent: reclaim first
    assert not s.devices[1].trainer_busy  # nothing changed
    raises("train-unlent-only", s.set_training, 3.0, [2], True)
    raises("distinct-devices", s.set_training, 3.0, [1, 1], True)


def test_notice_and_remove_device():
    s = make()
    s.notice(1.0, 4, 5.0)
    assert s.devices[4].notice_at == 5.0
    s.notice(2.0, 4, 4.0)  # a later notice replaces the earlier one
    assert s.devices[4].notice_at == 4.0
    w = s.start_worker(2.0, (4, 5), Role.DECODE, 3)
    n = len(s.events)
    assert s.remove_device(4.0, 4, abrupt=False) == w
    assert [e.kind for e in s.events[n:]] == ["device_removed", "worker_stopped"]
    assert s.events[-1].data["devices"] == [4, 5] and s.events[-1].data["lost_dev"] == 4
    assert s.workers[w].phase is WorkerPhase.STOPPED and s.workers[w].devices == ()
    assert s.devices[4].status is DeviceStatus.GONE and s.devices[4].worker is None
    assert s.devices[5].status is DeviceStatus.FREE and s.devices[5].worker is None
    assert s.remove_device(5.0, 5, abrupt=True) is None and s.events[-1].data["abrupt"] is True
    assert s.devices_of(E) == [] and s.budget() == 2


def test_notice_and_remove_illegal():
    s = make()
    raises("notice-elastic-only", s.notice, 1.0, 0, 5.0)
    raises("notice-elastic-only", s.notice, 1.0, 2, 5.0)
    raises("notice-future", s.notice, 1.0, 4, 0.5)
    raises("gone-elastic-only", s.remove_device, 1.0, 2, True)
    raises("gone-elastic-only", s.remove_device, 1.0, 0, True)
    s.remove_device(1.0, 4, True)
    raises("gone-is-final", s.remove_device, 1.0, 4, True)
    raises("gone-is-final", s.notice, 1.0, 4, 3.0)
    raises("start-on-free", s.start_worker, 1.0, (4,), Role.MIXED, 0)


# ------------------------------------------------------------------ worker transitions

def test_worker_lifecycle():
    s = make()
    w = s.start_worker(1.0, (2, 3), Role.MIXED, 7)
    wk = s.workers[w]
    assert (wk.phase, wk.role, wk.weight_version, wk.started_at, wk.devices) == (
        WorkerPhase.LOADING, Role.MIXED, 7, 1.0, (2, 3))
    assert all(s.devices[d].status is DeviceStatus.SERVING and s.devices[d].worker == w for d in (2, 3))
    assert s.serving_workers() == [] and live(s) == [wk] and free(s) == [4, 5]
    s.worker_ready(2.0, w)
    assert s.serving_workers() == [wk] and s.serving_workers(Role.PREFILL) == []
    s.set_version(3.0, w, 8)
    s.set_version(3.0, w, 8)  # idempotent push is fine
    s.set_role(4.5, w, Role.DECODE)  # role flip with resident weights: the phase is unchanged
    assert (wk.phase, wk.role, wk.weight_version) == (WorkerPhase.SERVING, Role.DECODE, 8)
    assert s.serving_workers(Role.DECODE) == [wk] and s.serving_workers(Role.MIXED) == []
    s.stop_worker(6.0, w)
    assert wk.phase is WorkerPhase.STOPPED and wk.devices == () and free(s) == [2, 3, 4, 5] and live(s) == []
    kinds = [e.kind for e in s.events[6:]]
    assert kinds == ["worker_started", "worker_ready", "version_set", "version_set", "role_set", "worker_stopped"]
    assert s.start_worker(7.0, (2,), Role.PREFILL, 8) == w + 1  # ids never reused


def test_start_worker_illegal():
    s = make(node_of=lambda pool, i: i)  # train 0,1 / rollout 2,3 / elastic 4,5 on nodes 0,1
    raises("worker-needs-devices", s.start_worker, 1.0, (), Role.MIXED, 0)
    raises("distinct-devices", s.start_worker, 1.0, (2, 2), Role.MIXED, 0)
    raises("version-nonnegative", s.start_worker, 1.0, (2,), Role.MIXED, -1)
    raises("start-on-free", s.start_worker, 1.0, (0,), Role.MIXED, 0)  # TRAINING
    raises("unknown-device", s.start_worker, 1.0, (2, 42), Role.MIXED, 0)
    e = raises("tp-one-node", s.start_worker, 1.0, (2, 3), Role.MIXED, 0)
    assert "span nodes [0, 1]" in str(e)
    s.start_worker(1.0, (2, 4), Role.MIXED, 0)  # same node, different pools: allowed
    raises("start-on-free", s.start_worker, 1.0, (3, 4), Role.MIXED, 0)  # 4 is SERVING
    assert len(s.workers) == 1


def test_worker_transitions_illegal():
    s = make()
    w = s.start_worker(1.0, (2,), Role.MIXED, 1)
    s.worker_ready(1.0, w)
    raises("ready-from-loading", s.worker_ready, 1.0, w)
    raises("version-monotonic", s.set_version, 1.0, w, 0)
    s.stop_worker(2.0, w)
    for fn, args in ((s.worker_ready, ()), (s.stop_worker, ()), (s.set_role, (Role.DECODE,)),
                     (s.set_version, (5,))):
        with pytest.raises(StateError, match=f"worker {w}"):
            fn(3.0, w, *args)
    raises("unknown-worker", s.stop_worker, 3.0, 99)


def test_time_is_monotonic_and_illegal_calls_change_nothing():
    s = make()
    s.lend(5.0, 0, 9.0)
    before = snapshot(s)
    raises("time-monotonic", s.reclaim, 4.0, 0)
    raises("time-monotonic", s.add_device, float("nan"), R)
    raises("reclaim-lent-only", s.reclaim, 6.0, 1)
    assert snapshot(s) == before


# ------------------------------------------------------------------ queries

def test_shape():
    s = make(train=0, rollout=4, elastic=0)
    assert s.shape() == LayoutShape.colocated(0)
    a = s.start_worker(0.0, (0,), Role.MIXED, 0)
    b = s.start_worker(0.0, (1,), Role.MIXED, 0)
    assert s.shape() == LayoutShape.colocated(2)
    s.worker_ready(0.0, a)
    s.set_role(0.0, a, Role.PREFILL)
    s.set_role(0.0, b, Role.DECODE)
    c = s.start_worker(0.0, (2, 3), Role.DECODE, 0)
    assert s.shape() == LayoutShape(Mode.DISAGGREGATED, n_prefill=1, n_decode=2, tp=1)
    s.stop_worker(1.0, b)
    # each role of one size, the sizes differ: a per-role tp (tp1 prefill, tp2 decode)
    assert s.shape() == LayoutShape.disaggregated(1, 1, tp=2, tp_prefill=1)
    d = s.start_worker(1.0, (1,), Role.DECODE, 0)  # decode workers of two sizes: one tp, the larger on a tie
    assert s.shape() == LayoutShape(Mode.DISAGGREGATED, n_prefill=1, n_decode=2, tp=1)
    s.stop_worker(1.0, d)
    s.worker_ready(1.0, c)
    s.stop_worker(1.0, c)  # stopped workers leave the layout
    assert s.shape() == LayoutShape.disaggregated(1, 0)


def test_timeline_is_json_and_one_event_per_transition():
    s = make()
    s.lend(1.0, 0, 2.0)
    w = s.start_worker(1.0, (0, 4), Role.PREFILL, 0)
    s.notice(1.5, 4, 3.0)
    s.remove_device(3.0, 4, abrupt=True)
    tl = s.timeline()
    assert len(tl) == 6 + 4 + 1
    assert tl[-1] == {"t": 3.0, "kind": "worker_stopped", "worker": w, "devices": [0, 4],
                      "reason": "device_removed", "lost_dev": 4}
    assert json.loads(json.dumps(tl)) == tl


# ------------------------------------------------------------------ invariant checker

def _serving(s):
    s.lend(1.0, 0, 9.0)
    return s, s.start_worker(1.0, (0, 2), Role.MIXED, 0)


CORRUPTIONS = {
    "serving-has-live-worker": lambda s, w: setattr(s.workers[w], "phase", WorkerPhase.STOPPED),
    "worker-iff-serving": lambda s, w: setattr(s.devices[3], "worker", w),
    "worker-points-back": lambda s, w: setattr(s.workers[w], "devices", (0,)),
    "training-is-unlent-train": lambda s, w: setattr(s.devices[1], "lease_deadline", 3.0),
    "train-free-is-lent": lambda s, w: setattr(s.devices[0], "lease_deadline", None),
    "lease-train-only": lambda s, w: setattr(s.devices[3], "lease_deadline", 3.0),
    "busy-is-training": lambda s, w: setattr(s.devices[3], "trainer_busy", True),
    "gone-elastic-only": lambda s, w: setattr(s.devices[3], "status", DeviceStatus.GONE),
    "ids-unique": lambda s, w: s.devices.__setitem__(7, copy.copy(s.devices[3])),
    "stopped-holds-nothing": lambda s, w: (s.stop_worker(2.0, w), setattr(s.workers[w], "devices", (3,))),
    "tp-one-node": lambda s, w: setattr(s.devices[2], "node", 1),
}


@pytest.mark.parametrize("rule", sorted(CORRUPTIONS))
def test_check_invariants_names_the_broken_rule(rule):
    s, w = _serving(make())
    s.check_invariants()
    CORRUPTIONS[rule](s, w)
    raises(rule, s.check_invariants)


def test_check_false_skips_invariants_but_keeps_preconditions():
    s, w = _serving(make())
    s.check = False
    CORRUPTIONS["lease-train-only"](s, w)
    s.add_device(2.0, R)  # a full check would fail here
    raises("lend-training-only", s.lend, 2.0, 2, 9.0)
    s.check = True
    raises("lease-train-only", s.add_device, 2.0, R)


# ------------------------------------------------------------------ random sequences

class ClusterMachine(RuleBasedStateMachine):
    """Random legal transitions (preconditions pick only legal arguments) interleaved with illegal
    attempts that must raise StateError and leave everything unchanged."""

    @initialize()
    def setup(self):
        self.s = ClusterState(check=True)
        self.t = 0.0
        self.ok = 0  # successful transitions + workers stopped by a device removal

    def _devs(self, pred):
        return [d.id for d in self.s.devices.values() if pred(d)]

    def _wks(self, *phases):
        return [w.id for w in self.s.workers.values() if w.phase in phases]

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0]))
    def tick(self, dt):
        self.t += dt

    @precondition(lambda self: len(self.s.devices) < 14)
    @rule(pool=st.sampled_from(list(Pool)), node=st.integers(0, 2))
    def add_device(self, pool, node):
        n = self.s._next_dev
        assert self.s.add_device(self.t, pool, node) == n and n == max(self.s.devices)
        self.ok += 1

    @rule(data=st.data())
    def elastic_event(self, data):
        cand = self._devs(lambda d: d.pool is E and d.status is not DeviceStatus.GONE)
        if not cand:
            return
        dev = data.draw(st.sampled_from(cand))
        if data.draw(st.booleans()):
            self.s.notice(self.t, dev, self.t + data.draw(st.sampled_from([0.0, 2.0])))
            self.ok += 1
            return
        held = self.s.devices[dev].worker
        wid = self.s.remove_device(self.t, dev, abrupt=data.draw(st.booleans()))
        assert wid == held
        self.ok += 1 + (wid is not None)
        if wid is not None:
            assert self.s.workers[wid].phase is WorkerPhase.STOPPED

    @rule(data=st.data())
    def trainer(self, data):
        cand = self._devs(lambda d: d.status is DeviceStatus.TRAINING)
        lent = self._devs(lambda d: d.lease_deadline is not None and d.worker is None)
        op = data.draw(st.sampled_from(["lend", "reclaim", "train"]))
        if op == "lend" and (idle := [d for d in cand if not self.s.devices[d].trainer_busy]):
            self.s.lend(self.t, data.draw(st.sampled_from(idle)), self.t + 5.0)
        elif op == "reclaim" and lent:
            self.s.reclaim(self.t, data.draw(st.sampled_from(lent)))
        elif op == "train" and cand:
            self.s.set_training(self.t, data.draw(st.sets(st.sampled_from(cand))), data.draw(st.booleans()))
        else:
            return
        self.ok += 1

    @rule(data=st.data(), role=st.sampled_from(list(Role)), version=st.integers(0, 3))
    def start_worker(self, data, role, version):
        devs = free(self.s)
        if not devs:
            return
        node = self.s.devices[data.draw(st.sampled_from(devs))].node
        on_node = [d for d in devs if self.s.devices[d].node == node]
        devs = data.draw(st.lists(st.sampled_from(on_node), min_size=1, max_size=3, unique=True))
        wid = self.s.start_worker(self.t, tuple(devs), role, version)
        assert self.s.workers[wid].phase is WorkerPhase.LOADING
        self.ok += 1

    @rule(data=st.data())
    def worker_op(self, data):
        wids = self._wks(WorkerPhase.LOADING, WorkerPhase.SERVING)
        if not wids:
            return
        w = self.s.workers[data.draw(st.sampled_from(wids))]
        op = data.draw(st.sampled_from(["ready", "role", "version", "stop", "resize"]))
        if op == "ready" and w.phase is WorkerPhase.LOADING:
            self.s.worker_ready(self.t, w.id)
        elif op == "role":
            self.s.set_role(self.t, w.id, data.draw(st.sampled_from(list(Role))))
        elif op == "version":
            self.s.set_version(self.t, w.id, w.weight_version + data.draw(st.integers(0, 2)))
        elif op == "stop":
            self.s.stop_worker(self.t, w.id)
        elif op == "resize":  # keep some of its devices, take free ones on its node
            node = self.s.devices[w.devices[0]].node
            keep = data.draw(st.lists(st.sampled_from(w.devices), min_size=1, unique=True))
            take = data.draw(st.lists(st.sampled_from([d for d in free(self.s) if self.s.devices[d].node == node]
                                                      or [None]), unique=True))
            self.s.resize_worker(self.t, w.id, tuple(keep) + tuple(d for d in take if d is not None))
        else:
            return
        self.ok += 1

    def _illegal_attempts(self):
        s, t = self.s, self.t
        dv, wk = s.devices, s.workers
        out = [lambda: s.lend(t, 10_000, t + 1), lambda: s.stop_worker(t, 10_000)]
        out += [lambda d=d: s.lend(t, d, t + 1) for d in self._devs(
            lambda d: d.status is not DeviceStatus.TRAINING or d.trainer_busy)]
        out += [lambda d=d: s.reclaim(t, d) for d in self._devs(
            lambda d: d.lease_deadline is None or d.worker is not None)]
        out += [lambda d=d: s.notice(t, d, t + 1) for d in self._devs(
            lambda d: d.pool is not E or d.status is DeviceStatus.GONE)]
        out += [lambda d=d: s.remove_device(t, d, True) for d in self._devs(
            lambda d: d.pool is not E or d.status is DeviceStatus.GONE)]
        out += [lambda d=d: s.set_training(t, [d], True) for d in self._devs(
            lambda d: d.status is not DeviceStatus.TRAINING)]
        out += [lambda d=d: s.start_worker(t, (d,), Role.MIXED, 0) for d in self._devs(
            lambda d: d.status is not DeviceStatus.FREE)]
        fr = free(s)
        out += [lambda a=a, b=b: s.start_worker(t, (a, b), Role.DECODE, 0) for a in fr for b in fr
                if dv[a].node != dv[b].node]
        out += [lambda w=w: s.worker_ready(t, w) for w in self._wks(WorkerPhase.SERVING, WorkerPhase.STOPPED)]
        out += [lambda w=w: s.set_role(t, w, Role.PREFILL) for w in self._wks(WorkerPhase.STOPPED)]
        out += [lambda w=w: s.stop_worker(t, w) for w in self._wks(WorkerPhase.STOPPED)]
        out += [lambda w=w: s.set_version(t, w, wk[w].weight_version - 1) for w in wk]
        out += [lambda w=w: s.resize_worker(t, w, (0,)) for w in self._wks(WorkerPhase.STOPPED)]
        busy = self._devs(lambda d: d.status is not DeviceStatus.FREE)
        out += [lambda w=w, d=d: s.resize_worker(t, w, wk[w].devices + (d,)) for w in self._wks(WorkerPhase.SERVING)
                for d in busy if d not in wk[w].devices]
        if s.events:
            out.append(lambda: s.add_device(s._now - 1.0, R))
        return out

    @rule(data=st.data())
    def illegal(self, data):
        attempts = self._illegal_attempts()
        before = snapshot(self.s)
        with pytest.raises(StateError):
            data.draw(st.sampled_from(attempts))()
        assert snapshot(self.s) == before

    @invariant()
    def consistent(self):
        if hasattr(self, "s"):
            self.s.check_invariants()
            assert len(self.s.events) == self.ok
            # every usable device is either free or held by exactly one live worker
            assert self.s.budget() == len(free(self.s)) + sum(len(w.devices) for w in live(self.s))


ClusterMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_cluster_machine = ClusterMachine.TestCase
