"""`NodeWatch` turns what the Ray cluster says about its nodes into elastic events: a join, a drain
(the notice Ray's autoscaler gives before it preempts a node, or `ray drain-node`), a leave. The
cluster is faked here (the real one is in test_ray_elastic.py, slow)."""
import time

import pytest

pytest.importorskip("ray")

from pearl.runtime import ray_elastic  # noqa: E402
from pearl.runtime.clock import WallClock  # noqa: E402


class Control:
    """The three calls NodeWatch makes on RealControl, recorded."""

    def __init__(self):
        self.clock, self.log, self.next = WallClock(), [], 0

    def elastic_add(self, count, ray_node=None):
        devs = list(range(self.next, self.next + count))
        self.next += count
        self.log.append(("added", ray_node, devs))
        return devs

    def elastic_notice(self, devs, at):
        self.log.append(("notice", devs, at - self.clock.now))

    def elastic_remove(self, devs, abrupt):
        self.log.append(("removed", devs, abrupt))


@pytest.fixture
def cluster(monkeypatch):
    state = {"alive": {}, "draining": {}}
    monkeypatch.setattr(ray_elastic, "elastic_nodes", lambda: dict(state["alive"]))
    monkeypatch.setattr(ray_elastic, "draining_nodes", lambda: dict(state["draining"]))
    return state


def test_a_drained_node_is_a_notice_until_its_deadline_then_a_removal_with_notice(cluster):
    c = Control()
    w = ray_elastic.NodeWatch(c, 1.0)
    cluster["alive"] = {"a": 2}
    w.check()
    assert c.log == [("added", "a", [0, 1])]
    cluster["draining"] = {"a": time.time() + 30.0}
    w.check()
    w.check()  # one notice per drain
    assert len(c.log) == 2 and c.log[1][:2] == ("notice", [0, 1]) and 29.0 < c.log[1][2] <= 30.0, c.log
    cluster["alive"], cluster["draining"] = {}, {}
    w.check()
    assert c.log[2] == ("removed", [0, 1], False)


def test_a_drain_without_deadline_is_a_notice_for_now_and_a_leave_without_drain_is_abrupt(cluster):
    c = Control()
    w = ray_elastic.NodeWatch(c, 1.0)
    cluster["alive"] = {"a": 1, "b": 1}
    w.check()
    cluster["draining"] = {"a": None}
    w.check()
    assert c.log[2][:2] == ("notice", [0]) and abs(c.log[2][2]) < 0.5, c.log
    cluster["alive"] = {}
    w.check()
    assert sorted(c.log[3:]) == [("removed", [0], False), ("removed", [1], True)]


def test_a_node_already_draining_when_first_seen_is_not_offered(cluster):
    c = Control()
    w = ray_elastic.NodeWatch(c, 1.0)
    cluster["alive"], cluster["draining"] = {"a": 1}, {"a": time.time() + 5}
    w.check()
    cluster["alive"], cluster["draining"] = {}, {}
    w.check()
    assert c.log == []


def test_draining_nodes_reads_the_cluster(monkeypatch):
    from ray._private import state

    monkeypatch.setattr(state.state, "get_draining_nodes", lambda: {"a": 0, "b": 1_700_000_000_500})
    assert ray_elastic.draining_nodes() == {"a": None, "b": 1_700_000_000.5}
