"""The real runtime's side of the controller interface: `RealControl` builds `Observation`s from the
live `AgentLoop` (its engines, their queues and KV use) and the trainer, and implements `Actuators`
over the local engines, so the same `Controller` the simulator drives decides on the wall clock.

Devices are slots: one per rollout worker (pool rollout) and the trainer's (pool train), recorded in
a `ClusterState` like the simulator's. What the local backend can do: start a worker (a new engine
sharing the weights of a live one, so it serves the current version at once), stop one (its requests
move with their KV or resume from their tokens), drain one, give one a new role, lend the trainer's
slot to a worker while the trainer waits for its batch and reclaim it. All actuator calls run on the
rollout thread, between engine steps: the controller ticks there (`WallClock.run_due`), and the
trainer's events (`TrainerIdle`, `TrainerNeedsDevices`) reach it through `post` / `handle_events`;
the trainer waits until its device is back.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from pearl.control.observation import DeviceObs, Observation, TrainerObs, WorkerObs
from pearl.control.policies import make_controller
from pearl.control.state import ClusterState
from pearl.runtime.clock import WallClock
from pearl.runtime.driver import ControlDriver
from pearl.types import DeviceStatus, Pool, Role, WorkerPhase

__all__ = ["RealControl"]


class RealControl:
    def __init__(self, agent: Any, policy: Any, setting: Any, make_engine: Callable[[Role, int], Any],
                 trainer: Callable[[], TrainerObs], clock: WallClock | None = None):
        """`agent`: the AgentLoop; `make_engine(role, wid)`: a new engine for a start; `trainer()`: the
        trainer's state now."""
        self.agent, self.make_engine, self.trainer = agent, make_engine, trainer
        self.clock = clock or WallClock()
        self.state = ClusterState(check=False)
        n = len(agent.engines)
        self.rollout = [self.state.add_device(0.0, Pool.ROLLOUT, node=0) for _ in range(n)]
        self.train_device = self.state.add_device(0.0, Pool.TRAIN, node=0)
        self.lock = threading.Lock()  # the trainer thread records training; the rollout thread the rest
        self.wid_of: dict[int, int] = {}  # engine index -> ClusterState worker id
        self.engine_of: dict[int, int] = {}
        for i, e in enumerate(agent.engines):
            self._register(i, (self.rollout[i],), e.role)
        self._active_integral, self._last_t = 0.0, 0.0
        self.events: queue.Queue = queue.Queue()  # (event, done) from the trainer thread
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
                self.driver.event(ev)
            finally:
                done.set()

    def training(self, busy: bool) -> None:
        """The trainer starts or ends a step on its device (called from the trainer thread)."""
        with self.lock:
            self.state.set_training(self.clock.now, [self.train_device], busy)

    def observe(self, tick: bool) -> Observation:
        with self.lock:
            return self._observe(tick)

    def _observe(self, tick: bool) -> Observation:
        t, ag = self.clock.now, self.agent
        if tick:  # ∫ trajectories in flight dt, brought up to now
            self._active_integral += len(ag.episodes) * (t - self._last_t)
            self._last_t = t
        devices = tuple(DeviceObs(d.id, d.pool, d.node, d.status, d.notice_at, d.lease_deadline)
                        for d in self.state.devices.values())
        workers = []
        for idx in ag.live():
            e, w = ag.engines[idx], self.state.workers[self.wid_of[idx]]
            workers.append(WorkerObs(w.id, w.devices, Role(e.role), WorkerPhase.SERVING, idx not in ag.draining,
                                     e.load(), e.kv_used()))
        tokens = sum(e.stats.tokens_decoded for e in ag.engines)
        return Observation(t, devices, tuple(workers), self.state.shape(), self.trainer(), tokens_generated=tokens,
                           active_integral=self._active_integral, finished=tuple(ag.finished),
                           finished_count=ag.finished_count)

    # ------------------------------------------------------------------ actuators
    def start(self, devices: tuple[int, ...], role: Role, load_s: float) -> None:
        st = self.state.devices
        if not all(st[d].status is DeviceStatus.FREE and st[d].notice_at is None for d in devices):
            return
        idx = len(self.agent.engines)
        eng = self.make_engine(role, idx)
        self.agent.add_engine(eng)
        self._register(idx, devices, role)

    def stop(self, worker: int, migrate: bool) -> None:
        idx = self.engine_of.get(worker)
        if idx is None or idx in self.agent.stopped:
            return
        self.agent.stop_engine(idx, migrate=migrate)
        with self.lock:
            self.state.stop_worker(self.clock.now, worker)

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

    # ------------------------------------------------------------------ results
    def summary(self) -> dict[str, Any]:
        d = self.driver.decisions
        return {"policy": self.driver.name, "ticks": self.driver.ticks, "decisions": len(d),
                "switches": sum(1 for x in d if x.get("switch")), "layout_final": str(self.state.shape())}
