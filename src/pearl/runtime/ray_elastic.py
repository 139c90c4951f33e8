"""Ray nodes as elastic devices for `pearl train` (`elastic.ray_nodes: true`, backend ray).

`NodeWatch` polls the cluster (`ray.nodes()` and the nodes the cluster is draining) on the run's wall
clock, every `poll_s`, on the rollout thread (between engine steps, like every actuator):
- a live node that offers the `pearl_elastic` resource (`ray start --address HEAD --resources
  '{"pearl_elastic": N}'`) and was not seen before joins as N elastic devices
  (`RealControl.elastic_add`, a `DevicesAdded` for the controller); a node that is already being
  drained when first seen is not offered;
- a known node that the cluster starts draining (`ray drain-node`, which Ray's autoscaler also sends
  before it preempts or scales down a node) is a notice (`elastic_notice`, a `Notice` for the
  controller, which moves the turns in flight off it with their KV) that ends at the drain's deadline,
  or at once when the drain has no deadline;
- a known node that is no longer alive is a removal (`elastic_remove`): abrupt unless it was noticed,
  its workers gone with it and their turns resuming from their tokens.
Workers started on those devices are placed on that node (`RayBackend.start_worker`: one
`pearl_elastic` unit, node affinity).
"""
from __future__ import annotations

import time
from typing import Any

from pearl.runtime.ray_backend import ELASTIC
from pearl.runtime.ray_worker import ray

__all__ = ["NodeWatch", "draining_nodes", "elastic_nodes"]


def elastic_nodes() -> dict[str, int]:
    """Live Ray nodes offering `pearl_elastic`: node id -> how many units."""
    return {n["NodeID"]: int(n.get("Resources", {}).get(ELASTIC, 0)) for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get(ELASTIC, 0) >= 1}


def draining_nodes() -> dict[str, float | None]:
    """Nodes the cluster is draining: node id -> the drain's deadline (Unix seconds), None without one."""
    from ray._private import state

    return {nid: (ms / 1000.0 if ms else None) for nid, ms in state.state.get_draining_nodes().items()}


class NodeWatch:
    def __init__(self, control: Any, poll_s: float):
        self.control, self.poll_s = control, poll_s
        self.known: dict[str, list[int]] = {}  # Ray node id -> its elastic devices
        self.noticed: set[str] = set()  # known nodes being drained

    def start(self) -> None:
        self.control.clock.at(self.control.clock.now, self.poll)

    def poll(self) -> None:
        self.check()
        self.control.clock.at(self.control.clock.now + self.poll_s, self.poll)

    def check(self) -> None:
        """Compare the cluster with what is known: joins, drains and leaves become elastic events."""
        alive, draining = elastic_nodes(), draining_nodes()
        for nid, count in alive.items():
            if nid not in self.known and nid not in draining:
                self.known[nid] = self.control.elastic_add(count, ray_node=nid)
        for nid, deadline in draining.items():
            if nid in self.known and nid in alive and nid not in self.noticed:
                self.noticed.add(nid)
                now = self.control.clock.now
                at = now if deadline is None else now + max(0.0, deadline - time.time())
                self.control.elastic_notice(self.known[nid], at)
        for nid in [n for n in self.known if n not in alive]:
            self.control.elastic_remove(self.known.pop(nid), abrupt=nid not in self.noticed)
            self.noticed.discard(nid)
