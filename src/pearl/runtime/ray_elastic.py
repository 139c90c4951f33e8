"""Ray nodes as elastic devices for `pearl train` (`elastic.ray_nodes: true`, backend ray).

`NodeWatch` polls the cluster (`ray.nodes()`) on the run's wall clock, every `poll_s`, on the rollout
thread (between engine steps, like every actuator): a live node that offers the `pearl_elastic`
resource (`ray start --address HEAD --resources '{"pearl_elastic": N}'`) and was not seen before
joins as N elastic devices (`RealControl.elastic_add`, a `DevicesAdded` for the controller); a known
node that is no longer alive is a revocation without notice (`elastic_remove`: its workers are gone
with it, their turns resume from their tokens). Workers started on those devices are placed on that
node (`RayBackend.start_worker`: one `pearl_elastic` unit, node affinity).
"""
from __future__ import annotations

from typing import Any

from pearl.runtime.ray_backend import ELASTIC
from pearl.runtime.ray_worker import ray

__all__ = ["NodeWatch", "elastic_nodes"]


def elastic_nodes() -> dict[str, int]:
    """Live Ray nodes offering `pearl_elastic`: node id -> how many units."""
    return {n["NodeID"]: int(n.get("Resources", {}).get(ELASTIC, 0)) for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get(ELASTIC, 0) >= 1}


class NodeWatch:
    def __init__(self, control: Any, poll_s: float):
        self.control, self.poll_s = control, poll_s
        self.known: dict[str, list[int]] = {}  # Ray node id -> its elastic devices

    def start(self) -> None:
        self.control.clock.at(self.control.clock.now, self.poll)

    def poll(self) -> None:
        self.check()
        self.control.clock.at(self.control.clock.now + self.poll_s, self.poll)

    def check(self) -> None:
        """Compare the cluster with what is known: joins and leaves become elastic events."""
        alive = elastic_nodes()
        for nid, count in alive.items():
            if nid not in self.known:
                self.known[nid] = self.control.elastic_add(count, ray_node=nid)
        for nid in [n for n in self.known if n not in alive]:
            self.control.elastic_remove(self.known.pop(nid), abrupt=True)
