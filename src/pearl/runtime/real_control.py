"""The real runtime's side of the controller interface: `RealControl` builds `Observation`s from the
live `AgentLoop` (its engines, their queues and KV use) and the trainer, and implements `Actuators`
over the local engines, so the same `Controller` the simulator drives decides on the wall clock.

Devices are slots: one per rollout worker (pool rollout) and the trainer's (pool train), recorded in
a `ClusterState` like the simulator's. What the local backend can do: start a worker (a new engine
sharing the weights of a live one, so it serves the current version at once), stop one (its requests
move with their KV or resume from their tokens), drain one, give one a new role, lend the trainer's
slot to a worker while the trainer waits for its batch and reclaim it, and resize one (a local torch
engine computes with the threads of the devices it holds: the lent slot as a second thread). All
actuator calls run on the rollout thread, between engine steps: the controller ticks there
(`WallClock.run_due`), and the
trainer's events (`TrainerIdle`, `TrainerNeedsDevices`) reach it through `post` / `handle_events`;
the trainer waits until its device is back.

The same actuators drive the Ray backend (`RayAgentLoop`: `make_engine` starts an actor, which takes
turns once it has started; a resize sets a live actor's torch threads, so the trainer's core is lent
to an actor on its host as a second thread, never to a new actor: one takes seconds to start). Elastic devices (pool elastic) come from an availability trace
(`elastic_trace`: added, noticed and removed on the wall clock) or from Ray nodes that join and leave
(`pearl.runtime.ray_elastic`); they reach the controller as `DevicesAdded` / `Notice` /
`DevicesRemoved`, like the simulator's. A notice stops the workers on those devices with migration
(the controller's rule); a removal stops what is still there, its requests resuming from their
tokens. A Ray worker whose process dies is stopped in the cluster state (its device is free again)
and the controller re-decides (`Redecide`).
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from pearl.control.observation import (DeviceObs, DevicesAdded, DevicesRemoved, Notice, Observation, Redecide,
                                      TrainerObs, WorkerObs)
from pearl.control.policies import make_controller
from pearl.control.state import ClusterState
from pearl.runtime.clock import WallClock
from pearl.runtime.driver import ControlDriver
from pearl.runtime.elastic import Burst, trace
from pearl.types import DeviceStatus, Pool, Role, WorkerPhase

__all__ = ["RealControl"]


class RealControl:
    def __init__(self, agent: Any, policy: Any, setting: Any, make_engine: Callable[[Role, int, Any], Any],
                 trainer: Callable[[], TrainerObs], clock: WallClock | None = None, gate: Any = None,
                 threads: tuple[int, int] | None = None):
        """`agent`: the AgentLoop; `make_engine(role, idx, node)`: a new engine for a start (`node`: the
        Ray node id of the elastic devices it starts on, else None); `trainer()`: the trainer's state now;
        `gate`: the run's staleness gate, whose cap `set_cap` sets; `threads`: the torch threads of a
        rollout device and of the trainer's (a torch engine, local or a Ray actor, computes with those of
        its devices)."""
        self.agent, self.make_engine, self.trainer, self.gate = agent, make_engine, trainer, gate
        self.threads = threads
        self.clock = clock or WallClock()
        self.state = ClusterState(check=False)
        self._served: Any = None  # the last layout shape that had a worker serving (layout_label)
        n = len(agent.engines)
        self.rollout = [self.state.add_device(0.0, Pool.ROLLOUT, node=0) for _ in range(n)]
        self.train_device = self.state.add_device(0.0, Pool.TRAIN, node=0)
        self.lock = threading.Lock()  # the trainer thread records training; the rollout thread the rest
        self.wid_of: dict[int, int] = {}  # engine index -> ClusterState worker id
        self.engine_of: dict[int, int] = {}
        for i, e in enumerate(agent.engines):
            self._register(i, (self.rollout[i],), e.role)
        self.events: queue.Queue = queue.Queue()  # (event, done) from the trainer thread
        self.ray_node: dict[int, str] = {}  # elastic device -> the Ray node it is on (ray_elastic)
        self.next_node = 1
        self.elastic_log: list[dict[str, Any]] = []  # what arrived, was noticed and left, when
        self.node_watch: Any = None
        self.moved = {True: 0, False: 0}  # requests moved off stopped workers: with their KV / from tokens
        if hasattr(agent, "on_lost"):
            agent.on_lost = self._lost
        controller = make_controller(policy, setting)
        if Role.PREFILL not in getattr(agent.engines[0], "roles", (Role.PREFILL,)) and hasattr(controller, "adapt_pd"):
            controller.adapt_pd = False  # engines that serve the mixed role only (vLLM): colocated layouts only
        self.driver = ControlDriver(controller, self.clock, self, self.observe)

    def _register(self, idx: int, devices: tuple[int, ...], role: Role) -> None:
        t = self.clock.now
        with self.lock:
            wid = self.state.start_worker(t, devices, Role(role), 0)
            self.state.worker_ready(t, wid)
        self.wid_of[idx], self.engine_of[wid] = wid, idx

    # ------------------------------------------------------------------ observing
    # ------------------------------------------------------------------ trainer events
    def post(self, ev: Any, wait: bool, stop: threading.Event) -> float:
        """Trainer thread: hand `ev` (TrainerIdle, TrainerNeedsDevices) to the rollout thread, which owns
        the engines; with `wait`, until it is carried out (or the run stops). Returns the seconds waited."""
        done = threading.Event()
        t0 = time.perf_counter()
        self.events.put((ev, done))
        while wait and not done.wait(0.05) and not stop.is_set():
            pass
        return time.perf_counter() - t0 if wait else 0.0

    def handle_events(self) -> None:
        """Rollout thread, between engine steps: carry out the trainer's events."""
        while True:
            try:
                ev, done = self.events.get_nowait()
            except queue.Empty:
                return
            try:
                ev() if callable(ev) else self.driver.event(ev)
            finally:
                done.set()

    def training(self, busy: bool) -> None:
        """The trainer starts or ends a step on its device (called from the trainer thread)."""
        with self.lock:
            self.state.set_training(self.clock.now, [self.train_device], busy)

    def observe(self, tick: bool) -> Observation:
        # (`tick` matters to the simulator only: here the in-flight integral is kept as episodes come and go)
        with self.lock:
            return self._observe()

    def _observe(self) -> Observation:
        t, ag = self.clock.now, self.agent
        devices = tuple(DeviceObs(d.id, d.pool, d.node, d.status, d.notice_at, d.lease_deadline)
                        for d in self.state.devices.values())
        workers = []
        for idx in ag.live():
            e, w = ag.engines[idx], self.state.workers[self.wid_of[idx]]
            phase = WorkerPhase.SERVING if getattr(e, "ready", True) else WorkerPhase.LOADING
            workers.append(WorkerObs(w.id, w.devices, Role(e.role), phase, idx not in ag.draining,
                                     e.load(), e.kv_used()))
        stats = [e.stats for e in ag.engines]
        kv = [e.stats for e in ag.engines if Role(e.role) is not Role.PREFILL]  # (a prefill worker's copy is a spare)
        return Observation(t, devices, tuple(workers), self.state.shape(), self.trainer(),
                           tokens_generated=sum(s.tokens_decoded for s in stats),
                           active_integral=ag.episodes.area(), finished=tuple(ag.finished),
                           finished_count=ag.finished_count, running=ag.running(),
                           kv_evictions=sum(s.evictions for s in kv),
                           requests_finished=sum(s.finished for s in kv), in_flight=len(ag.episodes))

    # ------------------------------------------------------------------ actuators
    def start(self, devices: tuple[int, ...], role: Role, load_s: float) -> None:
        st = self.state.devices
        if not all(st[d].status is DeviceStatus.FREE and st[d].notice_at is None for d in devices):
            return
        idx = len(self.agent.engines)
        eng = self.make_engine(role, idx, self.ray_node.get(devices[0]))
        self._set_threads(eng, devices)
        self.agent.add_engine(eng)
        self._register(idx, devices, role)

    def stop(self, worker: int, migrate: bool) -> None:
        idx = self.engine_of.get(worker)
        if idx is None or idx in self.agent.stopped:
            return
        self.moved[bool(migrate)] += self.agent.stop_engine(idx, migrate=migrate)
        self._stopped(worker)

    def _stopped(self, worker: int) -> None:
        with self.lock:
            if self.state.workers[worker].phase is not WorkerPhase.STOPPED:
                self.state.stop_worker(self.clock.now, worker)

    def _lost(self, idx: int) -> None:
        """A Ray worker died (its process, or its node): its device is free (unless gone); re-decide."""
        wid = self.wid_of.get(idx)
        if wid is not None:
            devs = self.state.workers[wid].devices
            self._stopped(wid)
            if self.node_watch is not None and any(d in self.ray_node for d in devs):
                self.events.put((self.node_watch.check, threading.Event()))  # did its node leave? first
        self.events.put((lambda: self._redecide(f"rollout worker {idx} died"), threading.Event()))

    def _redecide(self, why: str) -> None:
        """Re-decide after a loss; then the loop's turns that wait for a worker go on (or fail, if none
        serves and none starts)."""
        try:
            self.driver.event(Redecide(why))
        finally:
            self.agent.redecided()

    def resize(self, worker: int, devices: tuple[int, ...]) -> None:
        """The worker computes on `devices` from its next step (a lent core joins it, or leaves it)."""
        idx = self.engine_of.get(worker)
        if idx is None or idx in self.agent.stopped or self.threads is None:
            return
        with self.lock:
            self.state.resize_worker(self.clock.now, worker, devices)
        self._set_threads(self.agent.engines[idx], devices)

    def _set_threads(self, eng: Any, devices: tuple[int, ...]) -> None:
        if self.threads is not None and hasattr(eng, "num_threads"):  # (a torch engine: local, or a Ray actor)
            eng.num_threads = sum(self.threads[d == self.train_device] for d in devices)

    def drain(self, worker: int) -> None:
        idx = self.engine_of.get(worker)
        if idx is not None and idx not in self.agent.stopped:
            self.agent.draining.add(idx)

    def flip(self, worker: int, role: Role) -> None:
        idx = self.engine_of.get(worker)
        if idx is None or idx in self.agent.stopped:
            return
        self.agent.set_role(idx, role)
        with self.lock:
            self.state.set_role(self.clock.now, worker, role)

    def lend(self, devices: tuple[int, ...], deadline: float) -> None:
        with self.lock:
            for d in devices:
                self.state.lend(self.clock.now, d, deadline)

    def reclaim(self, devices: tuple[int, ...]) -> None:
        with self.lock:
            for d in devices:
                self.state.reclaim(self.clock.now, d)

    def set_cap(self, cap: int | None) -> None:
        if self.gate is not None:  # the rollout thread reads it at its next admission
            self.gate.max_concurrent = cap

    def begin(self) -> None:
        """On the rollout thread, as the run starts: the controller's first tick, the node watch."""
        self.driver.start()
        if self.node_watch is not None:
            self.node_watch.start()

    # ------------------------------------------------------------------ elastic devices
    def elastic(self, cfg: Any, seed: int) -> None:
        """The run's `elastic:` section: its availability trace on the wall clock (times from the start
        of the run); with `ray_nodes`, Ray nodes offering `pearl_elastic` are watched."""
        for b in trace(cfg.trace, cfg.horizon_s, seed):
            self.clock.at(b.t_add, self._burst, b)
        if cfg.ray_nodes:
            from pearl.runtime.ray_elastic import NodeWatch

            self.node_watch = NodeWatch(self, cfg.poll_s)

    def _burst(self, b: Burst) -> None:
        devs = self.elastic_add(b.count)
        if b.notice_s is not None:
            self.clock.at(max(self.clock.now, b.t_remove - b.notice_s), self.elastic_notice, devs, b.t_remove)
        self.clock.at(b.t_remove, self.elastic_remove, devs, b.notice_s is None)

    def elastic_add(self, count: int, ray_node: str | None = None) -> list[int]:
        """`count` elastic devices join (on one new node) and are offered to the controller."""
        t, node = self.clock.now, self.next_node
        self.next_node += 1
        with self.lock:
            devs = [self.state.add_device(t, Pool.ELASTIC, node=node) for _ in range(count)]
        for d in devs:
            if ray_node is not None:
                self.ray_node[d] = ray_node
        self.elastic_log.append({"t": round(t, 3), "event": "added", "devices": devs})
        self.driver.event(DevicesAdded(tuple(devs)))
        return devs

    def elastic_notice(self, devs: list[int], at: float) -> None:
        live = [d for d in devs if self.state.devices[d].status is not DeviceStatus.GONE]
        with self.lock:
            for d in live:
                self.state.notice(self.clock.now, d, at)
        self.elastic_log.append({"t": round(self.clock.now, 3), "event": "notice", "devices": live, "at": at})
        self.driver.event(Notice(tuple(live), at))

    def elastic_remove(self, devs: list[int], abrupt: bool) -> None:
        """The devices are gone: workers still on them stop, their requests resume from their tokens."""
        live = [d for d in devs if self.state.devices[d].status is not DeviceStatus.GONE]
        for d in live:
            wid = self.state.devices[d].worker
            idx = self.engine_of.get(wid) if wid is not None else None
            if idx is not None and idx not in self.agent.stopped:
                self.moved[False] += self.agent.stop_engine(idx, migrate=False)
        with self.lock:
            for d in live:
                self.state.remove_device(self.clock.now, d, abrupt)
        self.elastic_log.append({"t": round(self.clock.now, 3), "event": "removed", "devices": live,
                                 "abrupt": abrupt})
        self.driver.event(DevicesRemoved(tuple(live)))

    # ------------------------------------------------------------------ results
    def layout_label(self) -> str:
        """The layout serving now; mid-switch (every worker stopped, the next not yet started) the last
        one that served, marked, rather than an empty "colocated×0"."""
        shape = self.state.shape()
        if shape.n_workers == 0 and self._served is not None:
            return f"{self._served} (switching)"
        self._served = shape
        return str(shape)

    def summary(self) -> dict[str, Any]:
        d = self.driver.decisions
        return {"policy": self.driver.name, "ticks": self.driver.ticks, "decisions": len(d),
                "switches": sum(1 for x in d if x.get("switch")), "layout_final": str(self.state.shape()),
                "workers_started": len(self.agent.engines), "elastic": self.elastic_log,
                "requests_migrated": self.moved[True], "requests_resumed_from_tokens": self.moved[False]}
