"""`RayAgentLoop`: the `AgentLoop` over `EngineProxy`s (Ray actors), with what a distributed loop needs.

- Engines step concurrently (one `step.remote()` each, outputs handled in engine order).
- A weight snapshot is `ray.put` once; its ref goes to every live actor and is kept (`latest`), so a
  worker started later (`RealControl.start` through `RayBackend.start_worker`) pulls the newest
  version from the object store. A worker that is still starting takes no turns; once it answers it
  gets the newest snapshot if it missed one, then serves.
- Routing, stopping with migration, draining and role flips are the base loop's (the controller's
  actuators): requests leave a stopping worker with their KV (it travels through the object store)
  or resume from their tokens.
- A worker that dies (`WorkerGone`: its process was killed, or its node left) loses no trajectory:
  every session that had a request on it (the proxy's `sessions`) resumes its current turn from the
  collected tokens on a serving worker (the turn's partial output is resampled); with none serving, it
  waits for the controller's re-decision (`on_lost`, then `redecided`) and a worker that starts; with
  none started either, it fails with the reason. Outputs of a dead worker are never handled. `on_lost`
  (set by `RealControl`) hears of each loss.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from pearl.runtime.agent import AgentLoop, Episode, Group
from pearl.runtime.ray_worker import WorkerGone, ray

__all__ = ["RayAgentLoop"]


class RayAgentLoop(AgentLoop):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.dead: set[int] = set()
        self.latest: tuple[Any, int] | None = None  # (object-store ref, version) of the newest snapshot
        self.on_lost: Callable[[int], None] | None = None
        self.workers_lost = 0
        self.resubmitted = 0
        self.failed_worker_lost = 0
        self.closed: set[str] = set()  # trajectory ids finished (ok or failed): each at most once
        self.closed_twice = 0
        self.started_ready = 0  # workers started mid-run that came up and served
        self.redeciding = 0  # losses the controller has not re-decided on yet: turns with no worker wait for it

    @property
    def version(self) -> int:
        return max(e.version for e in self.engines)  # engine 0 may be dead; live ones share the version

    def serving(self, *roles: Any) -> list[int]:
        return [i for i in super().serving(*roles) if self.engines[i].ready]

    def starting(self) -> list[int]:
        return [i for i in self.live() if not self.engines[i].ready]

    # ------------------------------------------------------------ weights
    def apply_weights(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is None:
            return
        sd, version = pending
        ref = ray.put(sd)  # one copy in the object store, shared by every actor (and machine)
        self.latest = (ref, version)
        calls = {i: self.engines[i].actor.update_weights.remote(ref, version) for i in self.live()
                 if self.engines[i].ready}
        for i, c in calls.items():
            try:
                ray.get(c)
                self.engines[i].version = version
            except WorkerGone:
                self._lost(i)

    def _poll_starting(self) -> None:
        """Workers that finished starting: the newest weights if they missed them, then they serve."""
        for i in self.starting():
            e = self.engines[i]
            done, _ = ray.wait([e.ready_ref], timeout=0)
            if not done:
                continue
            try:
                e.version, e.pid = ray.get(done[0])
                e.ready_ref = None
                self.started_ready += 1
                if self.latest is not None and self.latest[1] > e.version:
                    e.update_weights(*self.latest)
            except Exception:  # noqa: BLE001 - it died starting (its node left, its constructor raised)
                e.ready_ref = None
                self._lost(i)
                continue
            self._flush()
            self.rebalanced += self.rebalance(i)  # it takes its share of the episodes in flight

    def _move(self, src: int, dst: int, ep: Episode, rid: str | None) -> None:
        if src in self.dead or dst in self.dead:  # one end died earlier in this rebalance: `_lost` placed its turns
            return
        try:
            super()._move(src, dst, ep, rid)
        except WorkerGone:  # one end died mid-move: find it; the turn starts again from its tokens
            for i in (src, dst):
                self._check(i)
            if ep.traj.id in self.episodes and not any(ep.traj.id in self.engines[i].sessions for i in self.live()):
                self._submit(ep)

    def _flush(self) -> None:
        """Turns that waited for a worker: to the serving ones (or failed, if none serves or starts)."""
        parked, self.parked = self.parked, []
        for req, kv in parked:
            self._resubmit(req, kv)
        waiting, self.waiting = self.waiting, []
        for ep in waiting:
            if ep.traj.id in self.episodes:
                self._submit(ep)

    # ------------------------------------------------------------ placement
    def _submit(self, ep: Episode, kv: Any = None, engine: int | None = None) -> None:
        idx = ep.engine if engine is None else engine
        if engine is None and idx not in self.turn_targets():
            if not self.turn_targets():
                self._no_worker(ep)
                return
            idx = ep.engine = self._pick_engine()
        try:
            super()._submit(ep, kv, idx)
        except WorkerGone:
            self._lost(idx)
            if ep.traj.id in self.episodes and ep.traj.id not in self.engines[idx].sessions:
                self._submit(ep)  # from its tokens, elsewhere (the KV, if any, stayed with the dead worker)

    def _no_worker(self, ep: Episode) -> None:
        if self.starting() or self.redeciding:
            self.waiting.append(ep)  # a worker is starting, or the controller may start one: the turn waits
            return
        self.failed_worker_lost += 1
        self._closed += self._fail(ep, "no Ray rollout worker is serving (every worker died or was revoked)")

    def _resubmit(self, req: Any, kv: Any) -> None:
        cands = self.decode_targets() if req.num_generated > 0 else self.turn_targets()
        if not cands and not self.starting():
            ep = self.episodes.get(req.session)
            if ep is not None:
                self._no_worker(ep)
            return
        try:
            super()._resubmit(req, kv)
        except WorkerGone:  # the target died: find it (a ping each), then try the others
            before = self.workers_lost
            for i in [j for j in self.live() if self.engines[j].ready]:
                self._check(i)
            ep = self.episodes.get(req.session)
            if ep is not None and not any(req.session in self.engines[i].sessions for i in self.live()):
                if self.workers_lost > before:
                    self._resubmit(req, kv)
                else:
                    self._closed += self._fail(ep, "a Ray rollout worker refused the request")

    def _check(self, i: int) -> None:
        try:
            ray.get(self.engines[i].actor.ready.remote(), timeout=60)
        except WorkerGone:
            self._lost(i)
        except ray.exceptions.GetTimeoutError:
            pass  # alive but busy

    def _take_out(self, i: int, migrate: bool, out: list | None = None) -> list[tuple[Any, Any]]:
        out = [] if out is None else out
        try:
            super()._take_out(i, migrate, out)
        except WorkerGone:
            self._lost(i)  # what is still on it resumes from its tokens
        return out

    def stop_engine(self, i: int, migrate: bool = True) -> int:
        """Stop worker `i`: its requests move (with their KV through the object store if `migrate`),
        then its actor ends and its CPU slot is free."""
        if i in self.stopped:
            return 0
        self.stopped.add(i)
        self.draining.discard(i)
        moved = self._take_out(i, migrate) if self.engines[i].ready else []  # a starting one holds nothing
        for req, kv in moved:
            self._resubmit(req, kv)
        self.engines[i].close()
        if not self.starting():
            self._flush()
        return len(moved)

    def set_role(self, i: int, role: Any) -> None:
        try:
            super().set_role(i, role)
        except WorkerGone:
            self._lost(i)

    def _drop(self, tid: str) -> None:
        for i in self.live():
            if self.engines[i].ready:
                self.engines[i].drop_session(tid)  # fire-and-forget; the actor ignores sessions it lacks

    def _close(self, ep: Episode) -> list[Group]:
        if ep.traj.id in self.closed:  # never expected: counted (and ignored) so tests can see it
            self.closed_twice += 1
            return []
        self.closed.add(ep.traj.id)
        return super()._close(ep)

    # ------------------------------------------------------------ one pass
    def has_work(self) -> bool:
        return bool(self._closed) or super().has_work() or bool(self.starting())

    def step(self) -> list[Group]:
        """Apply pending weights, let started workers serve, step every live engine with work
        concurrently, advance the episodes."""
        self.apply_weights()
        self._poll_starting()
        work = [i for i in self.live() if self.engines[i].ready and self.engines[i].has_work()]
        done: list[Group] = self.collect_env(0.0 if work else 0.01)
        if not work and not self.env_pending:
            time.sleep(0.002)  # only workers starting: wait for them a little
        # (handing finished environment steps to their workers can find one dead: `_lost` stops it)
        refs = {i: self.engines[i].actor.step.remote() for i in work if i not in self.stopped}
        for i, ref in refs.items():
            if i in self.dead:  # died while an earlier engine's outputs were handled
                continue
            try:
                outs = self.engines[i].finish_step(ref)
            except WorkerGone:
                self._lost(i)
                continue
            for out in outs:
                if out.req.session in self.episodes:
                    done += self._on_output(i, out)
        return done + self._take_closed()

    # ------------------------------------------------------------ worker loss
    def _lost(self, idx: int) -> None:
        """Worker `idx` died: every turn it held resumes from its tokens elsewhere."""
        if idx in self.dead:
            return
        self.dead.add(idx)
        self.stopped.add(idx)
        self.draining.discard(idx)
        self.workers_lost += 1
        e = self.engines[idx]
        lost, e.sessions = sorted(e.sessions), set()
        e.close()
        if self.on_lost is not None:  # the controller re-decides (`redecided` when it has)
            self.redeciding += 1
            self.on_lost(idx)
        for tid in lost:
            ep = self.episodes.get(tid)
            if ep is not None:
                self.resubmitted += 1
                self._submit(ep)
        if not self.starting():
            self._flush()

    def redecided(self) -> None:
        """The controller re-decided after a loss: turns still waiting with no worker serving or starting
        (it started none) fail now, with the reason."""
        self.redeciding = max(0, self.redeciding - 1)
        if not self.redeciding and not self.starting():
            self._flush()

    def engine_stats(self) -> dict[str, float]:
        out = super().engine_stats()
        out.update({"ray_workers_lost": self.workers_lost, "ray_trajectories_resubmitted": self.resubmitted,
                    "ray_trajectories_failed_worker_lost": self.failed_worker_lost,
                    "ray_trajectories_finished_twice": self.closed_twice,
                    "ray_workers_started_mid_run": self.started_ready})
        return out
