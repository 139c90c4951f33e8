"""Unified GPU–worker–role state: the single source of truth for devices and workers.

Job: record every device (pool, status, lease, revocation notice, trainer use) and every worker
(devices, role, phase, weight version), allow only legal transitions between them, check the
invariants that tie them together, and log every change as an `Event` so timelines and traces fall
out of the state.

What it must not do: decide anything (which device to lend, which role to give: that is the
controller's job), own time (every transition receives `t`), or import torch, asyncio, Ray or `time`.
In-flight requests live in the engines; this module only says which worker was stopped so the caller
can recover its requests. A `StateError` is an internal bug of the caller (or of this module), not a
user error, so it is not a `PearlError`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from pearl.types import DeviceStatus, LayoutShape, Pool, Role, WorkerPhase

__all__ = ["ClusterState", "Device", "Event", "StateError", "Worker"]

# Phases whose worker holds devices.
_LIVE = (WorkerPhase.LOADING, WorkerPhase.SERVING)


class StateError(Exception):
    """An invariant violation or an illegal transition. `rule` is a short stable id of the broken
    rule (tests and logs match on it); the message names the device or worker and explains the rule."""

    def __init__(self, rule: str, message: str):
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


@dataclass(slots=True)
class Device:
    id: int
    pool: Pool
    node: int
    status: DeviceStatus
    worker: int | None = None
    lease_deadline: float | None = None  # a train device lent to rollout must be back by then
    notice_at: float | None = None  # elastic revocation notice: gone at this time
    # A TRAINING device is the trainer's whether or not it computes right now; this flag says whether
    # it does, so lending a device in the middle of an update is caught (see `set_training`).
    trainer_busy: bool = False


@dataclass(slots=True)
class Worker:
    id: int
    devices: tuple[int, ...]
    role: Role
    phase: WorkerPhase
    weight_version: int = 0
    started_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    kind: str
    data: dict = field(default_factory=dict)  # JSON-ready values only (enum values, lists)


class ClusterState:
    """Devices, workers and the event log, changed only through the transition methods."""

    def __init__(self, check: bool = True):
        # check=True verifies every invariant after every transition (O(devices + workers));
        # big simulations turn it off and keep only each transition's own preconditions.
        self.check = check
        self.devices: dict[int, Device] = {}
        self.workers: dict[int, Worker] = {}
        self.events: list[Event] = []
        # Ids come from counters that only grow, so an id is never reused even after a device goes
        # GONE or a worker stops (records are kept, never deleted).
        self._next_dev = 0
        self._next_worker = 0
        self._now = float("-inf")

    # ---------------------------------------------------------------- helpers

    def _begin(self, t: float) -> None:
        # Events form a timeline, so time may not run backwards (also rejects NaN).
        if not t >= self._now:
            raise StateError("time-monotonic", f"t={t} is before the last event at t={self._now}")

    def _emit(self, t: float, kind: str, **data) -> None:
        self._now = t
        self.events.append(Event(t, kind, data))

    def _done(self) -> None:
        if self.check:
            self.check_invariants()

    def _dev(self, dev: int) -> Device:
        d = self.devices.get(dev)
        if d is None:
            raise StateError("unknown-device", f"device {dev} does not exist")
        return d

    def _worker(self, wid: int) -> Worker:
        w = self.workers.get(wid)
        if w is None:
            raise StateError("unknown-worker", f"worker {wid} does not exist")
        return w

    def _release(self, w: Worker) -> list[int]:
        """Stop `w` and free its devices (no event, no checks: callers have validated)."""
        held = list(w.devices)
        for d in held:
            dev = self.devices[d]
            dev.worker = None
            if dev.status is DeviceStatus.SERVING:  # a lost device is already GONE
                dev.status = DeviceStatus.FREE
        w.devices = ()
        w.phase = WorkerPhase.STOPPED
        return held

    # ---------------------------------------------------------------- device transitions

    def add_device(self, t: float, pool: Pool, node: int = 0, status: DeviceStatus | None = None) -> int:
        """A device joins. Train devices start TRAINING (the trainer's, not lent); others FREE."""
        self._begin(t)
        pool = Pool(pool)
        want = DeviceStatus.TRAINING if pool is Pool.TRAIN else DeviceStatus.FREE
        if status is not None and DeviceStatus(status) is not want:
            raise StateError("add-status", f"a new {pool.value} device starts {want.value}, not "
                             f"{DeviceStatus(status).value} (lend a train device with lend(); start workers with start_worker())")
        did = self._next_dev
        self._next_dev += 1
        self.devices[did] = Device(did, pool, node, want)
        self._emit(t, "device_added", dev=did, pool=pool.value, node=node, status=want.value)
        self._done()
        return did

    def notice(self, t: float, dev: int, at: float) -> None:
        """An elastic device will be revoked at time `at` (a later notice replaces an earlier one)."""
        self._begin(t)
        d = self._dev(dev)
        if d.pool is not Pool.ELASTIC:
            raise StateError("notice-elastic-only", f"device {dev} is {d.pool.value}; only elastic devices get notices")
        if d.status is DeviceStatus.GONE:
            raise StateError("gone-is-final", f"device {dev} is already gone")
        if not at >= t:
            raise StateError("notice-future", f"device {dev}: notice for t={at} is before now (t={t})")
        d.notice_at = at
        self._emit(t, "notice", dev=dev, at=at, worker=d.worker)
        self._done()

    def remove_device(self, t: float, dev: int, abrupt: bool) -> int | None:
        """An elastic device is gone. If it served a worker, that worker stops (its other devices go
        FREE) and its id is returned so the caller can recover its in-flight requests."""
        self._begin(t)
        d = self._dev(dev)
        if d.pool is not Pool.ELASTIC:
            raise StateError("gone-elastic-only", f"device {dev} is {d.pool.value}; only elastic devices go gone")
        if d.status is DeviceStatus.GONE:
            raise StateError("gone-is-final", f"device {dev} is already gone")
        wid = d.worker
        d.status = DeviceStatus.GONE
        self._emit(t, "device_removed", dev=dev, abrupt=bool(abrupt), worker=wid)
        if wid is not None:
            w = self.workers[wid]
            held = self._release(w)
            self._emit(t, "worker_stopped", worker=wid, devices=held, reason="device_removed", lost_dev=dev)
        self._done()
        return wid

    def lend(self, t: float, dev: int, deadline: float) -> None:
        """The trainer lends an idle device to rollout: TRAINING -> FREE, due back by `deadline`."""
        self._begin(t)
        d = self._dev(dev)
        if d.pool is not Pool.TRAIN or d.status is not DeviceStatus.TRAINING:
            raise StateError("lend-training-only",
                             f"device {dev} is {d.pool.value}/{d.status.value}; only a TRAINING train device can be lent")
        if d.trainer_busy:
            raise StateError("lend-idle-only", f"device {dev}: the trainer is using it (set_training False first)")
        if not deadline >= t:
            raise StateError("lease-future", f"device {dev}: lease deadline {deadline} is before now (t={t})")
        d.status, d.lease_deadline = DeviceStatus.FREE, deadline
        self._emit(t, "lent", dev=dev, deadline=deadline)
        self._done()

    def reclaim(self, t: float, dev: int) -> None:
        """A lent train device returns to the trainer: FREE -> TRAINING. Its worker must be stopped first."""
        self._begin(t)
        d = self._dev(dev)
        if d.pool is not Pool.TRAIN or d.lease_deadline is None:
            raise StateError("reclaim-lent-only", f"device {dev} is {d.pool.value}/{d.status.value}, not a lent train device")
        if d.worker is not None:
            raise StateError("reclaim-not-serving", f"device {dev} still serves worker {d.worker}; stop it first")
        late = t - d.lease_deadline
        d.status, d.lease_deadline = DeviceStatus.TRAINING, None
        self._emit(t, "reclaimed", dev=dev, late=max(0.0, late))
        self._done()

    def set_training(self, t: float, devs: Iterable[int], training: bool) -> None:
        """The trainer starts (True) or finishes (False) using its unlent devices; lent ones must be
        reclaimed first. One event for the whole set."""
        self._begin(t)
        devs = list(devs)
        if len(set(devs)) != len(devs):
            raise StateError("distinct-devices", f"devices {devs} repeat")
        for dev in devs:
            d = self._dev(dev)
            if d.pool is not Pool.TRAIN or d.status is not DeviceStatus.TRAINING:
                raise StateError("train-unlent-only", f"device {dev} is {d.pool.value}/{d.status.value}; the trainer "
                                 "uses only its unlent devices (reclaim a lent one first)")
        for dev in devs:
            self.devices[dev].trainer_busy = bool(training)
        self._emit(t, "training_set", devs=devs, training=bool(training))
        self._done()

    # ---------------------------------------------------------------- worker transitions

    def start_worker(self, t: float, devices: tuple[int, ...], role: Role, version: int) -> int:
        """Start a worker on FREE devices (-> SERVING); it is LOADING weights of `version`."""
        self._begin(t)
        devices = tuple(devices)
        role = Role(role)
        if not devices:
            raise StateError("worker-needs-devices", "a worker needs at least one device")
        if len(set(devices)) != len(devices):
            raise StateError("distinct-devices", f"devices {list(devices)} repeat")
        if version < 0:
            raise StateError("version-nonnegative", f"version {version} is negative")
        for dev in devices:
            d = self._dev(dev)
            if d.status is not DeviceStatus.FREE:
                raise StateError("start-on-free", f"device {dev} is {d.status.value}; workers start on FREE devices")
        nodes = {self.devices[dev].node for dev in devices}
        if len(nodes) > 1:
            # tensor parallelism needs the fast intra-node links
            raise StateError("tp-one-node", f"devices {list(devices)} span nodes {sorted(nodes)}")
        wid = self._next_worker
        self._next_worker += 1
        self.workers[wid] = Worker(wid, devices, role, WorkerPhase.LOADING, version, t)
        for dev in devices:
            d = self.devices[dev]
            d.status, d.worker = DeviceStatus.SERVING, wid
        self._emit(t, "worker_started", worker=wid, devices=list(devices), role=role.value, version=version)
        self._done()
        return wid

    def worker_ready(self, t: float, wid: int) -> None:
        """LOADING -> SERVING (weights loaded)."""
        self._begin(t)
        w = self._worker(wid)
        if w.phase is not WorkerPhase.LOADING:
            raise StateError("ready-from-loading", f"worker {wid} is {w.phase.value}; only LOADING workers get ready")
        prev = w.phase
        w.phase = WorkerPhase.SERVING
        self._emit(t, "worker_ready", worker=wid, prev=prev.value)
        self._done()

    def set_role(self, t: float, wid: int, role: Role) -> None:
        """Change the role of a live worker (its weights stay resident); the phase is unchanged."""
        self._begin(t)
        w = self._worker(wid)
        role = Role(role)
        if w.phase is WorkerPhase.STOPPED:
            raise StateError("live-worker-only", f"worker {wid} is stopped")
        prev = w.role
        w.role = role
        self._emit(t, "role_set", worker=wid, role=role.value, prev=prev.value)
        self._done()

    def set_version(self, t: float, wid: int, version: int) -> None:
        """A live worker now holds weights of `version` (versions never go back)."""
        self._begin(t)
        w = self._worker(wid)
        if w.phase is WorkerPhase.STOPPED:
            raise StateError("live-worker-only", f"worker {wid} is stopped")
        if version < w.weight_version:
            raise StateError("version-monotonic", f"worker {wid}: version {version} < current {w.weight_version}")
        prev = w.weight_version
        w.weight_version = version
        self._emit(t, "version_set", worker=wid, version=version, prev=prev)
        self._done()

    def stop_worker(self, t: float, wid: int) -> None:
        """Any live phase -> STOPPED; its devices go FREE (lent ones keep their lease)."""
        self._begin(t)
        w = self._worker(wid)
        if w.phase is WorkerPhase.STOPPED:
            raise StateError("live-worker-only", f"worker {wid} is already stopped")
        held = self._release(w)
        self._emit(t, "worker_stopped", worker=wid, devices=held, reason="stopped")
        self._done()

    def resize_worker(self, t: float, wid: int, devices: tuple[int, ...]) -> None:
        """A live worker computes on `devices` from now on (its tp becomes len(devices); threads on CPU):
        those it gains must be FREE and on its node, those it drops go FREE (lent ones keep their lease)."""
        self._begin(t)
        w, devices = self._worker(wid), tuple(devices)
        if w.phase is WorkerPhase.STOPPED or not devices or len(set(devices)) != len(devices):
            raise StateError("resize-live", f"worker {wid} ({w.phase.value}) cannot compute on {list(devices)}")
        node = self.devices[w.devices[0]].node
        for dev in set(devices) - set(w.devices):
            if self._dev(dev).status is not DeviceStatus.FREE or self.devices[dev].node != node:
                raise StateError("resize-onto-free", f"device {dev} is not FREE on worker {wid}'s node {node}")
        for dev in w.devices:
            self.devices[dev].status, self.devices[dev].worker = DeviceStatus.FREE, None
        for dev in devices:
            self.devices[dev].status, self.devices[dev].worker = DeviceStatus.SERVING, wid
        prev, w.devices = w.devices, devices
        self._emit(t, "worker_resized", worker=wid, devices=list(devices), prev=list(prev))
        self._done()

    # ---------------------------------------------------------------- queries

    def serving_workers(self, role: Role | None = None) -> list[Worker]:
        """Workers accepting requests (phase SERVING), optionally of one role, by id."""
        return [w for w in self.workers.values()
                if w.phase is WorkerPhase.SERVING and (role is None or w.role is role)]

    def devices_of(self, pool: Pool) -> list[int]:
        """Present (not GONE) devices of `pool`, by id."""
        return [d.id for d in self.devices.values() if d.pool is pool and d.status is not DeviceStatus.GONE]

    def lent_devices(self) -> list[int]:
        """Train devices currently lent to rollout (FREE or SERVING with a lease), by id."""
        return [d.id for d in self.devices.values() if d.pool is Pool.TRAIN and d.lease_deadline is not None]

    def budget(self) -> int:
        """Devices rollout can use now: every device that is neither TRAINING nor GONE."""
        return sum(d.status not in (DeviceStatus.TRAINING, DeviceStatus.GONE) for d in self.devices.values())

    def shape(self) -> LayoutShape:
        """Shape of the live layout: LOADING and SERVING workers (`LayoutShape.observed`)."""
        return LayoutShape.observed((w.role, len(w.devices)) for w in self.workers.values() if w.phase in _LIVE)

    def timeline(self) -> list[dict]:
        """The event log as plain dicts {t, kind, **data}, ready for JSON."""
        return [{"t": e.t, "kind": e.kind, **e.data} for e in self.events]

    # ---------------------------------------------------------------- invariants

    def check_invariants(self) -> None:
        """Raise StateError naming the first broken rule; O(devices + workers)."""
        for did, d in self.devices.items():
            if d.id != did or not 0 <= did < self._next_dev:
                raise StateError("ids-unique", f"device record {d.id} is filed under {did}")
            if d.status is DeviceStatus.SERVING:
                w = self.workers.get(d.worker) if d.worker is not None else None
                if w is None or w.phase not in _LIVE:
                    raise StateError("serving-has-live-worker", f"device {did} is SERVING without a live worker")
            elif d.worker is not None:
                raise StateError("worker-iff-serving", f"device {did} is {d.status.value} but names worker {d.worker}")
            if d.worker is not None and did not in self.workers[d.worker].devices:
                raise StateError("worker-points-back", f"device {did} names worker {d.worker}, which does not hold it")
            if d.status is DeviceStatus.TRAINING and (d.pool is not Pool.TRAIN or d.lease_deadline is not None):
                raise StateError(
                    "training-is-unlent-train", f"device {did} is TRAINING but {d.pool.value}/lease={d.lease_deadline}"
                )
            lendable = d.status in (DeviceStatus.FREE, DeviceStatus.SERVING)
            if d.pool is Pool.TRAIN and lendable and d.lease_deadline is None:
                raise StateError("train-free-is-lent", f"train device {did} is {d.status.value} without a lease")
            if d.lease_deadline is not None and d.pool is not Pool.TRAIN:
                raise StateError("lease-train-only", f"device {did} is {d.pool.value} but has a lease")
            if d.trainer_busy and d.status is not DeviceStatus.TRAINING:
                raise StateError("busy-is-training", f"device {did} is marked trainer-busy but is {d.status.value}")
            if d.pool is not Pool.ELASTIC and (d.notice_at is not None or d.status is DeviceStatus.GONE):
                raise StateError("gone-elastic-only", f"{d.pool.value} device {did} has a notice or is gone")
        for wid, w in self.workers.items():
            if w.id != wid or not 0 <= wid < self._next_worker:
                raise StateError("ids-unique", f"worker record {w.id} is filed under {wid}")
            if w.phase is WorkerPhase.STOPPED:
                if w.devices:
                    raise StateError("stopped-holds-nothing", f"stopped worker {wid} holds devices {list(w.devices)}")
                continue
            if not w.devices or len(set(w.devices)) != len(w.devices):
                raise StateError("worker-needs-devices", f"live worker {wid} holds devices {list(w.devices)}")
            for dev in w.devices:
                d = self.devices.get(dev)
                if d is None or d.worker != wid or d.status is not DeviceStatus.SERVING:
                    raise StateError("worker-points-back", f"worker {wid} holds device {dev}, which does not serve it")
            if len({self.devices[dev].node for dev in w.devices}) > 1:
                raise StateError("tp-one-node", f"worker {wid} spans nodes")
