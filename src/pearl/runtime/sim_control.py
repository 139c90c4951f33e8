"""The simulator's side of the controller interface: `SimControl` builds `Observation`s from the
simulator's state and implements `Actuators` over its engines and `ClusterState`; the elastic trace's
arrivals, notices and removals become controller events. The controller itself is the same object
the real runtime ticks (`pearl.control.policies.make_controller`)."""
from __future__ import annotations

import math
from typing import Any

from pearl.control.controller import ControlSetting
from pearl.control.observation import (DeviceObs, DevicesAdded, DevicesRemoved, Notice, Observation, TrainerObs,
                                       WorkerObs)
from pearl.control.policies import given_declared_workload, make_controller
from pearl.control.predictor import WorkloadStats
from pearl.runtime.driver import ControlDriver
from pearl.types import DeviceStatus, LayoutShape, Mode, Pool, Role
from pearl.workloads import TrajectorySpec

__all__ = ["SimControl"]


class SimControl:
    """Actuators + observations for one `Simulator`; owns its `ControlDriver`."""

    def __init__(self, sim: Any):  # a pearl.runtime.sim.Simulator (not imported: it imports this module)
        self.sim = sim
        self.driver: ControlDriver | None = None
        self.warm: set[int] = set()  # elastic devices that have run a worker (paid their cold start)
        self.initial: LayoutShape | None = None  # a layout to start instead of the configured one (benchmarks)

    # ------------------------------------------------------------------ set-up
    def setup(self) -> ControlDriver:
        """Build the controller, then the initial layout (ready at t=0: weights already loaded; the
        controller's planned one if it has one), and schedule its first tick."""
        sim = self.sim
        policy = sim.cfg.policy
        setting = None
        if policy.name not in ("fixed", "static-pd"):  # no oracle: the controller learns the workload
            # and the elastic lifetimes from what it observes (control.estimate); plan-static is the user who
            # runs `pearl plan` on the declared workload before the run, so it is given that workload's stats.
            stats = WorkloadStats.from_workload(sim.workload) if given_declared_workload(policy.name) else None
            setting = ControlSetting(
                perf_for=sim.perf_for, engine=sim.cfg.engine, stats=stats, batch_size=sim.batch_trajs,
                staleness=sim.cfg.rl.staleness, devices_per_node=sim.cfg.cluster.devices_per_node,
                num_kv_heads=sim.model.num_kv_heads, train_devices=tuple(sim.train_devices),
                cold_start_s=self.cold_start_s(sim.cfg.engine.tp), group_size=sim.cfg.rl.group_size,
                max_concurrent=sim.cfg.rl.max_concurrent_trajectories)
        ctrl = make_controller(policy, setting)
        plan = getattr(ctrl, "initial_shape", None)  # a policy that plans its layout before the run
        self._initial_layout(self.initial or (plan(len(sim.rollout_devices)) if plan else None))
        self.driver = ControlDriver(ctrl, sim.clock, self, self.observe)
        self.driver.start()
        return self.driver

    def _initial_layout(self, shape: LayoutShape | None) -> None:
        """Start the configured layout (or `shape`) on the rollout devices, ready at t = 0."""
        sim = self.sim
        lay, tp = sim.cfg.layout, (shape.tp if shape else sim.cfg.engine.tp)
        devs = sim.rollout_devices
        if shape is None and lay.prefill_tp not in (None, tp):
            shape = lay.shape(len(devs), tp)
        if shape is not None and len(shape.tp_groups()) > 1:
            self._initial_two_tps(shape)
            return
        groups = [tuple(devs[i:i + tp]) for i in range(0, len(devs) - tp + 1, tp)]
        if shape is not None:
            roles = shape.roles()
        else:
            roles = ([Role.PREFILL] * lay.prefill + [Role.DECODE] * lay.decode
                     if lay.mode is Mode.DISAGGREGATED else [Role.MIXED] * len(groups))
        for g, role in zip(groups, roles):
            sim.start_worker(g, role, load_s=0.0)

    def _initial_two_tps(self, shape: LayoutShape) -> None:
        """A layout with workers of two tps (a prefill tp of its own, or side workers): the workers of
        the larger tp are cut from the rollout devices first, so that every group starts at a multiple
        of its size (the sizes are powers of two dividing a node: no worker spans two nodes)."""
        devs, at = self.sim.rollout_devices, 0
        for tp, roles in shape.tp_groups():
            for role in roles:
                self.sim.start_worker(tuple(devs[at:at + tp]), role, load_s=0.0)
                at += tp

    def cold_start_s(self, tp: int) -> float:
        """A worker's first start on an elastic device: process start and warm-up
        (`cluster.elastic.cold_start_s`) plus pulling the weights from a peer. Every policy pays it."""
        return self.sim.cfg.cluster.elastic.cold_start_s + self.sim.perf_for(tp).weight_transfer_time("peer")

    # ------------------------------------------------------------------ observing
    def observe(self, tick: bool) -> Observation:
        sim = self.sim
        if tick:
            sim._count_active(0)  # bring the integral of active trajectories up to now
        st = sim.state
        devices = tuple(DeviceObs(d.id, d.pool, d.node, d.status, d.notice_at, d.lease_deadline)
                        for d in st.devices.values())
        workers = tuple(WorkerObs(e.wid, e.devices, e.role, st.workers[e.wid].phase, e.accepting, e.load(),
                                  e.kv_used()) for e in sim.engines.values())
        trainer = TrainerObs(sim.trainer_busy, len(sim.ready), sim.cfg.rl.prompts_per_batch,
                             tuple(sim.batch_ready_t[-4:]), tuple(sim.train_devices))
        kv = [e for e in sim.all_engines if e.role is not Role.PREFILL]  # (a prefill worker's copy is a spare)
        return Observation(sim.clock.now, devices, workers, st.shape(), trainer,
                           tokens_generated=sum(e.tokens_decoded for e in sim.all_engines),
                           active_integral=sim.active_integral, finished=tuple(sim.finished_recent),
                           finished_count=sim.finished_count, running=self._running(),
                           kv_evictions=sum(e.evictions for e in kv), requests_finished=sum(e.finished for e in kv),
                           in_flight=sim.active)

    def _running(self) -> tuple[tuple[TrajectorySpec, bool], ...]:
        """The trajectories in flight as far as they ran (what a real runtime can see: completed turns,
        the turn in progress with its tokens so far, no latency of an environment step still running),
        while the estimate uses them (its window of finished ones not yet full)."""
        sim = self.sim
        if sim.finished_count >= sim.cfg.policy.controller.estimate.window:
            return ()
        out = []
        for tr in sim.inflight.values():
            k, sp = tr.turn, tr.spec
            in_env = tr.in_env or k >= sp.turns  # (after the last turn: the final reward's step)
            g = 0 if in_env or tr.req is None or tr.home is None else _generated(tr.home, tr.req)
            resp = sp.responses[:k] + ((g,) if g > 0 else ())
            if resp:
                env = sp.env_latency[:k - in_env] + (0.0,) * (len(resp) - k + in_env)
                out.append((TrajectorySpec(sp.index, sp.group, sp.prompt_tokens, resp, sp.observations[:len(resp) - 1],
                                           env), g > 0))
        return tuple(out)

    # ------------------------------------------------------------------ actuators
    def start(self, devices: tuple[int, ...], role: Role, load_s: float) -> None:
        st = self.sim.state.devices
        if all(st[d].status is DeviceStatus.FREE and st[d].notice_at is None for d in devices):
            cold = [d for d in devices if st[d].pool is Pool.ELASTIC and d not in self.warm]
            if cold:  # the device has never run a worker: no process, no weights yet
                load_s = max(load_s, self.cold_start_s(len(devices)))
                self.warm.update(cold)
            self.sim.start_worker(devices, role, load_s=load_s)

    def stop(self, worker: int, migrate: bool) -> None:
        eng = self.sim.engines.get(worker)
        if eng is not None:
            self.sim.stop_worker(eng, migrate=migrate)

    def drain(self, worker: int) -> None:
        eng = self.sim.engines.get(worker)
        if eng is not None:
            self.sim.set_accepting(eng, False)

    def flip(self, worker: int, role: Role) -> None:
        eng = self.sim.engines.get(worker)
        if eng is not None:
            self.sim.set_role(eng, role)

    def lend(self, devices: tuple[int, ...], deadline: float) -> None:
        for d in devices:
            self.sim.state.lend(self.sim.clock.now, d, deadline)

    def reclaim(self, devices: tuple[int, ...]) -> None:
        for d in devices:
            self.sim.state.reclaim(self.sim.clock.now, d)

    def set_cap(self, cap: int | None) -> None:
        self.sim.gate.max_concurrent = cap
        self.sim._admit()  # a raised cap admits at once

    def resize(self, worker: int, devices: tuple[int, ...]) -> None:
        raise NotImplementedError("simulated workers change size by a restart only (ControlSetting.live_resize is off)")

    # ------------------------------------------------------------------ elastic devices
    def elastic_add(self, b) -> None:
        sim = self.sim
        t, per_node = sim.clock.now, sim.cfg.cluster.devices_per_node
        devs = [sim.state.add_device(t, Pool.ELASTIC, node=sim.next_node + i // per_node) for i in range(b.count)]
        sim.next_node += -(-b.count // per_node)  # a burst of several nodes' devices fills whole nodes
        for d in devs:
            sim.device_time[d] = [t, None]
        if math.isfinite(b.t_remove):  # a constant pool's devices never leave
            if b.notice_s is not None:
                sim.clock.at(max(t, b.t_remove - b.notice_s), self.elastic_notice, devs, b.t_remove)
            sim.clock.at(b.t_remove, self.elastic_remove, devs, b.notice_s is None)
        self.driver.event(DevicesAdded(tuple(devs)))

    def elastic_notice(self, devs: list[int], at: float) -> None:
        sim = self.sim
        for d in devs:
            if sim.state.devices[d].status is not DeviceStatus.GONE:
                sim.state.notice(sim.clock.now, d, at)
        self.driver.event(Notice(tuple(devs), at))

    def elastic_remove(self, devs: list[int], abrupt: bool) -> None:
        sim = self.sim
        t = sim.clock.now
        for d in devs:
            wid = sim.state.devices[d].worker
            eng = sim.engines.get(wid) if wid is not None else None
            if eng is not None:  # abrupt loss: the KV is gone, requests resume from their tokens
                sim.stop_worker(eng, migrate=False)
        for d in devs:
            sim.state.remove_device(t, d, abrupt)
            sim.device_time[d][1] = t
        self.driver.event(DevicesRemoved(tuple(devs)))


def _generated(eng: Any, req: Any) -> int:
    """Tokens `req` has generated so far on the EmulatedEngine `eng` (a decode is stored lazily: its
    join step; counted up to the last step applied)."""
    d = eng.dec.get(req)
    return req.num_generated + (eng.step - d.join if d is not None else 0)
